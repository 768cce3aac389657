"""Attention backend on our Triton kernels (engine/kernels): store, paged prefill, paged split-K decode.

Runs on CUDA, or on CPU tensors in the Triton interpreter (TRITON_INTERPRET=1, for tests).
Kernel tile sizes are fields so a benchmark can sweep them; the defaults target an H200 in bf16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.kernels.paged_decode import paged_decode_attention
from engine.kernels.paged_prefill import paged_prefill_attention
from engine.kernels.store_kvcache import store_kvcache
from engine.layers.attention_backends.base import check_cache_inputs, check_inputs
from engine.layers.attention_metadata import AttentionMetadata


@dataclass
class TritonAttentionBackend:
    name: str = "triton"
    prefill_block_m: int = 64       # query rows (tokens x GQA group) per prefill program
    prefill_block_n: int = 64       # keys per prefill tile
    decode_block_n: int | None = None   # keys per decode tile; None: the decode variant table's (64)
    decode_num_splits: int | None = None   # None: chosen from the block-table width and the batch
    padded_prefill: bool = True     # handles engine/prefill_graphs.py's padded layout...
    graph_safe: bool = True         # ...with launches sized by array shapes only (CUDA-graph safe)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                meta: AttentionMetadata, scale: float) -> Tensor:
        check_inputs(q, k, v, k_cache, v_cache, meta)
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._attend(q, k_cache, v_cache, meta, scale)

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
        """forward for a step whose k and v are in the cache already (the kernels read keys and values
        from the cache only)."""
        check_cache_inputs(q, k_cache, v_cache, meta)
        return self._attend(q, k_cache, v_cache, meta, scale)

    def _attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
        P, n_dec = meta.num_prefill_tokens, meta.num_decode_seqs
        # zeros (not empty) so padding rows are defined: rows past the real tokens, and prefill rows past
        # cu_seqlens_q[-1] in a padded graph step (a memset per layer, small next to a prefill)
        out = torch.zeros_like(q) if P + n_dec < q.shape[0] or meta.num_prefill_seqs else torch.empty_like(q)
        if meta.num_prefill_seqs:
            paged_prefill_attention(q[:P], k_cache, v_cache, meta.cu_seqlens_q, meta.cu_seqlens_k,
                                    meta.prefill_block_tables, scale, out=out[:P],
                                    block_m=self.prefill_block_m, block_n=self.prefill_block_n)
        if n_dec:
            paged_decode_attention(q[P:P + n_dec], k_cache, v_cache, meta.decode_context_lens,
                                   meta.decode_block_tables, scale, out=out[P:P + n_dec],
                                   num_splits=self.decode_num_splits, block_n=self.decode_block_n)
        return out
