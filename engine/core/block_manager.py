"""Paged KV-cache allocator with prefix caching and a CPU swap space (torch-free).

The KV cache is `num_kvcache_blocks` fixed-size blocks of `block_size` token slots. Each
sequence owns a block table (list of block ids). A GPU block is in exactly one of
three states:

    free          ref_count 0, no hash       -> handed out first
    cached-free   ref_count 0, valid hash    -> reusable by a prefix hit; reclaimed
                                                (evicted) when no free block is left,
                                                in the order the eviction policy picks
    in use        ref_count >= 1             -> held by one or more sequences

so free + cached-free + in-use == num_kvcache_blocks at all times.

Prefix caching: every *full* block of a sequence gets a chained hash
h_i = xxh64(h_{i-1} || token ids of block i). A later sequence whose prompt
starts with the same tokens finds those blocks through the hash table; token ids
are compared on every hit, so a hash collision can never serve wrong KV.

Private blocks (`Sequence.private_from`, set by the simulator): a block holding a
token at or past private_from can only ever match the same sequence's own block
(after a preemption), so it is keyed by (sequence, block index) instead of hashed,
and only once it could be looked up: the first time the sequence is freed
unfinished, its full computed private blocks are published under those keys.
Until then every full computed private block counts as registered (no earlier copy
can exist, so none would have been skipped). When the sequence finishes, its
private blocks are dead (nobody can hit them). Under an eviction policy that
evicts in add order (LRU), dead blocks freed while the policy holds no block go to
the plain free list, `num_dead_free` of whose blocks count as cached-free and are
taken after the plain ones: the policy would have evicted them before anything it
receives later. Otherwise they enter the policy as cached blocks. The blocks before
private_from are keyed by `Sequence.prefix_chain` when the sequence has one, else
hashed (engine.core.block_keys). Counts, hits and eviction order are those of hashing
every block.

Swap space: `num_cpu_blocks` host-memory blocks. swap_out/swap_in move a
sequence's blocks between GPU and CPU and return the (src, dst) block pairs the
executor must copy; the allocator only does the bookkeeping.

CPU tier of the prefix cache (`cpu_cache_num_blocks` > 0; engine.core.cpu_cache): a
cached-free GPU block that is evicted is offloaded to the tier, unless the tier holds its
key already or the step has offloaded `cpu_cache_max_offload_blocks` (the copies the
executor hides behind the forward pass; later evictions of the step drop their KV). A
prefix lookup continues past a GPU miss into the tier; a tier hit takes a fresh GPU block
(loaded from host) that joins the GPU prefix cache. The copies of one step accumulate here
and are taken by `take_tier_copies` (the scheduler puts them into the batch: Batch.offload,
Batch.load). With the tier on, dead private blocks always enter the eviction policy (never
the plain free list): evicting one offloads it, as hashing every block would.
"""
from __future__ import annotations

import sys
from collections import deque

from engine.core.block_keys import extend_block_keys, first_private_block, hash_block, private_key_base
from engine.core.cpu_cache import DEAD_KEY, CpuPrefixCache
from engine.core.free_blocks import FreeBlockQueue
from engine.core.kv_layout import check_block_size
from engine.core.sequence import Sequence, SequenceStatus
from policies.eviction.base import EvictionPolicy
from policies.eviction.lru import LRUEviction

FINISHED = SequenceStatus.FINISHED
_DEAD = DEAD_KEY            # block_hash of a dead private block inside the eviction policy (no table entry)


