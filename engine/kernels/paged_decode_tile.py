"""Decode-only inner loops of the paged decode kernel's variants (engine/kernels/decode_variants.py).

The default variant runs the loop shared with prefill (paged_attention_tile.py). These loops add what only
decode uses, as compile-time switches:

- KV_HEADS kv heads per program: the query rows are the KV_HEADS * GROUP query heads of KV_HEADS
  consecutive kv heads (row r belongs to kv head r // GROUP of the program's first), and a tile's key
  columns are BLOCK_N tokens x KV_HEADS heads (column c: token c // KV_HEADS, head c % KV_HEADS), adjacent
  in the cache, so one load reads KV_HEADS * HEAD_DIM contiguous elements per token. A score is kept only
  where the row's kv head is the column's; the others are -inf, so their P is 0 in P @ V.
- MASKED False: the tile lies wholly inside [start, end) and its loads take no token mask (the caller
  runs whole tiles this way and the remainder with MASKED True).
- decode_tile_loop_fma: scores and P @ V as broadcast multiply-adds in float32 over exactly the GROUP
  rows (next power of two), instead of tensor-core dots on rows padded to 16.
Softmax runs in base 2 (scores scaled by sm_scale * log2(e)), as in the shared loop.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_tile(ptr, row_off, offs_d, nmask, dmask,
               MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """[rows, BLOCK_D] from ptr + row_off[:, None] + offs_d[None, :]; masked only where needed."""
    addr = ptr + row_off[:, None] + offs_d[None, :]
    if MASKED:
        return tl.load(addr, mask=nmask[:, None] & dmask[None, :], other=0.0)
    elif HEAD_DIM == BLOCK_D:
        return tl.load(addr)
    else:
        return tl.load(addr, mask=dmask[None, :], other=0.0)


@triton.jit
def decode_tile_loop(
    acc, m_i, l_i,                 # [BLOCK_G, BLOCK_D] f32, [BLOCK_G] f32 (log2 domain), [BLOCK_G] f32
    q,                             # [BLOCK_G, BLOCK_D] in the cache dtype
    row_head,                      # [BLOCK_G] int32 kv head of each row within the program (>= KV_HEADS: padding)
    k_cache_ptr, v_cache_ptr,      # [num_blocks, BLOCK_SIZE, Hkv, D]
    table_ptr,                     # this sequence's block table row, int32
    kv_head_off,                   # first kv head * stride_ch (elements)
    stride_cb, stride_cs, stride_ch,
    offs_d, dmask,                 # [BLOCK_D] int32, [BLOCK_D] bool
    start, end,                    # key positions [start, end); whole tiles when not MASKED
    qk_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_c = tl.arange(0, BLOCK_N * KV_HEADS)
    col_head = offs_c % KV_HEADS                                                # [BLOCK_N * KV_HEADS]
    same_head = row_head[:, None] == col_head[None, :]                          # [BLOCK_G, BLOCK_N * KV_HEADS]
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_c // KV_HEADS
        nmask = tok < end
        if MASKED:
            page = tl.load(table_ptr + tok // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
        else:
            page = tl.load(table_ptr + tok // BLOCK_SIZE).to(tl.int64)
        row_off = page * stride_cb + (tok % BLOCK_SIZE) * stride_cs + col_head * stride_ch + kv_head_off
        k = _load_tile(k_cache_ptr, row_off, offs_d, nmask, dmask, MASKED, HEAD_DIM, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # [BLOCK_G, BLOCK_N * KV_HEADS]
        if MASKED:
            keep = same_head & nmask[None, :]
        else:
            keep = same_head
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with no key yet (or a padding row)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_tile(v_cache_ptr, row_off, offs_d, nmask, dmask, MASKED, HEAD_DIM, BLOCK_D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def decode_tile_loop_fma(
    acc, m_i, l_i,                 # [BLOCK_G, BLOCK_D] f32, [BLOCK_G] f32, [BLOCK_G] f32
    q,                             # [BLOCK_G, BLOCK_D] float32 (padding rows zero)
    k_cache_ptr, v_cache_ptr,
    table_ptr, kv_head_off, stride_cb, stride_cs,
    offs_d, dmask, start, end, qk_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_n
        nmask = tok < end
        if MASKED:
            page = tl.load(table_ptr + tok // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
        else:
            page = tl.load(table_ptr + tok // BLOCK_SIZE).to(tl.int64)
        row_off = page * stride_cb + (tok % BLOCK_SIZE) * stride_cs + kv_head_off
        k = _load_tile(k_cache_ptr, row_off, offs_d, nmask, dmask, MASKED, HEAD_DIM, BLOCK_D).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], 2) * qk_scale                 # [BLOCK_G, BLOCK_N]
        if MASKED:
            s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_tile(v_cache_ptr, row_off, offs_d, nmask, dmask, MASKED, HEAD_DIM, BLOCK_D).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    return acc, m_i, l_i
