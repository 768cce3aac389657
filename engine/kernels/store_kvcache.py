"""Triton kernel: write this step's keys/values into the paged KV cache.

One program per token copies its [num_kv_heads * head_dim] row of k and of v to cache slot
slot_mapping[t] (a negative slot, CUDA-graph padding, is skipped by masking the stores).
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr,                  # [num_tokens, Hkv, D], any token stride
    k_cache_ptr, v_cache_ptr,      # [num_blocks * block_size, Hkv, D], contiguous
    slot_ptr,                      # [num_tokens] int64
    stride_kt, stride_kh, stride_vt, stride_vh,
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,             # Hkv * D
    BLOCK: tl.constexpr,           # next power of two >= ROW
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    offs = tl.arange(0, BLOCK)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    # Broadcast the slot before comparing: the interpreter rejects a scalar-bool & tensor-bool mask.
    mask = (offs < ROW) & ((offs * 0 + slot) >= 0)
    k = tl.load(k_ptr + t * stride_kt + head * stride_kh + dim, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + head * stride_vh + dim, mask=mask)
    dst = slot.to(tl.int64) * ROW + offs
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kvcache(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """k, v: [num_tokens, Hkv, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] (contiguous);
    slot_mapping: [num_tokens] int64 (negative = skip)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous [num_blocks, block_size, num_kv_heads, head_dim]")
    if k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("k and v need a unit stride along head_dim; call .contiguous() first")
    row = num_kv_heads * head_dim
    _store_kvcache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HEAD_DIM=head_dim, ROW=row, BLOCK=triton.next_power_of_2(row),
        num_warps=4 if row >= 1024 else 1,
    )
