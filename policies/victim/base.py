"""Preemption-victim contract: which running sequence to preempt.

select(candidates, view) -> one Sequence out of `candidates` (a non-empty list
the scheduler may legally preempt, in the running order). The chosen sequence is
preempted by the scheduler; the policy only picks. Read-only, O(n) at most.
"""
from __future__ import annotations


class VictimPolicy:
    name = "base"

    def select(self, candidates, view):
        raise NotImplementedError
