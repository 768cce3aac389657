"""Eviction policy contract: which cached-but-free KV block is reclaimed first.

A block is *evictable* when no sequence holds it (ref count 0) but it still has a
valid content hash, so a later request with the same prefix can reuse it. When
the block manager needs a fresh block and has no plain free one, it asks the
policy for a victim among the evictable blocks.

Calls the block manager makes (block ids are ints in [0, num_kvcache_blocks)):
    add(block_id)    -- the block just became evictable (its last holder freed it);
                        blocks of one sequence are added tail-first, so among blocks
                        added together the tail of a prefix goes first
    remove(block_id) -- a prefix-cache hit took the block back; it is no longer evictable
    hit(block_id)    -- a prefix-cache hit on the block (counted for frequency policies);
                        called for every hit, whether the block was evictable or in use
    evict() -> int   -- choose a victim among evictable blocks, remove it and return it;
                        only called when len(self) > 0
    forget(block_id) -- the block lost its hash (it was evicted and reused): drop any
                        history kept about it
    __len__          -- number of evictable blocks

Each operation must be O(1) or O(log n): a million-request simulation calls them
millions of times. Policies keep their own state and never touch the block manager.
"""
from __future__ import annotations


class EvictionPolicy:
    name = "base"
    # False for `none`: the block manager then disables prefix caching entirely.
    enables_prefix_caching = True
    # True if evict() always returns the evictable block whose latest add() came first (hits and
    # history aside); the block manager then keeps blocks nobody can hit again outside the policy.
    evicts_in_add_order = False

    def add(self, block_id: int) -> None:
        raise NotImplementedError

    def remove(self, block_id: int) -> None:
        raise NotImplementedError

    def hit(self, block_id: int) -> None:
        pass

    def evict(self) -> int:
        raise NotImplementedError

    def forget(self, block_id: int) -> None:
        pass

    def __len__(self) -> int:
        raise NotImplementedError
