"""The elementwise parts of a decoder layer, as plain tensor functions.

Eagerly, each is a handful of small kernels (casts, reductions, multiplies); at decode batch
sizes those launches and their memory round trips cost as much as the matmuls. On CUDA the
model runner calls `enable_compile()`, which swaps each function for a torch.compile'd version
that Inductor fuses into one kernel (the approach nano-vllm takes). Layers look the functions up
on this module at call time, so the swap reaches every layer. Numerics are the same ops either way:
float32 math, cast back to the activation dtype.
"""
from __future__ import annotations

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x [..., H] -> weight * x / sqrt(mean(x^2) + eps), in float32, cast back to x.dtype."""
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    return weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the norm."""
    s = x.float() + residual.float()
    var = s.pow(2).mean(dim=-1, keepdim=True)
    return weight * (s * torch.rsqrt(var + eps)).to(x.dtype), s.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def qk_norm_rope(qk: Tensor, num_q_heads: int, q_weight: Tensor, k_weight: Tensor, eps: float, cos_sin: Tensor,
                 positions: Tensor) -> Tensor:
    """Per-head RMSNorm then RoPE (rotate-half layout) at positions [T] of the q and k heads together.

    qk: [T, Hq + Hkv, D], the q heads then the k heads, as the packed qkv projection lays them out;
    q heads use q_weight [D], k heads k_weight [D]. Normalising both in one call makes it one kernel
    per layer instead of two. cos_sin: [2, max_positions, D] float32 table. Returns [T, Hq + Hkv, D].
    """
    is_q = torch.arange(qk.shape[1], device=qk.device)[:, None] < num_q_heads     # [Hq + Hkv, 1]
    cs = cos_sin[:, positions].unsqueeze(2)                                  # [2, T, 1, D]
    return _rotate(rms_norm(qk, torch.where(is_q, q_weight, k_weight), eps), cs[0], cs[1])


def rope(q: Tensor, k: Tensor, cos_sin: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    cs = cos_sin[:, positions].unsqueeze(2)
    return _rotate(q, cs[0], cs[1]), _rotate(k, cs[0], cs[1])


def silu_and_mul(x: Tensor) -> Tensor:
    """x [..., 2I] laid out [gate | up] -> silu(gate) * up [..., I]."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


_EAGER = dict(rms_norm=rms_norm, add_rms_norm=add_rms_norm, qk_norm_rope=qk_norm_rope, rope=rope,
              silu_and_mul=silu_and_mul)
compiled = False


def enable_compile() -> None:
    """Replace each function above by its torch.compile'd version (dynamic shapes: one compile per function)."""
    global compiled
    if compiled:
        return
    for name, fn in _EAGER.items():
        globals()[name] = torch.compile(fn, dynamic=True)
    compiled = True


def disable_compile() -> None:
    global compiled
    globals().update(_EAGER)
    compiled = False
