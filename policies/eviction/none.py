"""none: prefix caching off.

Source: vLLM with `enable_prefix_caching=False` (the v0 default). The block
manager turns prefix caching off when its eviction policy says so: no block is
ever hashed, so freed blocks go straight back to the free list and nothing is
ever cached-free. The methods below therefore never run; if one does, the
block manager broke that promise and we say so loudly.
"""
from __future__ import annotations

from policies.eviction.base import EvictionPolicy


class NoEviction(EvictionPolicy):
    name = "none"
    enables_prefix_caching = False

    def add(self, block_id: int) -> None:
        raise RuntimeError(f"eviction 'none' (prefix caching off) was handed cached block {block_id}; "
                           "the block manager should never hash blocks with prefix caching disabled")

    def remove(self, block_id: int) -> None:
        raise RuntimeError(f"eviction 'none' (prefix caching off) was asked to remove block {block_id}")

    def evict(self) -> int:
        raise RuntimeError("eviction 'none' (prefix caching off) has no cached blocks to evict")

    def __len__(self) -> int:
        return 0
