"""The prefix cache's CPU tier: two-tier bookkeeping under random operations (hypothesis state machine),
with the KV content of every block modelled, so a hit that would serve wrong KV fails."""
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.cpu_cache import CpuPrefixCache
from engine.core.sequence import SamplingParams, Sequence
from policies.eviction.fifo import FIFOEviction
from policies.eviction.lfu import LFUEviction
from policies.eviction.lru import LRUEviction

BLOCK = 2
NUM_SWAP = 3


class TwoTierMachine(RuleBasedStateMachine):
    """Sequences over a 3-letter alphabet share prefixes often. Each op is one step: its tier copies are
    taken and applied in the executor's order (host reads, then GPU -> host, then host -> GPU), then the
    step's new tokens write their blocks. gpu[b] / host[c] hold the prefix whose KV the block holds."""

    def __init__(self):
        super().__init__()
        self.bm = None
        self.live: list[Sequence] = []
        self.gpu: dict[int, tuple] = {}
        self.host: dict[int, tuple] = {}
        self.n = 0

    @rule(gpu_policy=st.sampled_from([LRUEviction, FIFOEviction, LFUEviction]),
          cpu_policy=st.sampled_from([LRUEviction, FIFOEviction, LFUEviction]), cpu_blocks=st.integers(1, 8),
          max_offload=st.sampled_from([0, 1, 2, 512]))
    @precondition(lambda self: self.bm is None)
    def build(self, gpu_policy, cpu_policy, cpu_blocks, max_offload):
        self.bm = BlockManager(num_kvcache_blocks=8, block_size=BLOCK, eviction=gpu_policy(), num_cpu_blocks=NUM_SWAP,
                               cpu_cache_num_blocks=cpu_blocks, cpu_cache_eviction=cpu_policy(),
                               cpu_cache_max_offload_blocks=max_offload)

    def _end_step(self):
        out, inn = self.bm.take_tier_copies()
        assert len(out) <= self.bm.cpu_cache_max_offload_blocks
        assert len({c for _, c in out}) == len(out), "a host block written twice in one step"
        assert not ({c for _, c in out} & {c for c, _ in inn}), "a host block read after its write in one step"
        staged = [self.host.get(c) for c, _ in inn]
        for g, c in out:
            self.host[c] = self.gpu.get(g)
        for (_, g), content in zip(inn, staged):
            self.gpu[g] = content
        return out, inn

    def _write(self, seq, start_block):
        """The step's forward pass: KV of seq's full blocks from start_block on."""
        for i in range(start_block, seq.num_computed_tokens // BLOCK):
            self.gpu[seq.block_table[i]] = tuple(seq.token_ids[:(i + 1) * BLOCK])

    @precondition(lambda self: self.bm is not None)
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=9))
    def admit(self, tokens):
        bm = self.bm
        seq = Sequence(self.n, tokens, SamplingParams(max_tokens=4))
        self.n += 1
        hits = bm.find_cached_prefix(seq)
        fresh = -(-len(tokens) // BLOCK) - len(hits)
        if fresh + bm.num_hit_blocks_taken(hits) > bm.num_free_blocks:
            bm.take_tier_copies()
            return
        cpu_hits = sum(1 for b in hits if b < 0)
        bm.allocate_cached_prefix(seq, hits)
        assert bm.last_cpu_hit_blocks == cpu_hits
        assert all(b >= 0 for b in seq.block_table)
        bm.allocate(seq, len(tokens) - len(hits) * BLOCK)
        out, inn = self._end_step()
        assert len(inn) == cpu_hits
        for i in range(len(hits)):      # every hit, from either tier, holds exactly this prefix's KV
            assert self.gpu.get(seq.block_table[i]) == tuple(tokens[:(i + 1) * BLOCK]), (i, hits)
        seq.num_computed_tokens = len(tokens)
        self._write(seq, len(hits))
        bm.register_computed_blocks(seq)
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def grow(self, data, token):
        bm = self.bm
        seq = data.draw(st.sampled_from(self.live))
        seq.token_ids.append(token)
        if not bm.can_allocate(seq, 1):
            seq.token_ids.pop()
            return
        bm.allocate(seq, 1)
        out, inn = self._end_step()
        assert not inn
        seq.num_computed_tokens += 1
        self._write(seq, (seq.num_computed_tokens - 1) // BLOCK)
        bm.register_computed_blocks(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.free(seq)

    @invariant()
    def consistent(self):
        if self.bm is None:
            return
        bm = self.bm
        bm.check_invariants(self.live)
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_kvcache_blocks
        cpu = bm.cpu_cache
        assert not cpu.pinned, "pinned tier blocks outlived their step"
        for key, c in cpu.key_to_block.items():     # every keyed tier block holds its key's KV
            assert self.host.get(c) is not None
            assert cpu.block_tokens[c] == self.host[c][-BLOCK:]


TestTwoTier = TwoTierMachine.TestCase
TestTwoTier.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


def _computed(bm, rid, tokens):
    seq = Sequence(rid, tokens, SamplingParams(max_tokens=1))
    bm.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    bm.register_computed_blocks(seq)
    return seq


def test_evicted_block_is_offloaded_then_loaded_back_on_a_hit():
    bm = BlockManager(num_kvcache_blocks=2, block_size=2, cpu_cache_num_blocks=2)
    a = _computed(bm, "a", [1, 2, 3, 4])
    bm.free(a)                                  # both blocks cached-free on the GPU
    b = _computed(bm, "b", [7, 7])              # evicts a's tail block: offloaded
    out, inn = bm.take_tier_copies()
    assert len(out) == 1 and not inn and len(bm.cpu_cache) == 1
    bm.free(b)
    c = Sequence("c", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1))
    hits = bm.find_cached_prefix(c)
    assert hits[0] >= 0 and hits[1] < 0         # first block on the GPU, second in the CPU tier
    bm.allocate_cached_prefix(c, hits)
    out, inn = bm.take_tier_copies()
    assert [h for h, _ in inn] == [out_host for _, out_host in out] or len(inn) == 1
    assert inn[0][1] == c.block_table[1] and c.num_computed_tokens == 4
    bm.check_invariants([c])


def test_off_by_default_and_needs_the_gpu_prefix_cache():
    bm = BlockManager(num_kvcache_blocks=4)
    assert bm.cpu_cache is None and bm.take_tier_copies() == ([], [])
    with pytest.raises(ValueError, match="cpu_cache_num_blocks=4 needs the GPU prefix cache"):
        BlockManager(num_kvcache_blocks=4, enable_prefix_caching=False, cpu_cache_num_blocks=4)
    with pytest.raises(ValueError, match="cpu_cache_num_blocks must be >= 0"):
        BlockManager(num_kvcache_blocks=4, cpu_cache_num_blocks=-1)


def test_a_block_stored_this_step_is_not_hit_before_the_next():
    tier = CpuPrefixCache(2)
    c = tier.store(5, (1, 2))
    assert tier.lookup(5, (1, 2)) is None       # its copy is in flight
    tier.unpin_all()
    assert tier.lookup(5, (1, 2)) == c and tier.lookup(5, (9, 9)) is None     # token check on content hashes


def test_offloads_beyond_the_step_budget_are_dropped():
    bm = BlockManager(num_kvcache_blocks=4, block_size=2, cpu_cache_num_blocks=8, cpu_cache_max_offload_blocks=1)
    a = _computed(bm, "a", [1, 2, 3, 4, 5, 6])
    bm.free(a)                                  # three cached-free blocks
    b = _computed(bm, "b", [7, 7, 8, 8, 9, 9])  # takes the plain free one, evicts two
    out, _ = bm.take_tier_copies()
    assert len(out) == 1 and bm.num_offloads_dropped == 1 and len(bm.cpu_cache) == 1
    bm.check_invariants([b])
