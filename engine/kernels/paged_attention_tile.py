"""Shared inner loop of the paged attention kernels: online softmax over a range of cached keys.

Both kernels hold a tile of query rows q [BLOCK_M, BLOCK_D] that share ONE kv head (decode: the
query heads of a GQA group; prefill: tokens x group heads), so each K/V tile is loaded once for all
of them. Keys [start, end) of one sequence are visited in tiles of BLOCK_N tokens; token n is read
from the paged cache through the sequence's block table (a tile may span several pages, any
power-of-two page size works). Softmax runs in base 2: scores are scaled by sm_scale * log2(e).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_attention_tile_loop(
    acc, m_i, l_i,                 # [BLOCK_M, BLOCK_D] f32, [BLOCK_M] f32 running max (log2 domain), [BLOCK_M] f32 sum
    q,                             # [BLOCK_M, BLOCK_D] in the cache dtype
    q_pos,                         # [BLOCK_M] int32 position of each row's token (used when CAUSAL)
    k_cache_ptr, v_cache_ptr,      # [num_blocks, BLOCK_SIZE, Hkv, D]
    table_ptr,                     # this sequence's block table row, int32
    kv_head_off,                   # kv_head * stride_ch (elements)
    stride_cb, stride_cs,          # cache strides of a block and of a slot within it (elements)
    offs_d, dmask,                 # [BLOCK_D] int32, [BLOCK_D] bool (head_dim may be < BLOCK_D)
    start, end,                    # key positions [start, end) to visit
    qk_scale,                      # sm_scale * log2(e)
    BLOCK_SIZE: tl.constexpr,      # KV page size in tokens
    BLOCK_N: tl.constexpr,         # keys per tile
    CAUSAL: tl.constexpr,          # mask key n > q_pos (only needed on the diagonal tiles)
    DOT_PRECISION: tl.constexpr,   # "ieee" for float32 caches (tf32 would cost ~1e-3), "tf32" otherwise (unused)
):
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)                                   # [BLOCK_N]
        nmask = offs_n < end
        page = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
        row_off = page * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + kv_head_off   # [BLOCK_N] int64
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + row_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale        # [BLOCK_M, BLOCK_N] f32
        if CAUSAL:
            keep = nmask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        else:
            keep = nmask[None, :] & (q_pos[:, None] >= 0)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with no key yet: avoid -inf - -inf
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + row_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


def contiguous_q_and_out(q, out):
    """Host-side checks shared by the kernel wrappers: q with unit stride along head_dim (copied if
    not), and an output buffer of q's shape (allocated when None)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = q.new_empty(q.shape)
    elif out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} with unit stride along head_dim, got {tuple(out.shape)}")
    return q, out


def dot_precision(cache) -> str:
    """tl.dot input precision: exact ("ieee") for float32 caches (tf32 would cost ~1e-3 relative error)."""
    return "ieee" if cache.element_size() == 4 else "tf32"
