"""longest_remaining: preempt the running sequence with the most output tokens still to produce.

Source: the shortest-remaining-processing-time rule (Schrage 1968) applied to
the victim choice: the request furthest from finishing gains least from keeping
its place. Rule: the candidate with the largest
`max_output_tokens - num_output_tokens` (the workload-given length, i.e. oracle
knowledge); ties go to the newest.
"""
from __future__ import annotations

from policies.victim._ties import newness
from policies.victim.base import VictimPolicy


class LongestRemainingVictim(VictimPolicy):
    name = "longest_remaining"

    def select(self, candidates, view):
        return max(candidates, key=lambda s: (s.remaining_output_tokens, *newness(s)))
