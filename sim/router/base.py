"""Router contract: which replica serves an arriving request.

The simulator calls `route(seq, replicas)` once per request, at its arrival
time, with the request as an engine Sequence (prompt token ids included) and
one read-only `ReplicaView` per replica; it returns a replica index in
[0, len(replicas)). At equal times every arrival is routed before any replica
finishes or starts a step, so a view shows each busy replica in the middle of
a step: what was scheduled is allocated, what it will emit is not yet counted.

A router must not mutate the sequence or reach through a view into the
scheduler; it may keep its own state (reset in `reset`, one run per reset),
e.g. a `RoutedTally` of what it sent where.

`reads_replica_state = False` declares that `route` ignores the views (it may
read only the request and its own state). The simulator then routes requests
ahead of time and each replica's fast path is bounded by its own next arrival
rather than the whole cluster's, which is exact because no routing decision
can observe a replica in between. Routers that read views must leave it True.
"""
from __future__ import annotations


class ReplicaView:
    """What a router may read about one replica (all counts at the current simulated time)."""

    __slots__ = ("_r",)

    def __init__(self, replica):
        self._r = replica

    @property
    def index(self) -> int:
        return self._r.index

    @property
    def num_running(self) -> int:
        return len(self._r.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Waiting in the scheduler (new and preempted) plus routed but not yet seen by a step."""
        return len(self._r.scheduler.waiting) + len(self._r.inbox)

    @property
    def num_swapped(self) -> int:
        return len(self._r.scheduler.swapped)

    @property
    def num_free_blocks(self) -> int:
        return self._r.scheduler.block_manager.num_free_blocks

    @property
    def num_kvcache_blocks(self) -> int:
        return self._r.scheduler.block_manager.num_kvcache_blocks

    @property
    def block_size(self) -> int:
        return self._r.scheduler.block_manager.block_size

    @property
    def outstanding_tokens(self) -> int:
        """Over requests routed here and not finished: prompt tokens until the first output token,
        plus output tokens not yet emitted."""
        return self._r.outstanding_tokens

    def cached_prefix_blocks(self, seq) -> int:
        """Leading full blocks of seq's prompt that this replica's prefix cache holds now
        (at most (len(prompt) - 1) // block_size: the last prompt token is always computed)."""
        return len(self._r.scheduler.block_manager.find_cached_prefix(seq))


class Router:
    name = "base"
    reads_replica_state = True

    def reset(self, replicas: list[ReplicaView]) -> None:
        """Called once before a run, with the views route() will get."""

    def route(self, seq, replicas: list[ReplicaView]) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RoutedTally:
    """Tokens (prompt + output cap) a router has sent to each replica so far this run.

    The tie-break among equally loaded replicas: idle replicas all show 0 outstanding tokens,
    and sending every such tie to the lowest index piles a lightly loaded cluster's traffic
    onto replica 0; the replica that has received the least work so far spreads it instead.
    """

    __slots__ = ("tokens",)

    def __init__(self, num_replicas: int = 0):
        self.tokens = [0] * num_replicas

    def add(self, i: int, seq) -> int:
        self.tokens[i] += seq.num_prompt_tokens + seq.max_output_tokens
        return i


def least_loaded(candidates, replicas: list[ReplicaView], tally: RoutedTally | None = None) -> int:
    """Index among `candidates` with the fewest outstanding tokens; ties to the fewest tokens
    routed so far (when a tally is given), then the lowest index."""
    best, best_key = -1, None
    for i in candidates:
        key = (replicas[i].outstanding_tokens, tally.tokens[i] if tally is not None else 0)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best
