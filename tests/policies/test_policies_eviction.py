"""Eviction policies: a scenario that tells lru, fifo and lfu apart on a real BlockManager,
plus random operation sequences checked against naive O(n) reference models."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from policies.eviction.fifo import FIFOEviction
from policies.eviction.lfu import LFUEviction
from policies.eviction.lru import LRUEviction
from policies.eviction.none import NoEviction


def _cache(bm, rid, tok):
    """A one-token sequence computes block [tok], publishes it and frees it: cached-free."""
    seq = Sequence(rid, [tok])
    bm.allocate(seq, 1)
    seq.num_computed_tokens = 1
    bm.register_computed_blocks(seq)
    block = seq.block_table[0]
    bm.free(seq)
    return block


def _reuse(bm, rid, tok):
    """A two-token sequence [tok, 0] hits block [tok] in the prefix cache, then frees it again."""
    seq = Sequence(rid, [tok, 0])
    hits = bm.find_cached_prefix(seq)
    assert len(hits) == 1
    bm.allocate_cached_prefix(seq, hits)
    bm.free(seq)


def _victim(eviction):
    # block_size 1, 3 blocks: X, Z, Y cached in that order (FIFO order X < Z < Y).
    bm = BlockManager(num_kvcache_blocks=3, block_size=1, eviction=eviction)
    blocks = {"X": _cache(bm, "x", 10), "Z": _cache(bm, "z", 30), "Y": _cache(bm, "y", 20)}
    _reuse(bm, "z1", 30)    # Z: 2 hits, freed again (recency order now X < Y < Z)
    _reuse(bm, "z2", 30)
    _reuse(bm, "y1", 20)    # Y: 1 hit -> recency X < Z < Y
    _reuse(bm, "x1", 10)    # X: 1 hit -> recency Z < Y < X
    bm.check_invariants([])
    assert bm.num_cached_free_blocks == 3 and not bm.free_ids
    seq = Sequence("w", [99])
    bm.allocate(seq, 1)     # no plain free block: the policy picks a victim
    victim = {b: name for name, b in blocks.items()}[seq.block_table[0]]
    bm.check_invariants([seq])
    return victim


def test_lru_fifo_lfu_evict_three_different_blocks():
    assert _victim(LRUEviction()) == "Z"     # least recently freed
    assert _victim(FIFOEviction()) == "X"    # cached first; its re-use does not move it
    assert _victim(LFUEviction()) == "Y"     # X and Y have 1 hit (Z 2); Y was freed before X


def test_none_turns_prefix_caching_off():
    bm = BlockManager(num_kvcache_blocks=2, block_size=1, eviction=NoEviction())
    assert not bm.enable_prefix_caching
    seq = Sequence("a", [5])
    bm.allocate(seq, 1)
    seq.num_computed_tokens = 1
    bm.register_computed_blocks(seq)
    bm.free(seq)
    assert bm.num_cached_free_blocks == 0 and len(bm.free_ids) == 2
    assert bm.find_cached_prefix(Sequence("b", [5, 0])) == []
    with pytest.raises(RuntimeError, match="prefix caching off"):
        NoEviction().evict()


class _Reference:
    """Naive model: evictable blocks with (first_seen, last_add, hits); O(n) evict."""

    def __init__(self, kind):
        self.kind, self.tick = kind, 0
        self.evictable: set[int] = set()
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.hits: dict[int, int] = {}

    def add(self, b):
        self.first.setdefault(b, self.tick)
        self.last[b] = self.tick
        self.tick += 1
        self.evictable.add(b)

    def remove(self, b):
        self.evictable.remove(b)

    def hit(self, b):
        self.hits[b] = self.hits.get(b, 0) + 1

    def forget(self, b):
        self.first.pop(b, None)
        self.hits.pop(b, None)

    def evict(self):
        rank = {"lru": lambda b: self.last[b], "fifo": lambda b: self.first[b],
                "lfu": lambda b: (self.hits.get(b, 0), self.last[b])}[self.kind]
        b = min(self.evictable, key=rank)
        self.evictable.remove(b)
        return b


POLICIES = {"lru": LRUEviction, "fifo": FIFOEviction, "lfu": LFUEviction}


@pytest.mark.parametrize("kind", sorted(POLICIES))
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "remove", "hit", "evict"]), st.integers(0, 7)),
                    max_size=200))
def test_matches_reference_model(kind, ops):
    """Drive ops the way the block manager does: a block is in use or evictable; hit happens
    right after remove (prefix hit); an evicted block is forgotten and may be re-cached later."""
    pol, ref = POLICIES[kind](), _Reference(kind)
    in_use = set(range(8))          # start: every block held by someone, none evictable
    for op, b in ops:
        if op == "add" and b in in_use:
            in_use.remove(b)
            pol.add(b), ref.add(b)
        elif op in ("remove", "hit") and b in ref.evictable:
            pol.remove(b), ref.remove(b)
            pol.hit(b), ref.hit(b)
            in_use.add(b)
        elif op == "hit" and b in in_use:
            pol.hit(b), ref.hit(b)   # a hit on a block another sequence holds
        elif op == "evict" and ref.evictable:
            got, want = pol.evict(), ref.evict()
            assert got == want
            pol.forget(got), ref.forget(got)
            in_use.add(got)          # reused for new content
        assert len(pol) == len(ref.evictable)
