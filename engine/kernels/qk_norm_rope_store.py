"""One kernel from the packed qkv projection to attention's inputs: q/k RMSNorm, RoPE, KV-cache store.

Unfused, a decoder layer runs three kernels between the qkv GEMM and attention: the per-head RMSNorm
of q and k (Qwen3 only), the rotary embedding, and the KV store (engine/kernels/store_kvcache.py). At
small decode batches each is a launch and a memory round trip of a few microseconds, so the three
cost about as much as the GEMM they follow. Here one program reads a block of head rows of one
token's qkv row once and writes q (for attention) and k, v (into the paged cache). Prior art: vLLM's
fused_qk_norm_rope, aiter's fused_qk_rope_cosine_cache_llama (RoPE + KV store), vllm-ascend's
split_qkv_rmsnorm_rope.

Shapes (T = tokens this step, Hq / Hkv = query / KV heads of this rank, D = head_dim):
    qkv          [T, (Hq + 2 Hkv) * D]   q heads, then k heads, then v heads (QKVParallelLinear's layout)
    positions    [T] int64
    cos_sin      [2, max_positions, D] float32 (engine/layers/rotary.py, rotate-half layout)
    q_weight, k_weight  [D] (the per-head RMSNorm weights; unused without the norm)
    k_cache, v_cache    [num_blocks, block_size, Hkv, D], contiguous
    slot_mapping [T] int64, negative = do not store (CUDA-graph padding)
    returns q    [T, Hq, D] in qkv's dtype

Numerics follow the unfused path (engine/layers/fused.py): the norm in float32, cast to the activation
dtype, times the weight (rounded to the activation dtype), then the rotation in float32, cast back.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr,                       # [T, (Hq + 2 Hkv) * D], unit stride along the row
    pos_ptr,                       # [T] int64
    cos_sin_ptr,                   # [2, P, D] float32, contiguous
    qw_ptr, kw_ptr,                # [D] each
    q_out_ptr,                     # [T, Hq, D], contiguous
    k_cache_ptr, v_cache_ptr,      # [num_blocks * block_size, Hkv, D], contiguous
    slot_ptr,                      # [T] int64
    stride_qkv_t,                  # elements between tokens of qkv
    table_stride,                  # P * D: from the cos half of cos_sin to the sin half
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,            # HEAD_DIM // 2
    BLOCK_HALF: tl.constexpr,      # next power of two >= HALF
    BLOCK_H: tl.constexpr,         # head rows (of Hq + 2 Hkv) per program
    HAS_NORM: tl.constexpr,
):
    t = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)             # [BLOCK_H] head rows of the token
    d = tl.arange(0, BLOCK_HALF)                                           # [BLOCK_HALF]
    num_rows = NUM_Q_HEADS + 2 * NUM_KV_HEADS
    row_ok = rows < num_rows
    is_q = rows < NUM_Q_HEADS
    is_k = (rows >= NUM_Q_HEADS) & (rows < NUM_Q_HEADS + NUM_KV_HEADS)
    is_v = (rows >= NUM_Q_HEADS + NUM_KV_HEADS) & row_ok
    d_ok = d < HALF
    mask = row_ok[:, None] & d_ok[None, :]                                 # [BLOCK_H, BLOCK_HALF]

    src = qkv_ptr + t.to(tl.int64) * stride_qkv_t + rows[:, None] * HEAD_DIM + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0)                                # first half of each head
    x2 = tl.load(src + HALF, mask=mask, other=0.0)                         # second half
    dtype = x1.dtype
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)

    if HAS_NORM:
        sum_sq = tl.sum(x1f * x1f, axis=1) + tl.sum(x2f * x2f, axis=1)      # [BLOCK_H]
        rstd = tl.rsqrt(sum_sq / HEAD_DIM + eps)[:, None]
        w1 = tl.where(is_q[:, None], tl.load(qw_ptr + d, mask=d_ok, other=0.0)[None, :],
                      tl.load(kw_ptr + d, mask=d_ok, other=0.0)[None, :]).to(tl.float32)
        w2 = tl.where(is_q[:, None], tl.load(qw_ptr + HALF + d, mask=d_ok, other=0.0)[None, :],
                      tl.load(kw_ptr + HALF + d, mask=d_ok, other=0.0)[None, :]).to(tl.float32)
        # as fused.rms_norm: normalised value rounded to the activation dtype, then times the weight, rounded
        n1 = (w1 * (x1f * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        n2 = (w2 * (x2f * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    else:
        n1, n2 = x1f, x2f

    pos = tl.load(pos_ptr + t)
    table = cos_sin_ptr + pos * HEAD_DIM + d                               # [BLOCK_HALF] of this position
    cos1 = tl.load(table, mask=d_ok, other=0.0)[None, :]
    cos2 = tl.load(table + HALF, mask=d_ok, other=0.0)[None, :]
    sin1 = tl.load(table + table_stride, mask=d_ok, other=0.0)[None, :]
    sin2 = tl.load(table + table_stride + HALF, mask=d_ok, other=0.0)[None, :]
    # rotate-half: out = x * cos + cat(-x2, x1) * sin
    r1 = n1 * cos1 - n2 * sin1
    r2 = n2 * cos2 + n1 * sin2

    q_dst = q_out_ptr + t.to(tl.int64) * (NUM_Q_HEADS * HEAD_DIM) + rows[:, None] * HEAD_DIM + d[None, :]
    q_mask = mask & is_q[:, None]
    tl.store(q_dst, r1.to(dtype), mask=q_mask)
    tl.store(q_dst + HALF, r2.to(dtype), mask=q_mask)

    slot = tl.load(slot_ptr + t)
    # Broadcast the slot before comparing: the interpreter rejects a scalar-bool & tensor-bool mask.
    stored = (rows * 0 + slot) >= 0                                        # [BLOCK_H]
    kv_head = tl.where(is_k, rows - NUM_Q_HEADS, rows - NUM_Q_HEADS - NUM_KV_HEADS)
    kv_head = tl.where(is_q, 0, kv_head)                                   # q rows: any in-range index
    cache_off = slot.to(tl.int64) * (NUM_KV_HEADS * HEAD_DIM) + kv_head[:, None] * HEAD_DIM + d[None, :]
    k_mask = mask & (is_k & stored)[:, None]
    cache_ty = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + cache_off, r1.to(cache_ty), mask=k_mask)
    tl.store(k_cache_ptr + cache_off + HALF, r2.to(cache_ty), mask=k_mask)
    v_mask = mask & (is_v & stored)[:, None]
    tl.store(v_cache_ptr + cache_off, x1.to(cache_ty), mask=v_mask)
    tl.store(v_cache_ptr + cache_off + HALF, x2.to(cache_ty), mask=v_mask)


def default_block_h(num_rows: int) -> int:
    """Head rows per program: all of a token's (Hq + 2 Hkv) rows up to 32 (one program per token at
    Qwen3-0.6B's 16 + 2 * 8), so a decode token is one program."""
    return min(triton.next_power_of_2(num_rows), 32)


