"""prefix_affinity: send a request where its prompt is cached, unless that replica is overloaded.

Cache-aware routing in the style of SGLang's router (load-imbalance guard, cache
threshold) with a Preble-like cost in tokens for the cache-aware case. Loads are
ReplicaView.outstanding_tokens; cached tokens are ReplicaView.cached_prefix_blocks
times the block size (read-only lookups in each replica's prefix cache).

1. Imbalanced cluster: when max load - min load > balance_abs_threshold_tokens and
   max load > balance_rel_threshold * min load, the least loaded replica.
2. No useful hit: when no replica holds at least min_hit_blocks blocks and at least
   cache_threshold_fraction of the prompt, the least loaded replica.
3. Otherwise the replica with the lowest cost
       cost = prompt tokens it would compute (not cached there) + load_weight * its load
   so a cached prefix keeps a request on a busier replica only while the tokens it
   saves outweigh the extra work queued there.

Ties at every stage go to the replica this router has sent the fewest tokens so far
(base.RoutedTally), then the lowest index, so an idle cluster is filled evenly.
With load_weight=0, cache_threshold_fraction=0 and the guard off (a huge
balance_abs_threshold_tokens) this is pure affinity: the most cached blocks wins.
"""
from __future__ import annotations

import math

from sim.router.base import RoutedTally, Router, least_loaded


def _check(field: str, value, ok: bool, need: str):
    if not ok:
        raise ValueError(f"router.{field} must be {need}, got {value!r} (prefix_affinity; "
                         f"set it in conf/router/prefix_affinity.yaml or with router.{field}=...)")


class PrefixAffinityRouter(Router):
    name = "prefix_affinity"

    def __init__(self, min_hit_blocks: int = 1, cache_threshold_fraction: float = 0.3, load_weight: float = 1.0,
                 balance_abs_threshold_tokens: int = 131072, balance_rel_threshold: float = 1.5):
        def number(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        _check("min_hit_blocks", min_hit_blocks, isinstance(min_hit_blocks, int) and not isinstance(
            min_hit_blocks, bool) and min_hit_blocks >= 1, "an integer >= 1 (blocks)")
        _check("cache_threshold_fraction", cache_threshold_fraction,
               number(cache_threshold_fraction) and 0 <= cache_threshold_fraction <= 1, "a number in [0, 1]")
        _check("load_weight", load_weight, number(load_weight) and load_weight >= 0,
               "a number >= 0 (prompt tokens of cost per outstanding token)")
        _check("balance_abs_threshold_tokens", balance_abs_threshold_tokens,
               isinstance(balance_abs_threshold_tokens, int) and not isinstance(balance_abs_threshold_tokens, bool)
               and balance_abs_threshold_tokens >= 0, "an integer >= 0 (tokens)")
        _check("balance_rel_threshold", balance_rel_threshold, number(balance_rel_threshold)
               and balance_rel_threshold >= 1, "a number >= 1 (max load / min load)")
        self.min_hit_blocks = min_hit_blocks
        self.cache_threshold_fraction = float(cache_threshold_fraction)
        self.load_weight = float(load_weight)
        self.balance_abs_threshold_tokens = balance_abs_threshold_tokens
        self.balance_rel_threshold = float(balance_rel_threshold)
        self._tally = RoutedTally()

    def reset(self, replicas) -> None:
        sizes = {v.block_size for v in replicas}
        if len(sizes) > 1:
            # a Sequence caches its block hashes for one block size
            raise ValueError(f"prefix_affinity needs one block_size across replicas, got {sorted(sizes)}")
        self._tally = RoutedTally(len(replicas))

    def imbalanced(self, loads: list[int]) -> bool:
        lo, hi = min(loads), max(loads)
        return hi - lo > self.balance_abs_threshold_tokens and hi > self.balance_rel_threshold * lo

    def route(self, seq, replicas) -> int:
        if len(self._tally.tokens) != len(replicas):      # used without reset()
            self.reset(replicas)
        tally, everyone = self._tally, range(len(replicas))
        loads = [v.outstanding_tokens for v in replicas]
        if self.imbalanced(loads):
            return tally.add(least_loaded(everyone, replicas, tally), seq)
        bs = replicas[0].block_size
        hits = [v.cached_prefix_blocks(seq) for v in replicas]
        best = max(hits)
        if best < self.min_hit_blocks or best * bs < self.cache_threshold_fraction * seq.num_prompt_tokens:
            return tally.add(least_loaded(everyone, replicas, tally), seq)
        prompt, w = seq.num_prompt_tokens, self.load_weight
        choice = min(everyone, key=lambda i: (prompt - hits[i] * bs + w * loads[i], loads[i], tally.tokens[i], i))
        return tally.add(choice, seq)

    def __repr__(self) -> str:
        return (f"PrefixAffinityRouter(min_hit_blocks={self.min_hit_blocks}, "
                f"cache_threshold_fraction={self.cache_threshold_fraction}, load_weight={self.load_weight}, "
                f"balance_abs_threshold_tokens={self.balance_abs_threshold_tokens}, "
                f"balance_rel_threshold={self.balance_rel_threshold})")
