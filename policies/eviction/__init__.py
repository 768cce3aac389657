"""KV-block eviction policies: which cached-but-free block is reused first."""
from policies.eviction.base import EvictionPolicy
from policies.eviction.fifo import FIFOEviction
from policies.eviction.lfu import LFUEviction
from policies.eviction.lru import LRUEviction
from policies.eviction.none import NoEviction

__all__ = ["EvictionPolicy", "LRUEviction", "FIFOEviction", "LFUEviction", "NoEviction"]