def qk_norm_rope_store(qkv: Tensor, num_q_heads: int, num_kv_heads: int, positions: Tensor, cos_sin: Tensor,
                       k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, q_weight: Tensor | None = None,
                       k_weight: Tensor | None = None, eps: float = 1e-6, block_h: int | None = None) -> Tensor:
    """qkv [T, (Hq + 2 Hkv) * D] -> q [T, Hq, D] (normed with q_weight when given, rotated); k (normed with
    k_weight, rotated) and v stored into k_cache / v_cache [num_blocks, block_size, Hkv, D] at
    slot_mapping [T] (negative: not stored). q_weight and k_weight: both or neither (no q/k norm)."""
    T = qkv.shape[0]
    D = k_cache.shape[-1]
    num_rows = num_q_heads + 2 * num_kv_heads
    if qkv.dim() != 2 or qkv.shape[1] != num_rows * D or (T and qkv.stride(1) != 1):
        raise ValueError(f"qkv must be [num_tokens, {num_rows * D}] with a unit stride along the row "
                         f"((num_q_heads + 2 num_kv_heads) * head_dim), got {tuple(qkv.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.shape[2] != num_kv_heads or not (
            k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"k_cache and v_cache must both be contiguous [num_blocks, block_size, {num_kv_heads}, "
                         f"{D}]; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if D % 2 or cos_sin.shape[0] != 2 or cos_sin.shape[2] != D or not cos_sin.is_contiguous():
        raise ValueError(f"cos_sin must be a contiguous [2, max_positions, {D}] table and head_dim even, got "
                         f"{tuple(cos_sin.shape)}")
    if positions.shape != (T,) or slot_mapping.shape != (T,):
        raise ValueError(f"positions and slot_mapping need one entry per token ({T}), got "
                         f"{tuple(positions.shape)} and {tuple(slot_mapping.shape)}")
    has_norm = q_weight is not None
    if has_norm != (k_weight is not None):
        raise ValueError("pass both q_weight and k_weight (q/k RMSNorm) or neither")
    q = torch.empty(T, num_q_heads, D, dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q
    block_h = block_h or default_block_h(num_rows)
    half = D // 2
    block_half = triton.next_power_of_2(half)
    _qk_norm_rope_store_kernel[(T, triton.cdiv(num_rows, block_h))](
        qkv, positions, cos_sin, q_weight if has_norm else qkv, k_weight if has_norm else qkv, q,
        k_cache, v_cache, slot_mapping, qkv.stride(0), cos_sin.stride(0), float(eps),
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=D, HALF=half, BLOCK_HALF=block_half,
        BLOCK_H=block_h, HAS_NORM=has_norm, num_warps=4 if block_h * block_half >= 1024 else 1,
    )
    return q
