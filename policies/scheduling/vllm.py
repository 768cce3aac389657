"""vllm: FCFS admission, optimistic allocation, newest-first recompute preemption.

Source: vLLM's scheduler (v0 default policy) and nano-vllm. Waiting requests are
admitted in arrival order (preempted ones first, at the head of the queue) as
long as the blocks for their uncomputed tokens are free; decode steps take one
block at a time, and when none is left the newest running sequence is
preempted (its blocks freed, to be recomputed later) until the older ones fit.
"""
from __future__ import annotations

from policies.scheduling.base import SchedulingPolicy


class VLLMPolicy(SchedulingPolicy):
    fast_forward_ok = True
    name = "vllm"
