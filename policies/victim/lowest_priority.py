"""lowest_priority: preempt the least important running sequence.

Source: priority scheduling in vLLM (`--scheduling-policy priority`), which
preempts the request with the largest priority value. Rule: the candidate with
the largest `priority` value (lower value = more important); ties go to the
newest (latest arrival, then latest admission), as in vLLM's LIFO default.
"""
from __future__ import annotations

from policies.victim._ties import newness
from policies.victim.base import VictimPolicy


class LowestPriorityVictim(VictimPolicy):
    name = "lowest_priority"

    def select(self, candidates, view):
        return max(candidates, key=lambda s: (s.priority, *newness(s)))
