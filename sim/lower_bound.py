"""Roofline lower bound of a whole workload: the fastest any engine could finish it on the hardware.

Used for statements like "the engine reached x% of the physical limit" and for
tokens/s ceilings. The bound prices an ideal schedule with the roofline cost
model at efficiency 1.0 and no overhead (unless a different model is passed):

1. Prefill: every prompt in one step (merging steps never raises a roofline
   cost, since max(a1, b1) + max(a2, b2) >= max(a1 + a2, b1 + b2)). It samples
   each request's first output token.
2. Decode, all at once: decode step t (t = 1 .. max(output_len) - 1) runs every
   request with output_len - 1 >= t; request i attends to prompt_i + t keys.
   This is the fewest steps the token dependencies allow, so the weights are
   read the fewest times; the KV bytes read and the FLOPs are the same for
   every schedule.
3. KV memory: if the cache holds C tokens, any schedule keeping each running
   request's KV resident needs at least K = ceil(sum over decode steps of
   resident tokens / C) decode steps (and at least the step count of 2). When
   K exceeds the all-at-once step count, the weight-reading groups (linear
   layers, LM head) are raised to at least K weight reads each, and the fixed
   per-step overhead is paid K times. Recomputing or swapping evicted KV only
   adds work, so it is not credited.

Not modelled (each would only raise the bound of a real engine): arrivals over
time (the workload is assumed queued at t = 0), scheduler and launch gaps,
imperfect kernels, prefill/decode interference, and activations' memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from sim.cost_model.roofline import RooflineCostModel
from sim.specs.capacity import num_kv_blocks
from sim.specs.hardware import HardwareSpec, get_hardware_spec
from sim.specs.models import ModelSpec, get_model_spec


@dataclass(frozen=True)
class WorkloadBound:
    time_s: float                       # lower bound on the time to serve the whole workload
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    num_decode_steps: int               # decode steps of the bound's schedule (>= longest output - 1)
    kv_limited: bool                    # KV capacity forced more decode steps than the token dependencies
    kv_capacity_tokens: int
    peak_kv_tokens: int                 # KV resident at the fullest all-at-once step
    time_by_group_s: dict = field(default_factory=dict)   # prefill_step, linear, attention, lm_head, ...

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.time_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.time_s

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.time_s


def _as_arrays(requests: Iterable[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(requests if isinstance(requests, np.ndarray) else list(requests), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2 or len(arr) == 0:
        raise ValueError("requests must be a non-empty list of (prompt_len, output_len) pairs")
    p, o = arr[:, 0], arr[:, 1]
    if p.min() < 1 or o.min() < 1:
        raise ValueError(f"every prompt_len and output_len must be >= 1, got min prompt_len={p.min()}, "
                         f"min output_len={o.min()}")
    return p, o


def decode_schedule(prompt_lens: np.ndarray, output_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All-at-once decode steps: per step t = 1..T, (num_seqs[t-1], context_sum[t-1])."""
    d = output_lens - 1                                     # decode steps per request
    T = int(d.max())
    if T == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cnt = np.bincount(d, minlength=T + 1)                   # requests with exactly d decode steps
    psum = np.bincount(d, weights=prompt_lens, minlength=T + 1)
    n = np.cumsum(cnt[::-1])[::-1][1:]                      # [T] requests still decoding at step t
    prompts = np.cumsum(psum[::-1])[::-1][1:]               # [T] their prompt tokens
    t = np.arange(1, T + 1)
    return n.astype(np.int64), (np.rint(prompts).astype(np.int64) + t * n)


def workload_lower_bound(requests: Iterable[tuple[int, int]], model: ModelSpec | str = "Qwen3-0.6B",
                         hardware: HardwareSpec | str = "H200", tensor_parallel_size: int = 1,
                         kv_capacity_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                         activation_reserve_gib: float = 1.0, cost_model: RooflineCostModel | None = None
                         ) -> WorkloadBound:
    """Lower bound for serving `requests` (prompt_len, output_len) on one replica.

    `kv_capacity_tokens` defaults to num_kv_blocks(...) * 16 for the given memory settings.
    """
    model = get_model_spec(model) if isinstance(model, str) else model
    hardware = get_hardware_spec(hardware) if isinstance(hardware, str) else hardware
    cm = cost_model or RooflineCostModel(model, hardware, tensor_parallel_size=tensor_parallel_size)
    p, o = _as_arrays(requests)
    if kv_capacity_tokens is None:
        kv_capacity_tokens = 16 * num_kv_blocks(model, hardware, 16, gpu_memory_utilization,
                                                tensor_parallel_size, activation_reserve_gib)
    longest = int((p + o - 1).max())
    if longest > kv_capacity_tokens:
        raise ValueError(f"a request needs {longest} KV tokens but the cache holds {kv_capacity_tokens}; "
                         f"it cannot be served without recompute")

    # Prefill step: all prompts at once, each samples its first token.
    pre_tokens = int(p.sum())
    pairs = float((p * p).sum() - (p * p - p).sum() / 2)    # causal pairs with context == new == prompt
    lin_pre = max(pre_tokens * cm.s_linear_per_token, cm.s_linear_weights)
    lm_pre = max(len(p) * cm.s_lm_per_token, cm.s_lm_weights)
    attn_pre = max(pairs * cm.s_attn_per_pair, 2 * pre_tokens * cm.s_kv_per_token)
    ar_pre = pre_tokens * cm.s_allreduce_per_token + cm.s_allreduce_fixed if cm.s_allreduce_per_token else 0.0

    # Decode steps, vectorized over steps: n [T], S [T].
    n, S = decode_schedule(p, o)
    T = len(n)
    lin_dec = np.maximum(n * cm.s_linear_per_token, cm.s_linear_weights).sum()
    lm_dec = np.maximum(n * cm.s_lm_per_token, cm.s_lm_weights).sum()
    attn_dec = np.maximum(S * cm.s_attn_per_pair, (S + n) * cm.s_kv_per_token).sum()
    ar_dec = (n * cm.s_allreduce_per_token + cm.s_allreduce_fixed).sum() if cm.s_allreduce_per_token else 0.0

    # KV capacity: decode steps needed to hold the resident token-steps.
    occupancy = int(S.sum())
    k_min = max(T, -(-occupancy // kv_capacity_tokens))
    kv_limited = k_min > T
    linear = max(lin_pre + lin_dec, (k_min + 1) * cm.s_linear_weights)
    lm_head = max(lm_pre + lm_dec, (k_min + 1) * cm.s_lm_weights)
    overhead = (k_min + 1) * cm.overhead_s + cm.per_seq_overhead_s * (len(p) + int(n.sum()))
    groups = {"linear": float(linear), "attention_prefill": float(attn_pre), "attention_decode": float(attn_dec),
              "lm_head": float(lm_head), "allreduce": float(ar_pre + ar_dec), "overhead": float(overhead)}
    return WorkloadBound(
        time_s=sum(groups.values()), num_requests=len(p), prompt_tokens=pre_tokens, output_tokens=int(o.sum()),
        num_decode_steps=int(k_min), kv_limited=kv_limited, kv_capacity_tokens=int(kv_capacity_tokens),
        peak_kv_tokens=int(max(S.max() if T else 0, pre_tokens)), time_by_group_s=groups)
