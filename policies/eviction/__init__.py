"""KV-block eviction policies: which cached-but-free block is reused first."""
from policies.eviction.base import EvictionPolicy
from policies.eviction.lru import LRUEviction

__all__ = ["EvictionPolicy", "LRUEviction"]
