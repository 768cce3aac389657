"""KV-block eviction policies: which cached-but-free block is reused first.

One file per policy; policies/registry.py discovers them.
"""
from policies.eviction.base import EvictionPolicy

__all__ = ["EvictionPolicy"]
