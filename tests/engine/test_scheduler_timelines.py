"""Exact step-by-step timelines for small hand-worked scenarios (fcfs and vllm).

Clock: one time unit per step; every request arrives at t=0 unless stated.
Each timeline entry lists (request_id, tokens computed) for one step, prefills first.
"""
import pytest

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SequenceStatus
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.vllm import VLLMPolicy
from tests.helpers import make_seq, run_timeline


def tiny(num_blocks, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("max_num_batched_tokens", 64)
    kw.setdefault("max_model_len", 16)
    kw.setdefault("enable_prefix_caching", False)
    return SchedulerConfig(num_kvcache_blocks=num_blocks, **kw)


def test_vllm_preempts_newest_and_recomputes():
    # 3 blocks of 4 slots. A and B: prompt 4, 4 outputs (footprint 2 blocks each).
    # step 1: both prefill (1 block each, 1 left). step 2: A takes the last block for
    # position 4; B needs one too -> B (newest) is preempted and its block freed.
    # steps 3-4: B's recompute needs 2 blocks (4 prompt + 1 output), only 1 free: A
    # decodes alone and finishes at step 4 (4 outputs). step 5: B re-prefills 5 tokens,
    # steps 6-7 decode to its 4th output.
    a, b = make_seq("A", 4, 4), make_seq("B", 4, 4)
    sched = Scheduler(tiny(3), VLLMPolicy())
    timeline = run_timeline(sched, [a, b])
    assert timeline == [
        [("A", 4), ("B", 4)],
        [("A", 1)],
        [("A", 1)],
        [("A", 1)],
        [("B", 5)],
        [("B", 1)],
        [("B", 1)],
    ]
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert a.finish_time_s == 4.0 and b.finish_time_s == 7.0
    assert b.first_token_time_s == 1.0            # the first token survives the preemption
    assert len(b.output_token_ids) == 4


def test_fcfs_blocks_head_of_line_and_never_preempts():
    # Same requests. fcfs reserves A's whole footprint (2 blocks); B's 2 blocks do not
    # fit in the 3 - 1 (allocated) - 1 (A's reserved growth) = 1 left, so B waits for A.
    a, b = make_seq("A", 4, 4), make_seq("B", 4, 4)
    sched = Scheduler(tiny(3), FCFSPolicy())
    timeline = run_timeline(sched, [a, b])
    assert timeline == [
        [("A", 4)], [("A", 1)], [("A", 1)], [("A", 1)],
        [("B", 4)], [("B", 1)], [("B", 1)], [("B", 1)],
    ]
    assert a.num_preemptions == b.num_preemptions == 0
    assert b.first_scheduled_time_s == 4.0


def test_fcfs_large_head_blocks_small_followers():
    # 4 blocks. L: prompt 8 + 8 outputs = 4 blocks, the whole cache. S1, S2 arrive at t=1
    # with 1-block footprints; they wait behind L although vllm would run them at once.
    big = make_seq("L", 8, 8)
    s1, s2 = make_seq("S1", 2, 2, arrival_time_s=1), make_seq("S2", 2, 2, arrival_time_s=1)
    fcfs_tl = run_timeline(Scheduler(tiny(4), FCFSPolicy()), [big, s1, s2])
    assert fcfs_tl[:8] == [[("L", 8)]] + [[("L", 1)]] * 7
    assert fcfs_tl[8:] == [[("S1", 2), ("S2", 2)], [("S1", 1), ("S2", 1)]]

    big, s1, s2 = make_seq("L", 8, 8), make_seq("S1", 2, 2, arrival_time_s=1), make_seq("S2", 2, 2, arrival_time_s=1)
    vllm_tl = run_timeline(Scheduler(tiny(4), VLLMPolicy()), [big, s1, s2])
    # t=1: the small ones are admitted (prefill-first step), so L pauses one step.
    assert vllm_tl[0] == [("L", 8)]
    assert vllm_tl[1] == [("S1", 2), ("S2", 2)]


def test_chunked_prefill_mixes_decodes_and_chunks():
    # Budget 8 tokens per step. A: 10-token prompt, B: 3-token prompt, 2 outputs each.
    # step 1: A's first chunk of 8 fills the budget. step 2: A's last 2 tokens + B's 3
    # (both sample their first token). step 3: both decode their 2nd token.
    a, b = make_seq("A", 10, 2), make_seq("B", 3, 2)
    cfg = tiny(16, max_num_batched_tokens=8, max_model_len=16, enable_chunked_prefill=True)
    timeline = run_timeline(Scheduler(cfg, VLLMPolicy()), [a, b])
    assert timeline == [[("A", 8)], [("A", 2), ("B", 3)], [("A", 1), ("B", 1)]]
    assert a.first_token_time_s == 2.0 and b.first_token_time_s == 2.0


def test_chunked_prefill_decodes_go_first():
    # B is decoding when long A arrives; each step B's decode is served before A's chunk.
    b = make_seq("B", 2, 4)
    a = make_seq("A", 12, 1, arrival_time_s=1)
    cfg = tiny(16, max_num_batched_tokens=8, max_model_len=16, enable_chunked_prefill=True)
    timeline = run_timeline(Scheduler(cfg, VLLMPolicy()), [b, a])
    assert timeline == [[("B", 2)], [("A", 7), ("B", 1)], [("A", 5), ("B", 1)], [("B", 1)]]


def test_max_num_seqs_caps_the_batch():
    seqs = [make_seq(i, 2, 2) for i in range(3)]
    timeline = run_timeline(Scheduler(tiny(16, max_num_seqs=2), VLLMPolicy()), seqs)
    assert timeline == [[(0, 2), (1, 2)], [(0, 1), (1, 1)], [(2, 2)], [(2, 1)]]


def test_prefix_cache_hit_skips_computed_blocks():
    # A's prompt has 2 full blocks (8 tokens); B repeats them and adds 2 tokens.
    # B arrives after A finished: its 2 blocks are cached-free and reused, so B computes 2.
    prefix = list(range(100, 108))
    a = make_seq("A", prefix, 1)
    b = make_seq("B", prefix + [7, 8], 1, arrival_time_s=2)
    sched = Scheduler(tiny(8, enable_prefix_caching=True), VLLMPolicy())
    timeline = run_timeline(sched, [a, b])
    assert timeline == [[("A", 8)], [], [("B", 2)]]
    assert b.num_cached_tokens == 8


def test_prefix_cache_shared_while_running():
    prefix = list(range(100, 108))
    a = make_seq("A", prefix, 4)
    b = make_seq("B", prefix + [9], 2, arrival_time_s=1)
    sched = Scheduler(tiny(8, enable_prefix_caching=True), VLLMPolicy())
    pending = [a, b]
    sched.add(a)
    sched.postprocess(batch := sched.schedule(0.0), [0], 1.0)
    sched.add(b)
    batch = sched.schedule(1.0)
    assert [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)] == [("B", 1)]
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared
    assert [sched.block_manager.ref_counts[x] for x in shared] == [2, 2]
    sched.block_manager.check_invariants(sched.running)
    del pending


