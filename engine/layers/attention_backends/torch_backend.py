"""Reference attention backend in plain torch (CPU and GPU).

Gathers each sequence's pages into a contiguous K/V and calls F.scaled_dot_product_attention.
Simple and obviously right rather than fast: prefill loops over sequences on the host (one sync
to read cu_seqlens), decode is batched over a padded gather of all decode contexts.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.layers.attention_backends.base import check_inputs
from engine.layers.attention_metadata import AttentionMetadata


def store_kvcache_torch(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """k, v: [num_tokens, num_kv_heads, head_dim] -> cache slots slot_mapping[t] (negative = skip)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)   # [num_blocks * block_size, Hkv, D]; view: must not copy
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_flat[slots] = k[keep].to(k_cache.dtype)
    v_flat[slots] = v[keep].to(v_cache.dtype)


def gather_pages(cache: Tensor, block_table: Tensor, num_tokens: int) -> Tensor:
    """cache [num_blocks, bs, Hkv, D], block_table [>= ceil(num_tokens/bs)] -> [num_tokens, Hkv, D]."""
    bs = cache.shape[1]
    nb = (num_tokens + bs - 1) // bs
    return cache[block_table[:nb].long()].flatten(0, 1)[:num_tokens]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float) -> Tensor:
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D] -> [B, Hq, Lq, D]; GQA by repeating KV heads."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def prefill_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata,
                            scale: float) -> Tensor:
    """q [num_prefill_tokens, Hq, D] -> [num_prefill_tokens, Hq, D]; causal over cached + new keys."""
    out = torch.empty_like(q)
    cu_q = meta.cu_seqlens_q.tolist()
    cu_k = meta.cu_seqlens_k.tolist()
    for i in range(meta.num_prefill_seqs):
        n_q, n_k = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        if n_q == 0:            # a padding entry (engine/prefill_graphs.py)
            continue
        table = meta.prefill_block_tables[i]
        qi = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1).unsqueeze(0)            # [1, Hq, n_q, D]
        ki = gather_pages(k_cache, table, n_k).transpose(0, 1).unsqueeze(0)  # [1, Hkv, n_k, D]
        vi = gather_pages(v_cache, table, n_k).transpose(0, 1).unsqueeze(0)
        if n_q == n_k:
            oi = _sdpa(qi, ki.to(q.dtype), vi.to(q.dtype), None, True, scale)
        else:
            # query j sits at position n_k - n_q + j and sees keys at positions <= that.
            q_pos = torch.arange(n_k - n_q, n_k, device=q.device)
            mask = torch.arange(n_k, device=q.device)[None, :] <= q_pos[:, None]   # [n_q, n_k]
            oi = _sdpa(qi, ki.to(q.dtype), vi.to(q.dtype), mask, False, scale)
        out[cu_q[i]:cu_q[i + 1]] = oi[0].transpose(0, 1)
    return out


def decode_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, context_lens: Tensor,
                           block_tables: Tensor, scale: float) -> Tensor:
    """q [B, Hq, D] (one token per entry) -> [B, Hq, D]; entries with context 0 give zeros."""
    B, _, D = q.shape
    bs, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    width = block_tables.shape[1]
    tables = block_tables.long()
    k = k_cache[tables].reshape(B, width * bs, num_kv_heads, D).transpose(1, 2)   # [B, Hkv, L, D]
    v = v_cache[tables].reshape(B, width * bs, num_kv_heads, D).transpose(1, 2)
    lens = context_lens.long()
    valid = torch.arange(width * bs, device=q.device)[None, :] < lens[:, None]      # [B, L]
    valid[:, 0] |= lens == 0     # keep softmax finite on empty rows; they are zeroed below
    # Pages past a context hold stale (maybe NaN) data; 0 * NaN in P @ V would leak it, so zero them.
    k = k.masked_fill(~valid[:, None, :, None], 0.0)
    v = v.masked_fill(~valid[:, None, :, None], 0.0)
    out = _sdpa(q.unsqueeze(2), k.to(q.dtype), v.to(q.dtype), valid[:, None, None, :], False, scale)
    out = out.squeeze(2)                                                                # [B, Hq, D]
    return out.masked_fill((lens == 0)[:, None, None], 0.0)


class TorchAttentionBackend:
    name = "torch"
    padded_prefill = True       # handles the padded layout (engine/prefill_graphs.py)...
    graph_safe = False          # ...but reads cu_seqlens on the host: no prefill graphs are captured with it

    def forward(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                meta: AttentionMetadata, scale: float) -> Tensor:
        check_inputs(q, k, v, k_cache, v_cache, meta)
        store_kvcache_torch(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.zeros_like(q)
        P, n_dec = meta.num_prefill_tokens, meta.num_decode_seqs
        if meta.num_prefill_seqs:
            out[:P] = prefill_attention_torch(q[:P], k_cache, v_cache, meta, scale)
        if n_dec:
            out[P:P + n_dec] = decode_attention_torch(q[P:P + n_dec], k_cache, v_cache, meta.decode_context_lens,
                                                      meta.decode_block_tables, scale)
        return out
