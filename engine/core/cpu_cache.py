"""The CPU tier of the prefix cache: host-memory blocks holding KV that the GPU prefix cache evicted (torch-free).

The block manager (engine.core.block_manager) owns one `CpuPrefixCache` when
`cpu_cache_num_blocks > 0`. A block evicted from the GPU prefix cache is offloaded here
(`store`: its key and tokens get a CPU block, the executor copies GPU -> host); a later
prefix lookup that misses on the GPU but finds the key here loads it back (`pin`: the
executor copies host -> a fresh GPU block). The tier is inclusive: a loaded block keeps
its CPU copy, so evicting it from the GPU again costs no copy while the copy lasts.

A CPU block is in exactly one of three states:

    free      no key                          -> taken first by store
    cached    key, in the tier's eviction     -> hit by lookup; evicted (its key dropped)
              policy                             when store finds no free block
    pinned    key, out of the policy          -> touched this step (stored or loaded);
                                                 evictable again after unpin_all

so free + cached + pinned == num_blocks. Pinning keeps one step's copies consistent: a
block is written at most once per step and never read after being written in it (the
executor runs host reads before host writes, engine.swap_space.SwapSpace.swap), and a
block stored in this step cannot be hit before the next (its copy is in flight).

Keys are the block manager's (engine.core.block_keys); content-hash keys are checked
against the stored tokens on every hit, like the GPU side. DEAD_KEY marks a block nobody
can hit (a finished sequence's private block): it takes room and is evicted like any
other, as it would be if its content were hashed, but is in no table.
"""
from __future__ import annotations

from engine.core.free_blocks import FreeBlockQueue
from policies.eviction.base import EvictionPolicy
from policies.eviction.lru import LRUEviction

DEAD_KEY = -2       # the block manager's mark of a dead private block (never a table key)
_NO_KEY = -1


class CpuPrefixCache:
    """num_blocks host blocks under their own eviction policy (default LRU)."""

    def __init__(self, num_blocks: int, eviction: EvictionPolicy | None = None):
        if num_blocks < 1:
            raise ValueError(f"cpu_cache_num_blocks must be >= 1 for a CPU tier, got {num_blocks}")
        self.num_blocks = num_blocks
        self.eviction = eviction if eviction is not None else LRUEviction()
        if not self.eviction.enables_prefix_caching:
            raise ValueError(f"cpu_cache_eviction={self.eviction.name!r} caches nothing; give the CPU tier an "
                             "eviction policy that keeps blocks (lru, fifo, lfu) or set cpu_cache_num_blocks=0")
        self.free_ids = FreeBlockQueue(range(num_blocks))
        self.block_key = [_NO_KEY] * num_blocks
        self.block_tokens: list[tuple | None] = [None] * num_blocks
        self.key_to_block: dict[int, int] = {}
        self.pinned: list[int] = []     # pin order
        self._pinned: set[int] = set()
        self._stored: set[int] = set()  # pinned because stored this step: not hittable before unpin_all
        self.num_evicted = 0        # cached blocks dropped to make room (their KV is gone from both tiers)

    def __len__(self) -> int:
        """Blocks holding KV (cached + pinned)."""
        return self.num_blocks - len(self.free_ids)

    def lookup(self, key: int, tokens) -> int | None:
        """The CPU block holding `key` (tokens: the block's token ids, compared for content hashes), or None.
        A block stored in this step is not found until unpin_all."""
        c = self.key_to_block.get(key)
        if c is None or c in self._stored:
            return None
        if key >= 0 and self.block_tokens[c] != tuple(tokens):
            return None     # a hash collision caught by the token check
        return c

    def contains(self, key: int) -> bool:
        return key in self.key_to_block

    def store(self, key: int, tokens: tuple | None) -> int | None:
        """A CPU block for an offloaded GPU block of `key` (DEAD_KEY: unhittable), pinned until unpin_all;
        None when every block is pinned (the KV is dropped). The caller checks `contains` first."""
        if self.free_ids:
            c = self.free_ids.popleft()
        elif len(self.eviction):
            c = self.eviction.evict()
            old = self.block_key[c]
            if old != DEAD_KEY:
                del self.key_to_block[old]
            self.eviction.forget(c)
            self.num_evicted += 1
        else:
            return None
        self.block_key[c] = key
        self.block_tokens[c] = tokens
        if key != DEAD_KEY:
            self.key_to_block[key] = c
        self.pinned.append(c)
        self._pinned.add(c)
        self._stored.add(c)
        return c

    def pin(self, c: int) -> None:
        """A prefix hit loads block c this step: a hit for the policy, out of it until unpin_all."""
        if c not in self._pinned:
            self.eviction.remove(c)
            self.pinned.append(c)
            self._pinned.add(c)
        self.eviction.hit(c)

    def unpin_all(self) -> None:
        """The step's copies are handed to the executor: every pinned block becomes evictable again
        (in pin order, so LRU keeps the latest-touched longest)."""
        add = self.eviction.add
        for c in self.pinned:
            add(c)
        self.pinned.clear()
        self._pinned.clear()
        self._stored.clear()

    def check_invariants(self) -> None:
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a CPU tier block is twice in the free list"
        pinned = self._pinned
        assert len(pinned) == len(self.pinned) and pinned == set(self.pinned), "a CPU tier block is pinned twice"
        assert self._stored <= pinned, "a block stored this step is not pinned"
        assert not (free & pinned), "a free CPU tier block is pinned"
        assert len(free) + len(self.eviction) + len(pinned) == self.num_blocks, \
            "CPU tier: free + cached + pinned != cpu_cache_num_blocks"
        for c in free:
            assert self.block_key[c] == _NO_KEY, "a free CPU tier block still has a key"
        for c in range(self.num_blocks):
            if c not in free:
                assert self.block_key[c] != _NO_KEY, "a held CPU tier block has no key"
        for key, c in self.key_to_block.items():
            assert self.block_key[c] == key, "CPU tier table points at a block with another key"
        assert sum(1 for k in self.block_key if k not in (_NO_KEY, DEAD_KEY)) == len(self.key_to_block), \
            "CPU tier: a keyed block is missing from the table"
