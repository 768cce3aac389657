"""vllm_swap: the vllm policy with preemption by swapping instead of recompute.

Source: vLLM v0 `preemption_mode="swap"` (Kwon et al. 2023, PagedAttention,
section 4.5). Same FCFS admission and newest-first victim as `vllm`, but a
preempted sequence's KV blocks are copied to the CPU swap space and copied back
later, instead of being freed and recomputed. Swapped sequences return (in key
order, i.e. arrival) before any new admission. When the swap space is full the
scheduler falls back to recompute. Needs SchedulerConfig.num_cpu_blocks > 0.
Helps when prompts are long (recompute is expensive); hurts when PCIe copies
dominate short sequences.
"""
from __future__ import annotations

from policies.scheduling.vllm import VLLMPolicy


class VLLMSwapPolicy(VLLMPolicy):
    name = "vllm_swap"
    preemption_mode = "swap"
