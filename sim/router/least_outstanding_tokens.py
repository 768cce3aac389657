"""least_outstanding_tokens: the replica with the least work left (join-shortest-queue in tokens).

Work left is ReplicaView.outstanding_tokens: prompt tokens of requests not yet at
their first token plus output tokens not yet emitted. Ties go to the replica this
router has sent the fewest tokens so far (base.RoutedTally), then the lowest index.
"""
from __future__ import annotations

from sim.router.base import RoutedTally, Router, least_loaded


class LeastOutstandingTokensRouter(Router):
    name = "least_outstanding_tokens"

    def __init__(self):
        self._tally = RoutedTally()

    def reset(self, replicas) -> None:
        self._tally = RoutedTally(len(replicas))

    def route(self, seq, replicas) -> int:
        if len(self._tally.tokens) != len(replicas):      # used without reset()
            self.reset(replicas)
        return self._tally.add(least_loaded(range(len(replicas)), replicas, self._tally), seq)
