"""FIFO eviction: reclaim the block that entered the cache earliest.

Source: the FIFO baseline of cache replacement (Belady 1966), used in
prefix-cache ablations against LRU. A block's position is fixed the first time
it becomes evictable after receiving its content (the policy's first sight of a
cached block); later prefix hits and re-frees do not move it, so a hot prefix
block is evicted as soon as it is the oldest cached one, unlike LRU.
Heap of (first_seen, block) with lazy deletion: O(log n) per operation.
"""
from __future__ import annotations

import heapq

from policies.eviction.base import EvictionPolicy


class FIFOEviction(EvictionPolicy):
    name = "fifo"

    def __init__(self) -> None:
        self._first_seen: dict[int, int] = {}   # block -> tick of first add since it got its content
        self._evictable: set[int] = set()
        self._heap: list[tuple[int, int]] = []  # (first_seen, block); stale entries skipped on pop
        self._queued: set[int] = set()          # blocks with a current entry in the heap
        self._tick = 0

    def add(self, block_id: int) -> None:
        if block_id not in self._first_seen:
            self._first_seen[block_id] = self._tick
            self._tick += 1
        self._evictable.add(block_id)
        if block_id not in self._queued:
            self._queued.add(block_id)
            heapq.heappush(self._heap, (self._first_seen[block_id], block_id))
            if len(self._heap) > 2 * len(self._evictable) + 64:
                self._compact()

    def remove(self, block_id: int) -> None:
        self._evictable.remove(block_id)     # its heap entry stays; valid again if re-added

    def evict(self) -> int:
        while True:
            first, block_id = heapq.heappop(self._heap)
            if self._first_seen.get(block_id) != first:
                continue                     # entry from before the block was forgotten
            self._queued.discard(block_id)
            if block_id in self._evictable:
                self._evictable.remove(block_id)
                return block_id

    def forget(self, block_id: int) -> None:
        self._first_seen.pop(block_id, None)
        self._queued.discard(block_id)
        self._evictable.discard(block_id)

    def _compact(self) -> None:
        self._heap = [(self._first_seen[b], b) for b in self._evictable]
        heapq.heapify(self._heap)
        self._queued = set(self._evictable)

    def __len__(self) -> int:
        return len(self._evictable)
