"""The unfused path the fused q/k-norm + RoPE + KV-store kernel replaces, and the bf16 error measure, for the
kernel tests and the GPU check (benchmarks/gpu_fused_qkv.py)."""
from __future__ import annotations

from torch import Tensor

from engine.layers import fused
from engine.layers.attention_backends.torch_backend import store_kvcache_torch


def unfused_qk_norm_rope_store(qkv: Tensor, heads: tuple[int, int, int], positions: Tensor, cos_sin: Tensor,
                               k_cache: Tensor, v_cache: Tensor, slots: Tensor, q_weight: Tensor | None,
                               k_weight: Tensor | None, eps: float, store=store_kvcache_torch) -> Tensor:
    """What engine/models/decoder.py runs with the switch off: fused.qk_norm_rope (or fused.rope without
    weights; looked up at call time, so eager or torch.compile'd), then `store` of k and v. heads: (Hq, Hkv, D).
    Returns q [T, Hq, D]."""
    hq, hkv, d = heads
    T = qkv.shape[0]
    if q_weight is not None:
        qk = fused.qk_norm_rope(qkv[:, :(hq + hkv) * d].view(T, hq + hkv, d), hq, q_weight, k_weight, eps, cos_sin,
                                positions)
        q, k = qk[:, :hq], qk[:, hq:]
    else:
        q, k = fused.rope(qkv[:, :hq * d].view(T, hq, d), qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d), cos_sin,
                          positions)
    store(k, qkv[:, (hq + hkv) * d:].view(T, hkv, d), k_cache, v_cache, slots)
    return q


def bf16_steps(out: Tensor, ref: Tensor) -> float:
    """Largest |out - ref| per head in bf16 steps (2^-7) of the head's largest |ref|: rounding differences stay at
    a few steps, a wrong weight or angle is tens."""
    scale = ref.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-6) * 2.0 ** -7
    return ((out.float() - ref.float()).abs() / scale).nan_to_num(0.0).max().item()
