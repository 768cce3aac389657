"""Block manager invariants under random operation sequences (hypothesis state machine)."""
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.sequence import SamplingParams, Sequence
from policies.eviction.lru import LRUEviction

BLOCK = 2


class BlockManagerMachine(RuleBasedStateMachine):
    """Sequences from a 3-letter alphabet share prefixes often; ops: admit (with prefix
    lookup), grow, free, swap out, swap in."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_kvcache_blocks=12, block_size=BLOCK, eviction=LRUEviction(), num_cpu_blocks=6)
        self.live: list[Sequence] = []       # holding GPU blocks
        self.swapped: list[Sequence] = []
        self.n = 0

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=9))
    def admit(self, tokens):
        seq = Sequence(self.n, tokens, SamplingParams(max_tokens=4))
        self.n += 1
        hits = self.bm.find_cached_prefix(seq)
        for i, b in enumerate(hits):     # every hit serves exactly the requested tokens
            assert self.bm.block_tokens[b] == tuple(tokens[i * BLOCK:(i + 1) * BLOCK])
        revived = sum(1 for b in hits if self.bm.ref_counts[b] == 0)
        covered = len(hits) * BLOCK
        fresh = -(-len(tokens) // BLOCK) - len(hits)
        if fresh + revived > self.bm.num_free_blocks:
            return
        self.bm.allocate_cached_prefix(seq, hits)
        assert seq.num_computed_tokens == covered
        self.bm.allocate(seq, len(tokens) - covered)
        seq.num_computed_tokens = len(tokens)
        self.bm.register_computed_blocks(seq)
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def grow(self, data, token):
        seq = data.draw(st.sampled_from(self.live))
        seq.token_ids.append(token)
        if self.bm.can_allocate(seq, 1):
            self.bm.allocate(seq, 1)
            seq.num_computed_tokens += 1
            self.bm.register_computed_blocks(seq)
        else:
            seq.token_ids.pop()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.free(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(self.live))
        if not self.bm.can_swap_out(seq):
            return
        n = len(seq.block_table)
        mapping = self.bm.swap_out(seq)
        assert len(mapping) == n and seq.block_table == []
        self.live.remove(seq)
        self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        seq = data.draw(st.sampled_from(self.swapped))
        if not self.bm.can_swap_in(seq):
            return
        n = len(self.bm.cpu_tables[seq.request_id])
        mapping = self.bm.swap_in(seq)
        assert len(mapping) == n == len(seq.block_table)
        assert [dst for _, dst in mapping] == seq.block_table
        self.swapped.remove(seq)
        self.live.append(seq)

    @invariant()
    def consistent(self):
        self.bm.check_invariants(self.live)
        assert self.bm.num_free_blocks + self.bm.num_used_blocks == self.bm.num_kvcache_blocks

    def teardown(self):
        for seq in self.live:
            self.bm.free(seq)
        assert self.bm.num_used_blocks == 0 and all(rc == 0 for rc in self.bm.ref_counts)


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_check_invariants_detects_a_double_owner():
    bm = BlockManager(num_kvcache_blocks=4, block_size=2)
    seq = Sequence(0, [1, 2, 3], SamplingParams(max_tokens=1))
    bm.allocate(seq, 3)
    seq.block_table.append(seq.block_table[0])      # corrupt: one block listed twice
    try:
        bm.check_invariants([seq])
    except AssertionError:
        return
    raise AssertionError("corruption not detected")


def test_eviction_reclaims_cached_blocks_only_when_free_runs_out():
    bm = BlockManager(num_kvcache_blocks=3, block_size=2)
    a = Sequence("a", [1, 2, 3, 4], SamplingParams(max_tokens=1))
    bm.allocate(a, 4)
    a.num_computed_tokens = 4
    bm.register_computed_blocks(a)
    bm.free(a)
    assert bm.num_cached_free_blocks == 2 and len(bm.free_ids) == 1
    b = Sequence("b", [9, 9], SamplingParams(max_tokens=1))
    bm.allocate(b, 2)                       # takes the plain free block: cache intact
    assert bm.num_cached_free_blocks == 2
    c = Sequence("c", [8, 8], SamplingParams(max_tokens=1))
    bm.allocate(c, 2)                       # must evict: the tail block of a goes first
    assert bm.num_cached_free_blocks == 1
    d = Sequence("d", [1, 2, 5], SamplingParams(max_tokens=1))
    assert len(bm.find_cached_prefix(d)) == 1          # a's first block survived
    bm.check_invariants([b, c])
