"""round_robin: replicas in turn, by arrival order; blind to replica state."""
from __future__ import annotations

from sim.router.base import Router


class RoundRobinRouter(Router):
    name = "round_robin"
    reads_replica_state = False

    def __init__(self):
        self._next = 0

    def reset(self, replicas) -> None:
        self._next = 0

    def route(self, seq, replicas) -> int:
        i = self._next
        self._next = (i + 1) % len(replicas)
        return i
