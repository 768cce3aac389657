"""LRU eviction (default): reclaim the block whose last use ended longest ago.

Source: vLLM's prefix-caching block evictor (and nano-vllm's free list). A
block's "last use" is the moment it became evictable; blocks freed together are
added tail-first, so the deepest block of a prefix goes before its parents,
which keeps shared prefix roots cached longest. O(1) per operation.
"""
from __future__ import annotations

from collections import OrderedDict

from policies.eviction.base import EvictionPolicy


class LRUEviction(EvictionPolicy):
    name = "lru"
    evicts_in_add_order = True

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()   # oldest first

    def add(self, block_id: int) -> None:
        self._order[block_id] = None

    def remove(self, block_id: int) -> None:
        del self._order[block_id]

    def evict(self) -> int:
        return self._order.popitem(last=False)[0]

    def __len__(self) -> int:
        return len(self._order)
