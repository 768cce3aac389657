"""most_blocks: preempt the running sequence holding the most KV blocks.

Source: the classic largest-footprint-first heuristic, the usual counterpart
to vLLM's LIFO (`newest`) choice in victim ablations. Rule: the candidate with the longest
block table frees the most memory with one preemption, so fewer requests are
disturbed; ties go to the newest. It also wastes the most recompute work, which
is the trade-off against `newest`.
"""
from __future__ import annotations

from policies.victim._ties import newness
from policies.victim.base import VictimPolicy


class MostBlocksVictim(VictimPolicy):
    name = "most_blocks"

    def select(self, candidates, view):
        return max(candidates, key=lambda s: (len(s.block_table), *newness(s)))
