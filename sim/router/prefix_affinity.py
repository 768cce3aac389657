"""prefix_affinity: send a request where its prompt's leading blocks are cached.

Each replica's prefix cache is asked how many leading full blocks of the prompt
it holds (BlockManager.find_cached_prefix, read-only). The request goes to the
replica with the most, if that is at least `min_hit_blocks`; ties, and requests
no replica has cached, go to the replica with the least outstanding tokens
(then the lowest index). Cache-aware routing in the style of SGLang's router
and Preble, without their load-imbalance thresholds.
"""
from __future__ import annotations

from sim.router.base import Router, least_loaded


class PrefixAffinityRouter(Router):
    name = "prefix_affinity"

    def __init__(self, min_hit_blocks: int = 1):
        if min_hit_blocks < 1:
            raise ValueError(f"PrefixAffinityRouter.min_hit_blocks must be >= 1, got {min_hit_blocks}")
        self.min_hit_blocks = int(min_hit_blocks)

    def reset(self, replicas) -> None:
        sizes = {v.block_size for v in replicas}
        if len(sizes) > 1:
            # a Sequence caches its block hashes for one block size
            raise ValueError(f"prefix_affinity needs one block_size across replicas, got {sorted(sizes)}")

    def route(self, seq, replicas) -> int:
        hits = [v.cached_prefix_blocks(seq) for v in replicas]
        best = max(hits)
        if best < self.min_hit_blocks:
            return least_loaded(range(len(replicas)), replicas)
        return least_loaded([i for i, h in enumerate(hits) if h == best], replicas)

    def __repr__(self) -> str:
        return f"PrefixAffinityRouter(min_hit_blocks={self.min_hit_blocks})"
