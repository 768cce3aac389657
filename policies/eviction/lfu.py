"""LFU eviction: reclaim the cached block with the fewest prefix-cache hits.

Source: classic least-frequently-used cache replacement, applied to the KV
prefix cache: blocks of popular shared prefixes (system prompts) survive bursts
of one-off prompts that would flush them under LRU. Rule: evict the
evictable block with the fewest hits since it got its content; ties go to the
least recently used (the block that became evictable earliest). A block's hit
count is dropped when it loses its content (forget). Heap of
(hits, last_free_tick, block) with lazy deletion: O(log n) per operation.
"""
from __future__ import annotations

import heapq

from policies.eviction.base import EvictionPolicy


class LFUEviction(EvictionPolicy):
    name = "lfu"

    def __init__(self) -> None:
        self._hits: dict[int, int] = {}        # block -> prefix hits since it got its content
        self._entry: dict[int, tuple[int, int, int]] = {}   # evictable block -> its live heap entry
        self._heap: list[tuple[int, int, int]] = []
        self._tick = 0

    def _push(self, block_id: int, tick: int) -> None:
        entry = (self._hits.get(block_id, 0), tick, block_id)
        self._entry[block_id] = entry
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._heap = list(self._entry.values())
            heapq.heapify(self._heap)

    def add(self, block_id: int) -> None:
        self._push(block_id, self._tick)
        self._tick += 1

    def remove(self, block_id: int) -> None:
        del self._entry[block_id]

    def hit(self, block_id: int) -> None:
        self._hits[block_id] = self._hits.get(block_id, 0) + 1
        entry = self._entry.get(block_id)
        if entry is not None:                  # a hit on an evictable block: re-rank it, same recency
            self._push(block_id, entry[1])

    def evict(self) -> int:
        while True:
            entry = heapq.heappop(self._heap)
            block_id = entry[2]
            if self._entry.get(block_id) == entry:
                del self._entry[block_id]
                return block_id

    def forget(self, block_id: int) -> None:
        self._hits.pop(block_id, None)
        self._entry.pop(block_id, None)

    def __len__(self) -> int:
        return len(self._entry)