class BlockManager:
    def __init__(self, num_kvcache_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 eviction: EvictionPolicy | None = None, num_cpu_blocks: int = 0, cpu_cache_num_blocks: int = 0,
                 cpu_cache_eviction: EvictionPolicy | None = None, cpu_cache_max_offload_blocks: int = 512):
        check_block_size(block_size)
        if num_kvcache_blocks < 1:
            raise ValueError(f"num_kvcache_blocks must be >= 1, got {num_kvcache_blocks}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        if cpu_cache_num_blocks < 0:
            raise ValueError(f"cpu_cache_num_blocks must be >= 0 (0: no CPU tier), got {cpu_cache_num_blocks}")
        if cpu_cache_max_offload_blocks < 0:
            raise ValueError(f"cpu_cache_max_offload_blocks must be >= 0 (blocks offloaded per step), got "
                             f"{cpu_cache_max_offload_blocks}")
        self.num_kvcache_blocks = num_kvcache_blocks
        self.block_size = block_size
        self.eviction = eviction if eviction is not None else LRUEviction()
        self.enable_prefix_caching = enable_prefix_caching and self.eviction.enables_prefix_caching
        self.hash_fn = hash_block   # replaceable in tests to force collisions

        self.ref_counts = [0] * num_kvcache_blocks
        self.block_hash = [-1] * num_kvcache_blocks              # -1: not registered in the prefix cache
        self.block_tokens: list[tuple | None] = [None] * num_kvcache_blocks   # token ids of a hashed block (hit check)
        self.hash_to_block: dict[int, int] = {}
        self.free_ids = FreeBlockQueue(range(num_kvcache_blocks))
        self.num_used_blocks = 0
        self.num_dead_free = 0      # blocks of free_ids that count as cached-free (dead private blocks)
        self._num_keyed = 0         # sequences whose private blocks got keys
        # True while no block is shared or hashed (prefix caching off): free() then needs no per-block checks.
        self._plain = not self.enable_prefix_caching

        self.num_cpu_blocks = num_cpu_blocks
        self.cpu_free_ids: deque[int] = deque(range(num_cpu_blocks))
        self.cpu_tables: dict = {}                        # request_id -> CPU block ids of a swapped sequence

        self.cpu_cache: CpuPrefixCache | None = None
        if cpu_cache_num_blocks:
            if not self.enable_prefix_caching:
                raise ValueError(f"cpu_cache_num_blocks={cpu_cache_num_blocks} needs the GPU prefix cache: set "
                                 "enable_prefix_caching=true with an eviction policy other than 'none', or "
                                 "cpu_cache_num_blocks=0")
            self.cpu_cache = CpuPrefixCache(cpu_cache_num_blocks, cpu_cache_eviction)
        self.cpu_cache_max_offload_blocks = cpu_cache_max_offload_blocks
        self.num_offloads_dropped = 0                     # evicted blocks not offloaded: the step's budget was spent
        self.tier_out: list[tuple[int, int]] = []         # this step's offloads: (GPU block, tier block)
        self.tier_in: list[tuple[int, int]] = []          # this step's loads: (tier block, GPU block)
        self.last_cpu_hit_blocks = 0                      # CPU-tier blocks of the latest allocate_cached_prefix

        # Prefix-cache accounting (tokens), read by recorders.
        self.num_hit_tokens = 0
        self.num_queried_tokens = 0

    # -- counts ------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable right now: plain free plus cached-free (evictable)."""
        return len(self.free_ids) + len(self.eviction)

    @property
    def num_free_blocks_without_copy(self) -> int:
        """Blocks allocatable with no block copy: num_free_blocks, or with a CPU tier only the plain free
        ones (evicting a cached block then offloads it, a copy the step pays for)."""
        return self.num_free_blocks if self.cpu_cache is None else len(self.free_ids)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.eviction) + self.num_dead_free

    @property
    def num_cpu_free_blocks(self) -> int:
        return len(self.cpu_free_ids)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks `seq` needs to hold its first num_computed + num_new_tokens tokens."""
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, need - len(seq.block_table))

    # -- prefix cache -------------------------------------------------------------
    def _private_block(self, seq: Sequence) -> int:
        return first_private_block(seq, self.block_size)

    @staticmethod
    def registers_lazily(seq: Sequence) -> bool:
        """Whether seq's private blocks are still registered implicitly (never freed unfinished)."""
        return seq.private_key == 0 and seq.private_from is not None

    def _seq_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        return extend_block_keys(seq, num_full_blocks, self.block_size, self.hash_fn)

    def _publish_private(self, seq: Sequence) -> None:
        """Key seq's private blocks and publish the full computed ones (seq is freed unfinished
        for the first time: from now on it may look them up)."""
        self._num_keyed += 1
        seq.private_key = base = private_key_base(self._num_keyed)
        table = seq.block_table
        for i in range(self._private_block(seq), min(seq.num_computed_tokens // self.block_size, len(table))):
            self.block_hash[table[i]] = base - 2 * i
            self.hash_to_block[base - 2 * i] = table[i]

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of seq's known tokens (read-only).

        At least one token is always left to compute, since the step that
        computes it produces the logits the next token is sampled from.
        """
        if not self.enable_prefix_caching or seq.block_table:
            return []
        bs = self.block_size
        max_blocks = (len(seq.token_ids) - 1) // bs
        p0 = self._private_block(seq)
        if max_blocks > p0 and seq.private_key == 0:
            max_blocks = p0     # private blocks not published yet: in no table
        hits: list[int] = []
        if max_blocks == 0:
            return hits
        hashes = self._seq_hashes(seq, max_blocks)
        tokens = seq.token_ids
        cpu = self.cpu_cache
        for i in range(max_blocks):
            h = hashes[i]
            block_id = self.hash_to_block.get(h)
            if block_id is None or (h >= 0 and self.block_tokens[block_id] != tuple(tokens[i * bs:(i + 1) * bs])):
                # miss, or a hash collision caught by the token check (a key is exact)
                c = None if cpu is None else cpu.lookup(h, tokens[i * bs:(i + 1) * bs])
                if c is None:
                    break
                block_id = -1 - c       # a CPU-tier hit
            hits.append(block_id)
        return hits

    def num_hit_blocks_taken(self, hit_blocks: list[int]) -> int:
        """Blocks of the free pool that allocate_cached_prefix(seq, hit_blocks) takes: cached-free GPU hits
        (revived) and CPU-tier hits (each loaded into a fresh GPU block)."""
        rc = self.ref_counts
        return sum(1 for b in hit_blocks if b < 0 or rc[b] == 0)

    def allocate_cached_prefix(self, seq: Sequence, hit_blocks: list[int]) -> int:
        """Give seq the blocks from find_cached_prefix (CPU-tier hits, -1 - tier block, are loaded into
        fresh GPU blocks); returns the tokens they cover. The caller checks num_hit_blocks_taken first."""
        assert not seq.block_table, "prefix hits apply to a sequence without blocks"
        if hit_blocks:
            self._plain = False
        self.last_cpu_hit_blocks = 0
        table = list(hit_blocks)
        for block_id in hit_blocks:
            if block_id < 0:
                continue
            if self.ref_counts[block_id] == 0:
                self.eviction.remove(block_id)
                self.num_used_blocks += 1
            self.ref_counts[block_id] += 1
            self.eviction.hit(block_id)
        if self.cpu_cache is not None and hit_blocks and min(hit_blocks) < 0:
            self._load_tier_hits(table)
        seq.block_table = table
        seq.num_registered_blocks = len(hit_blocks)
        num_tokens = len(hit_blocks) * self.block_size
        seq.num_computed_tokens = num_tokens
        return num_tokens

    def _load_tier_hits(self, table: list[int]) -> None:
        """Replace each CPU-tier hit (-1 - tier block) of table by a fresh GPU block published under its key,
        and queue the host -> GPU copies. The tier blocks are pinned first, so the offloads these
        allocations cause never evict them."""
        cpu = self.cpu_cache
        hits = [(i, -1 - b) for i, b in enumerate(table) if b < 0]
        for _, c in hits:
            cpu.pin(c)
        for i, c in hits:
            g = self.take_block()
            key = cpu.block_key[c]
            if key not in self.hash_to_block:
                self.block_hash[g] = key
                self.block_tokens[g] = cpu.block_tokens[c]
                self.hash_to_block[key] = g
            table[i] = g
            self.tier_in.append((c, g))
        self.last_cpu_hit_blocks = len(hits)

    def _offload(self, block_id: int) -> None:
        """An evicted cached-free GPU block leaves for the CPU tier (called before it loses its key): a
        copy is queued unless the tier has the key already, the step's offload budget is spent, or the
        tier is wholly pinned."""
        h = self.block_hash[block_id]
        cpu = self.cpu_cache
        if h == -1 or cpu.contains(h):
            return
        if len(self.tier_out) >= self.cpu_cache_max_offload_blocks:
            self.num_offloads_dropped += 1
            return
        c = cpu.store(h, self.block_tokens[block_id])
        if c is not None:
            self.tier_out.append((block_id, c))

    def take_tier_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(offloads (GPU block, tier block), loads (tier block, GPU block)) queued since the last call, for the
        executor to run before the step's forward pass (no tier block is in both, none twice in one list);
        the tier's pinned blocks become evictable again."""
        out, inn = self.tier_out, self.tier_in
        self.tier_out, self.tier_in = [], []
        if self.cpu_cache is not None:
            self.cpu_cache.unpin_all()
        return out, inn

    def register_computed_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Publish seq's newly full, fully computed blocks in the prefix cache (those within its
        first num_tokens tokens; default all computed ones)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        upto = seq.num_computed_tokens if num_tokens is None else num_tokens
        num_full = min(upto // bs, len(seq.block_table))
        start = seq.num_registered_blocks
        if num_full <= start:
            return
        end = num_full
        p0 = self._private_block(seq)
        if end > p0 and seq.private_key == 0:
            end = p0            # private blocks: registered implicitly until published
        if end > start:
            hashes = self._seq_hashes(seq, end)
            table = seq.block_table
            tokens = seq.token_ids
            for i in range(start, end):
                block_id = table[i]
                h = hashes[i]
                if self.block_hash[block_id] != -1 or h in self.hash_to_block:
                    continue   # already published, or the same content (or a collision) is cached elsewhere
                self.block_hash[block_id] = h
                self.block_tokens[block_id] = tuple(tokens[i * bs:(i + 1) * bs]) if h >= 0 else None
                self.hash_to_block[h] = block_id
        seq.num_registered_blocks = num_full

    # -- allocation ---------------------------------------------------------------
    def _take_free(self, n: int) -> list[int]:
        """The n oldest ids of free_ids (n <= len): plain free ones first, then dead ones (by count)."""
        dead = self.num_dead_free
        if dead and n > len(self.free_ids) - dead:   # (never with a CPU tier: dead blocks enter the policy)
            self.num_dead_free = len(self.free_ids) - n
        return self.free_ids.take(n)

    def take_block(self) -> int:
        """One block for a sequence's table: a plain free one, else an evicted cached one."""
        if self.free_ids:
            if self.num_dead_free == len(self.free_ids):
                self.num_dead_free -= 1
            block_id = self.free_ids.popleft()
        else:
            block_id = self.eviction.evict()
            if self.cpu_cache is not None:
                self._offload(block_id)
            self._unhash(block_id)
        self.ref_counts[block_id] = 1
        self.num_used_blocks += 1
        return block_id

    def _unhash(self, block_id: int) -> None:
        h = self.block_hash[block_id]
        if h != -1:
            if self.hash_to_block.get(h) == block_id:
                del self.hash_to_block[h]
            self.block_hash[block_id] = -1
            self.block_tokens[block_id] = None
            self.eviction.forget(block_id)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Extend seq's block table to hold num_computed + num_new_tokens tokens."""
        table = seq.block_table
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if need <= 0:
            return
        free_ids = self.free_ids
        if need <= len(free_ids):
            # The common case, inlined: plain free blocks suffice, nothing to evict (same as take_block).
            rc = self.ref_counts
            new = self._take_free(need)
            for block_id in new:
                rc[block_id] = 1
            table += new
            self.num_used_blocks += need
            return
        if need > self.num_free_blocks:
            raise RuntimeError(f"request {seq.request_id!r}: needs {need} KV blocks, {self.num_free_blocks} free "
                               "(the scheduler must check can_allocate first)")
        # need take_block calls, inlined (a long prompt evicts thousands of blocks): every free block,
        # then evicted cached ones
        new = self._take_free(len(free_ids))
        hashes, h2b, tokens, evict = self.block_hash, self.hash_to_block, self.block_tokens, self.eviction
        forget = evict.forget
        offload = self._offload if self.cpu_cache is not None else None
        for _ in range(need - len(new)):
            block_id = evict.evict()
            if offload is not None:
                offload(block_id)
            h = hashes[block_id]
            if h != -1:         # _unhash
                if h2b.get(h) == block_id:
                    del h2b[h]
                hashes[block_id] = -1
                tokens[block_id] = None
                forget(block_id)
            new.append(block_id)
        rc = self.ref_counts
        for block_id in new:
            rc[block_id] = 1
        table += new
        self.num_used_blocks += need

    def allocate_each(self, seqs, num_new_tokens: int) -> None:
        """allocate(seq, num_new_tokens) for each of seqs in order, in one call (a decode batch):
        the same blocks in the same tables, taken from the free list at once."""
        bs = self.block_size
        needs = [-(-(s.num_computed_tokens + num_new_tokens) // bs) - len(s.block_table) for s in seqs]
        total = 0
        for need in needs:
            if need > 0:
                total += need
        if total == 0:
            return
        if total > len(self.free_ids):      # evictions needed: the general path, one sequence at a time
            for seq in seqs:
                self.allocate(seq, num_new_tokens)
            return
        self.hand_out(seqs, needs, total)

    def hand_out(self, seqs, needs: list[int], total: int) -> None:
        """Append needs[i] plain free blocks to seqs[i]'s table, in order, as one slice of the
        free list (total = the sum of the positive needs <= the plain free blocks)."""
        new = self._take_free(total)
        rc = self.ref_counts
        for block_id in new:
            rc[block_id] = 1
        o = 0
        for seq, need in zip(seqs, needs):
            if need > 0:
                seq.block_table += new[o:o + need]
                o += need
        self.num_used_blocks += total

    def _release(self, block_id: int) -> None:
        rc = self.ref_counts[block_id] - 1
        self.ref_counts[block_id] = rc
        if rc == 0:
            self.num_used_blocks -= 1
            if self.block_hash[block_id] != -1:
                self.eviction.add(block_id)
            else:
                self.free_ids.append(block_id)

    def free(self, seq: Sequence) -> None:
        """Drop seq's hold on its blocks (tail first, so eviction takes tails first). A FINISHED
        sequence's private blocks are dead (see the module docstring)."""
        if self._plain:
            self._free_unshared(seq, 0)
            return
        table = seq.block_table
        finished = seq.status is FINISHED
        lazy = seq.private_key == 0 and seq.private_from is not None
        evict = self.eviction
        dead_first = evict.evicts_in_add_order and not len(evict) and self.cpu_cache is None
        if lazy and not finished:
            self._publish_private(seq)
            lazy = False
        elif lazy and dead_first and seq.private_from == 0:
            # Wholly private and never published: its full computed blocks are dead.
            self._free_unshared(seq, min(seq.num_computed_tokens // self.block_size, len(table)))
            return
        # _release inlined (one call per block dominated freeing a long sequence)
        rc, hashes, free_ids = self.ref_counts, self.block_hash, self.free_ids
        p0 = self._private_block(seq) if finished else sys.maxsize      # blocks from p0 on may be dead
        n_lazy = min(seq.num_computed_tokens // self.block_size, len(table)) if lazy else 0
        released = 0
        for i in range(len(table) - 1, -1, -1):
            block_id = table[i]
            r = rc[block_id] - 1
            rc[block_id] = r
            if r:
                continue
            released += 1
            if i >= p0 and (i < n_lazy or hashes[block_id] != -1):      # a dead private block
                if dead_first and not len(evict):
                    if hashes[block_id] != -1:
                        self._unhash(block_id)
                    free_ids.append(block_id)
                    self.num_dead_free += 1
                    continue
                if hashes[block_id] == -1:
                    hashes[block_id] = _DEAD
                evict.add(block_id)
            elif hashes[block_id] != -1:
                evict.add(block_id)
            else:
                free_ids.append(block_id)
        self.num_used_blocks -= released
        seq.block_table = []
        seq.num_registered_blocks = 0

    def _free_unshared(self, seq: Sequence, num_dead: int) -> None:
        """free() of a sequence whose blocks are each held once and unhashed: all go back to the
        plain free list (as _release would send them), num_dead of them counted as cached-free."""
        table = seq.block_table
        rc = self.ref_counts
        for block_id in table:
            rc[block_id] = 0
        self.free_ids.extend(reversed(table))
        self.num_dead_free += num_dead
        self.num_used_blocks -= len(table)
        seq.block_table = []
        seq.num_registered_blocks = 0

    # -- swap space ---------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self.cpu_free_ids)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move seq's blocks to CPU; returns (gpu_block, cpu_block) copies to make."""
        n = len(seq.block_table)
        if n > len(self.cpu_free_ids):
            raise RuntimeError(f"request {seq.request_id!r}: swap space has {len(self.cpu_free_ids)} free "
                               f"CPU blocks, needs {n} (check can_swap_out first)")
        mapping = []
        cpu_table = []
        for gpu_block in seq.block_table:
            cpu_block = self.cpu_free_ids.popleft()
            cpu_table.append(cpu_block)
            mapping.append((gpu_block, cpu_block))
        self.free(seq)
        self.cpu_tables[seq.request_id] = cpu_table
        return mapping

    def can_swap_in(self, seq: Sequence) -> bool:
        return len(self.cpu_tables[seq.request_id]) <= self.num_free_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring seq's blocks back to fresh GPU blocks; returns (cpu_block, gpu_block) copies."""
        cpu_table = self.cpu_tables.pop(seq.request_id)
        if len(cpu_table) > self.num_free_blocks:
            self.cpu_tables[seq.request_id] = cpu_table
            raise RuntimeError(f"request {seq.request_id!r}: swap-in needs {len(cpu_table)} GPU blocks, "
                               f"{self.num_free_blocks} free (check can_swap_in first)")
        mapping = []
        for cpu_block in cpu_table:
            gpu_block = self.take_block()
            seq.block_table.append(gpu_block)
            mapping.append((cpu_block, gpu_block))
            self.cpu_free_ids.append(cpu_block)
        self.register_computed_blocks(seq)
        return mapping

    def drop_swapped(self, seq: Sequence) -> None:
        """Return a swapped-out sequence's CPU blocks to the swap space (it will never be swapped in)."""
        self.cpu_free_ids.extend(self.cpu_tables.pop(seq.request_id))

    # -- invariants (tests and debugging) -------------------------------------------
    def check_invariants(self, live_seqs=()) -> None:
        """Raise AssertionError if the allocator's bookkeeping is inconsistent.

        live_seqs: every sequence currently holding GPU blocks (to check ref counts).
        """
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a block is twice in the free list"
        assert 0 <= self.num_dead_free <= len(free), "more dead cached-free blocks than free ones"
        cached = {b for b in range(self.num_kvcache_blocks) if self.ref_counts[b] == 0 and self.block_hash[b] != -1}
        used = {b for b in range(self.num_kvcache_blocks) if self.ref_counts[b] > 0}
        assert not (free & cached) and not (free & used), "a free block is also cached or in use"
        assert len(cached) == len(self.eviction), "eviction policy disagrees on the cached-free set"
        assert len(used) == self.num_used_blocks, "used-block counter drifted"
        assert len(free) + len(cached) + len(used) == self.num_kvcache_blocks, "free + cached + used != total"
        assert all(rc >= 0 for rc in self.ref_counts), "negative ref count"
        for b in free:
            assert self.block_hash[b] == -1, "a plain free block still has a hash"
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h, "hash table points at a block with another hash"
        refs = [0] * self.num_kvcache_blocks
        for seq in live_seqs:
            assert len(set(seq.block_table)) == len(seq.block_table), f"{seq.request_id!r} holds a block twice"
            for b in seq.block_table:
                refs[b] += 1
        if live_seqs is not None:
            assert refs == self.ref_counts, "ref counts differ from the block tables of live sequences"
        cpu_held = [b for t in self.cpu_tables.values() for b in t]
        assert len(cpu_held) == len(set(cpu_held)), "a CPU block is owned twice"
        assert len(cpu_held) + len(self.cpu_free_ids) == self.num_cpu_blocks, "swap space over-committed or leaked"
        if self.cpu_cache is not None:
            self.cpu_cache.check_invariants()
            assert self.num_dead_free == 0, "dead blocks on the plain free list with a CPU tier"
            for c, g in self.tier_in:
                assert self.ref_counts[g] > 0, "a GPU block loaded this step is not held"
                assert self.cpu_cache.block_key[c] == self.block_hash[g], \
                    "a GPU block loaded this step holds another key than its tier block"
