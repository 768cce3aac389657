"""Per-step attention metadata: how the flat token array maps onto the paged KV cache.

KV cache, per layer: k_cache, v_cache each [num_blocks, block_size, num_kv_heads, head_dim].
Token position p of a sequence lives in slot block_table[p // block_size] * block_size + p % block_size.

Flat token layout of one step (see engine/core/batch.py): the new tokens of every prefill entry
(seq by seq, each a contiguous run of positions [num_computed, num_computed + n)), then exactly one
token per decode entry. A prefill entry may already have cached context (prefix-cache hit, or a
later chunk of a chunked prefill); its query at position p attends to keys at positions <= p.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from engine.core.kv_layout import check_block_size


@dataclass
class AttentionMetadata:
    num_prefill_seqs: int
    num_prefill_tokens: int          # tokens [0, num_prefill_tokens) of the flat array are prefill, the rest decode
    slot_mapping: Tensor             # [num_tokens] int64; a negative slot means "do not store" (padding)
    # prefill part (empty tensors when num_prefill_seqs == 0)
    cu_seqlens_q: Tensor             # [num_prefill_seqs + 1] int32, offsets of each prefill entry's new tokens
    cu_seqlens_k: Tensor             # [num_prefill_seqs + 1] int32, offsets of context lengths (cached + new)
    max_seqlen_q: int
    max_seqlen_k: int
    prefill_block_tables: Tensor     # [num_prefill_seqs, max_blocks] int32, padded with 0
    # decode part (empty when no decodes)
    decode_context_lens: Tensor      # [num_decode_seqs] int32, keys per decode entry INCLUDING this step's token
    decode_block_tables: Tensor      # [num_decode_seqs, max_blocks] int32, padded with 0

    @property
    def num_decode_seqs(self) -> int:
        return int(self.decode_context_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @classmethod
    def build(cls, num_new_tokens: Sequence[int], context_lens: Sequence[int],
              block_tables: Sequence[Sequence[int]], num_prefill_seqs: int, block_size: int,
              device: torch.device | str = "cpu",
              slot_mapping: Sequence[int] | None = None) -> "AttentionMetadata":
        """Builds the metadata from per-entry lists (prefill entries first, then decodes).

        num_new_tokens[i]: tokens computed this step for entry i (1 for every decode entry);
        context_lens[i]: keys entry i attends to after this step (cached + new);
        block_tables[i]: the entry's KV block ids (at least ceil(context_lens[i] / block_size) of them).
        slot_mapping defaults to the slots of the new tokens' positions.
        """
        n = len(num_new_tokens)
        if len(context_lens) != n or len(block_tables) != n:
            raise ValueError(f"num_new_tokens, context_lens and block_tables need one entry per sequence; got "
                             f"{n}, {len(context_lens)}, {len(block_tables)}")
        if not 0 <= num_prefill_seqs <= n:
            raise ValueError(f"num_prefill_seqs must be in [0, {n}], got {num_prefill_seqs}")
        check_block_size(block_size)
        for i, (q, c, t) in enumerate(zip(num_new_tokens, context_lens, block_tables)):
            if q < 1 or c < q:
                raise ValueError(f"entry {i}: need 1 <= num_new_tokens <= context_len, got {q} and {c}")
            if i >= num_prefill_seqs and q != 1:
                raise ValueError(f"entry {i} is a decode entry and must have num_new_tokens == 1, got {q}")
            if len(t) * block_size < c:
                raise ValueError(f"entry {i}: block table of {len(t)} blocks cannot hold {c} tokens "
                                 f"(block_size {block_size})")
        if slot_mapping is None:
            slot_mapping = []
            for q, c, t in zip(num_new_tokens, context_lens, block_tables):
                slot_mapping.extend(t[p // block_size] * block_size + p % block_size for p in range(c - q, c))
        elif len(slot_mapping) != sum(num_new_tokens):
            raise ValueError(f"slot_mapping needs one slot per new token ({sum(num_new_tokens)}), "
                             f"got {len(slot_mapping)}")

        def cumsum(xs: Sequence[int]) -> Tensor:
            out = [0]
            for x in xs:
                out.append(out[-1] + x)
            return torch.tensor(out, dtype=torch.int32, device=device)

        def table(rows: Sequence[Sequence[int]]) -> Tensor:
            width = max((len(r) for r in rows), default=0)
            padded = [list(r) + [0] * (width - len(r)) for r in rows]
            return torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(rows), width)

        p = num_prefill_seqs
        return cls(
            num_prefill_seqs=p,
            num_prefill_tokens=sum(num_new_tokens[:p]),
            slot_mapping=torch.tensor(list(slot_mapping), dtype=torch.int64, device=device),
            cu_seqlens_q=cumsum(num_new_tokens[:p]) if p else torch.zeros(0, dtype=torch.int32, device=device),
            cu_seqlens_k=cumsum(context_lens[:p]) if p else torch.zeros(0, dtype=torch.int32, device=device),
            max_seqlen_q=max(num_new_tokens[:p], default=0),
            max_seqlen_k=max(context_lens[:p], default=0),
            prefill_block_tables=table(block_tables[:p]),
            decode_context_lens=torch.tensor(list(context_lens[p:]), dtype=torch.int32, device=device),
            decode_block_tables=table(block_tables[p:]),
        )