def test_hash_collision_is_caught_by_token_check():
    sched = Scheduler(tiny(8, enable_prefix_caching=True), VLLMPolicy())
    sched.block_manager.hash_fn = lambda tokens, parent: 42    # every block collides
    a = make_seq("A", list(range(8)), 1)
    b = make_seq("B", list(range(50, 58)) + [1], 1, arrival_time_s=2)
    timeline = run_timeline(sched, [a, b])
    assert timeline == [[("A", 8)], [], [("B", 9)]]        # no false hit: B computes everything
    assert b.num_cached_tokens == 0


def test_recompute_after_preemption_reuses_own_blocks():
    # With prefix caching on, B's preempted full blocks stay cached-free; its recompute
    # finds its first block again and computes only the rest.
    a, b = make_seq("A", 4, 4), make_seq("B", 4, 4)
    sched = Scheduler(tiny(3, enable_prefix_caching=True), VLLMPolicy())
    timeline = run_timeline(sched, [a, b])
    assert timeline[4] == [("B", 1)]
    assert b.num_preemptions == 1


@pytest.mark.parametrize("prompt,max_tokens,reason", [
    (10, 10, "exceeds max_model_len"),
    (12, 4, "KV blocks at completion"),
])
def test_impossible_requests_are_rejected_and_run_goes_on(prompt, max_tokens, reason):
    bad, good = make_seq("bad", prompt, max_tokens), make_seq("ok", 2, 2)
    sched = Scheduler(tiny(3), VLLMPolicy())
    assert sched.add(bad) is False
    assert bad.status is SequenceStatus.REJECTED and reason in bad.reject_reason
    run_timeline(sched, [good])
    assert good.status is SequenceStatus.FINISHED


@pytest.mark.parametrize("kwargs,field", [
    (dict(block_size=12), "block_size"),
    (dict(max_num_batched_tokens=2), "max_num_batched_tokens"),
    (dict(num_kvcache_blocks=0), "num_kvcache_blocks"),
    (dict(max_num_seqs=0), "max_num_seqs"),
])
def test_bad_config_names_the_field(kwargs, field):
    base = dict(num_kvcache_blocks=8, block_size=4, max_num_batched_tokens=64, max_model_len=16)
    base.update(kwargs)
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**base)


def test_budget_below_max_model_len_needs_chunking():
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        Scheduler(SchedulerConfig(num_kvcache_blocks=8, block_size=4, max_num_batched_tokens=8, max_model_len=16))


def test_swap_mode_needs_swap_space():
    class SwapPolicy(VLLMPolicy):
        preemption_mode = "swap"
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        Scheduler(tiny(4), SwapPolicy())


def test_swap_preemption_copies_blocks_out_and_back():
    class SwapPolicy(VLLMPolicy):
        preemption_mode = "swap"
    a, b = make_seq("A", 4, 4), make_seq("B", 4, 4)
    sched = Scheduler(tiny(3, num_cpu_blocks=4), SwapPolicy())
    sched.add(a), sched.add(b)
    copies = []
    t = 0
    while sched.has_unfinished():
        batch = sched.schedule(t)
        copies.append((list(batch.swap_out), list(batch.swap_in)))
        sched.postprocess(batch, [0] * len(batch.seqs), t + 1)
        sched.block_manager.check_invariants(sched.running)
        t += 1
    outs = [c for c in copies if c[0]]
    ins = [c for c in copies if c[1]]
    assert len(outs) == 1 and len(ins) == 1
    assert len(outs[0][0]) == 1 and len(ins[0][1]) == 1        # B held one block when swapped
    assert b.num_swaps == 1 and len(b.output_token_ids) == 4
    assert sched.block_manager.num_cpu_free_blocks == 4
