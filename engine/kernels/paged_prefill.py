"""Triton kernel: paged causal prefill attention over cached + new keys (prefix hits, chunked prefill), GQA.

Prefill entry i has q_len new tokens (rows cu_seqlens_q[i] .. cu_seqlens_q[i+1] of q) and k_len keys
in the cache (cached prefix + the new tokens, already stored). New token j sits at position
k_len - q_len + j and attends to keys at positions <= that.

A program owns TOK = BLOCK_M // GROUP consecutive tokens of one entry times the GROUP query heads
sharing one kv head, packed as BLOCK_M rows (row r = token r // GROUP, head r % GROUP), so each K/V
tile is read once for the group. Keys below the tile's first query position are visible to every
row and are visited without the causal mask; only the last tiles (the diagonal) apply it.

Grid (num_tokens // TOK + num_seqs, num_kv_heads), a flat list of tiles: entry i owns tiles
[cu_q[i] // TOK + i, cu_q[i + 1] // TOK + i + 1), at least cdiv(q_len_i, TOK) of them, and a program
finds its entry by binary search over cu_q. The grid depends only on the two array sizes, never on
the lengths inside them, so a CUDA graph captured for padded sizes serves any step that fits
(padding entries have q_len 0; tiles past an entry's q_len do no work).
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from engine.kernels.paged_attention_tile import contiguous_q_and_out, dot_precision, paged_attention_tile_loop

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["stride_tb", "NUM_SEQS"])    # both vary per eager step: no recompiles
def _prefill_kernel(
    q_ptr,                         # [num_prefill_tokens, Hq, D]
    k_cache_ptr, v_cache_ptr,      # [num_blocks, BLOCK_SIZE, Hkv, D]
    out_ptr,                       # [num_prefill_tokens, Hq, D]
    cu_q_ptr, cu_k_ptr,            # [num_seqs + 1] int32
    tables_ptr,                    # [num_seqs, max_blocks] int32
    qk_scale,
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_tb,
    stride_ot, stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,         # rows = tokens x group heads
    BLOCK_N: tl.constexpr,         # keys per tile
    DOT_PRECISION: tl.constexpr,
    NUM_SEQS,                      # entries (len(cu_q) - 1)
):
    TOK: tl.constexpr = BLOCK_M // GROUP
    flat = tl.program_id(0)
    kv_head = tl.program_id(1)
    # The entry of this tile: the last i with cu_q[i] // TOK + i <= flat (first tiles are increasing in i).
    lo: tl.int32 = 0
    hi: tl.int32 = NUM_SEQS
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_q_ptr + mid) // TOK + mid <= flat:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(cu_q_ptr + seq)
    tile = flat - (q_start // TOK + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    k_len = tl.load(cu_k_ptr + seq + 1) - tl.load(cu_k_ptr + seq)

    offs_m = tl.arange(0, BLOCK_M)
    tok = tile * TOK + offs_m // GROUP                                          # [BLOCK_M] token in this entry
    heads = kv_head * GROUP + offs_m % GROUP                                    # [BLOCK_M] q head
    rmask = (offs_m < TOK * GROUP) & (tok < q_len)
    q_pos = k_len - q_len + tok                                                 # [BLOCK_M] key position of the row
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    qmask = rmask[:, None] & dmask[None, :]
    q_off = (q_start + tok).to(tl.int64) * stride_qt + heads * stride_qh       # [BLOCK_M]
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=qmask, other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)                                      # [BLOCK_M, BLOCK_D]

    # Tokens of this tile: [tile*TOK, tile*TOK + n_tok); none if the tile lies past q_len.
    n_tok = tl.maximum(tl.minimum(TOK, q_len - tile * TOK), 0)
    first_pos = k_len - q_len + tile * TOK
    causal_end = (first_pos + n_tok) * (n_tok > 0)          # keys [0, causal_end) matter; 0 when idle
    full_end = (first_pos // BLOCK_N) * BLOCK_N * (n_tok > 0)  # keys [0, full_end) are seen by every row

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    table = tables_ptr + seq * stride_tb
    acc, m_i, l_i = paged_attention_tile_loop(
        acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, table, kv_head * stride_ch,
        stride_cb, stride_cs, offs_d, dmask, 0, full_end, qk_scale,
        BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, CAUSAL=False, DOT_PRECISION=DOT_PRECISION)
    acc, m_i, l_i = paged_attention_tile_loop(
        acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, table, kv_head * stride_ch,
        stride_cb, stride_cs, offs_d, dmask, full_end, causal_end, qk_scale,
        BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, CAUSAL=True, DOT_PRECISION=DOT_PRECISION)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    o_off = (q_start + tok).to(tl.int64) * stride_ot + heads * stride_oh
    tl.store(out_ptr + o_off[:, None] + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=qmask)


def paged_prefill_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                            cu_seqlens_k: Tensor, block_tables: Tensor, scale: float,
                            out: Tensor | None = None, block_m: int = 64, block_n: int = 64,
                            num_warps: int = 4, num_stages: int = 2) -> Tensor:
    """q [num_prefill_tokens, Hq, D]; caches [num_blocks, bs, Hkv, D] already holding the new keys;
    cu_seqlens_q / cu_seqlens_k [num_seqs + 1] int32 (cu_seqlens_q[-1] <= num_prefill_tokens: trailing
    rows may be padding, left untouched in out); block_tables [num_seqs, max_blocks] int32
    -> out [num_prefill_tokens, Hq, D] in q's dtype. Reads no tensor on the host (CUDA-graph safe).
    Default tiles: the fastest of a sweep on an H200
    (bf16, head_dim 128, 16q/8kv and 32q/8kv): block_m 64, block_n 64, 4 warps, 2 stages."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = cu_seqlens_q.shape[0] - 1
    q, out = contiguous_q_and_out(q, out)
    if num_seqs <= 0 or num_tokens == 0:
        return out
    group = num_q_heads // num_kv_heads
    # At least one token per tile, rows a power of two (tl.arange needs it), >= 16 for tl.dot.
    block_m = max(block_m, 16, triton.next_power_of_2(group))
    tok = block_m // group
    grid = (num_tokens // tok + num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, cu_seqlens_k, block_tables,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(k_cache),
        NUM_SEQS=num_seqs,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
