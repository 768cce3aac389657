"""newest (LIFO): preempt the most recently arrived running sequence.

Source: vLLM and nano-vllm (`running.pop()`): the newest request has the least
work invested, so recomputing it wastes the least.
"""
from __future__ import annotations

from policies.victim.base import VictimPolicy


class NewestVictim(VictimPolicy):
    name = "newest"

    def select(self, candidates, view):
        return max(candidates, key=lambda s: (s.arrival_time_s, s.admit_order))
