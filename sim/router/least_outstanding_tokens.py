"""least_outstanding_tokens: the replica with the least work left (join-shortest-queue in tokens).

Work left is ReplicaView.outstanding_tokens: prompt tokens of requests not yet at
their first token plus output tokens not yet emitted. Ties go to the lowest index.
"""
from __future__ import annotations

from sim.router.base import Router, least_loaded


class LeastOutstandingTokensRouter(Router):
    name = "least_outstanding_tokens"

    def route(self, seq, replicas) -> int:
        return least_loaded(range(len(replicas)), replicas)
