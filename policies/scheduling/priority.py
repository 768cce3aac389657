"""priority: preemptive static-priority scheduling (lower value first).

Source: vLLM's `--scheduling-policy priority` (requests carry an integer
priority; the scheduler orders by (priority, arrival) and preempts the
lowest-priority running request for a higher-priority waiting one).
Rule: key = (priority, arrival time, admission order); the waiting queue and the
running set are served in key order; a waiting (or swapped) request that is
blocked by memory or `max_num_seqs` preempts running requests of a strictly
larger priority value, chosen by the victim policy (default lowest_priority).
Ties never preempt. Low-priority work can starve under sustained high-priority
load: that is the intended semantics.
"""
from __future__ import annotations

from policies.scheduling._common import arrival_rank
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy
from policies.victim.lowest_priority import LowestPriorityVictim


class PriorityPolicy(SchedulingPolicy):
    name = "priority"
    ranked = True
    preemptive = True
    # Static keys; the scheduler fast-forwards a preemptive policy only with an empty queue.
    fast_forward_ok = True

    def __init__(self, victim: VictimPolicy | None = None):
        super().__init__(victim if victim is not None else LowestPriorityVictim())

    def key(self, seq, view):
        return (seq.priority, *arrival_rank(seq))
