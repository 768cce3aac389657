"""Overlap scheduling on the CPU engine (docs/overlap.md): the same tokens and finish reasons as the
synchronous loop, for greedy and seeded sampling, finishes by max_tokens and by EOS, preemption by
recompute and by swap, prefix caching, chunked prefill and aborts between steps; no block leaks; and
the simulator with overlap makes the engine's scheduling decisions."""
import random
from collections import Counter

import pytest

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.core.sequence import SamplingParams, Sequence
from engine.llm import LLM
from policies.scheduling.vllm import VLLMPolicy
from sim.cost_model import ConstantCostModel
from sim.simulator import Replica, Simulator
from tests.engine.tiny_model import make_tiny_qwen3


class SwapVLLM(VLLMPolicy):
    preemption_mode = "swap"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3_overlap")
    make_tiny_qwen3(path)
    return path


def _prompts(seed, lengths, vocab=500):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def _greedy(max_tokens, ignore_eos=True):
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=ignore_eos) for m in max_tokens]


def _run(path, prompts, params, overlap, eos=None, policy=None, **options):
    """(token ids, finish reason) per prompt, after checking the block manager for leaks."""
    llm = LLM(path, overlap_scheduling=overlap, policy=policy, **options)
    if eos is not None:
        llm.eos_token_id = eos          # a token the tiny model emits, so that requests end by EOS
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert not llm.has_unfinished() and llm._in_flight is None
    bm = llm.scheduler.block_manager
    bm.check_invariants([])
    assert bm.num_used_blocks == 0 and bm.num_cpu_free_blocks == bm.num_cpu_blocks
    return [(o.token_ids, o.finish_reason) for o in outs], outs


def _same_both_ways(path, prompts, params, **options):
    sync, _ = _run(path, prompts, params, False, **options)
    over, outs = _run(path, prompts, params, True, **options)
    assert over == sync
    return outs


def test_greedy_mixed_lengths_finish_by_length(ckpt):
    prompts = _prompts(0, [5, 40, 17, 1, 33, 64, 16])
    outs = _same_both_ways(ckpt, prompts, _greedy([12, 7, 20, 9, 16, 5, 11]), num_kvcache_blocks=64,
                           max_model_len=128)
    assert [len(o.token_ids) for o in outs] == [12, 7, 20, 9, 16, 5, 11]


def test_seeded_sampling(ckpt):
    prompts = _prompts(1, [9, 30, 4, 22])
    params = [SamplingParams(temperature=0.9, top_k=k, max_tokens=m, ignore_eos=True, seed=s)
              for k, m, s in ((0, 14, 1), (20, 9, 2), (0, 17, 3), (5, 11, 4))]
    _same_both_ways(ckpt, prompts, params, num_kvcache_blocks=64, max_model_len=128)


def test_finish_by_eos_discards_the_extra_token(ckpt):
    prompts = _prompts(2, [7, 25, 13, 40, 3])
    free_run, _ = _run(ckpt, prompts, _greedy([24] * 5), False, num_kvcache_blocks=64, max_model_len=128)
    # the token most outputs emit after their first few: several requests stop on it mid-generation
    eos = Counter(t for ids, _ in free_run for t in ids[3:]).most_common(1)[0][0]
    outs = _same_both_ways(ckpt, prompts, _greedy([24] * 5, ignore_eos=False), eos=eos, num_kvcache_blocks=64,
                           max_model_len=128)
    reasons = [o.finish_reason for o in outs]
    assert "eos" in reasons
    for o in outs:
        if o.finish_reason == "eos":
            assert o.token_ids[-1] == eos and eos not in o.token_ids[:-1]


@pytest.mark.parametrize("policy, options", [
    (None, dict(num_kvcache_blocks=10)),
    (SwapVLLM(), dict(num_kvcache_blocks=10, num_cpu_blocks=40)),
], ids=["recompute", "swap"])
def test_preemption_under_memory_pressure(ckpt, policy, options):
    prompts = _prompts(3, [20, 30, 25, 12, 28, 17])
    outs = _same_both_ways(ckpt, prompts, _greedy([20] * 6), policy=policy, max_model_len=64, **options)
    assert sum(o.num_preemptions for o in outs) > 0


def test_preemption_with_eos_finishes(ckpt):
    prompts = _prompts(4, [20, 30, 25, 12, 28, 17])
    free_run, _ = _run(ckpt, prompts, _greedy([20] * 6), False, num_kvcache_blocks=64, max_model_len=64)
    eos = Counter(t for ids, _ in free_run for t in ids[5:]).most_common(1)[0][0]
    for policy, extra in ((None, {}), (SwapVLLM(), dict(num_cpu_blocks=40))):
        outs = _same_both_ways(ckpt, prompts, _greedy([20] * 6, ignore_eos=False), eos=eos, policy=policy,
                               num_kvcache_blocks=10, max_model_len=64, **extra)
        assert "eos" in [o.finish_reason for o in outs]


def test_prefix_caching_and_chunked_prefill(ckpt):
    base = _prompts(5, [40])[0]
    tails = _prompts(6, [3, 9, 20, 1])
    waves = [[base], [base + t for t in tails] + _prompts(7, [50, 7])]     # the second wave hits the first's blocks
    params = [_greedy([5]), _greedy([10, 6, 12, 8, 9, 11])]
    for options in (dict(), dict(enable_chunked_prefill=True, max_num_batched_tokens=16)):
        runs = []
        for overlap in (False, True):
            llm = LLM(ckpt, num_kvcache_blocks=64, max_model_len=128, overlap_scheduling=overlap, **options)
            outs = [o for w, p in zip(waves, params) for o in llm.generate(w, p, use_tqdm=False)]
            llm.scheduler.block_manager.check_invariants([])
            runs.append([(o.token_ids, o.finish_reason, o.num_cached_tokens) for o in outs])
        assert runs[0] == runs[1]
        assert sum(r[2] for r in runs[1]) >= 4 * 32


def test_abort_between_steps(ckpt):
    prompts = _prompts(8, [10, 24, 6, 15])
    results = []
    for overlap in (False, True):
        llm = LLM(ckpt, num_kvcache_blocks=64, max_model_len=128, overlap_scheduling=overlap)
        for i, (p, sp) in enumerate(zip(prompts, _greedy([16, 16, 3, 16]))):
            llm.add_request(p, sp, request_id=i)
        done, steps = {}, 0
        while llm.has_unfinished():
            for out in llm.step():
                done[out.request_id] = (out.token_ids, out.finish_reason)
            steps += 1
            if steps == 4:
                assert llm.abort_request(1) and not llm.abort_request(2)    # 2 finished by then (3 tokens)
        assert 1 not in done
        llm.scheduler.block_manager.check_invariants([])
        assert llm.scheduler.block_manager.num_used_blocks == 0
        results.append(done)
    assert results[0] == results[1]


def test_step_rows_tile_the_timeline(ckpt):
    ticks = iter(range(10_000))
    llm = LLM(ckpt, num_kvcache_blocks=32, max_model_len=128, overlap_scheduling=True,
              clock=lambda: float(next(ticks)))
    for i, p in enumerate(_prompts(9, [9, 4])):
        llm.add_request(p, _greedy([4])[0], request_id=i, arrival_time_s=0.0)
    rows = []
    while llm.has_unfinished():
        llm.step_batch()
        if llm.last_step is not None:
            rows.append(llm.last_step)
    assert len(rows) == 4           # one prefill step of both, three decode steps
    for a, b in zip(rows, rows[1:]):
        assert b.start_s == a.start_s + a.duration_s and b.duration_s > 0


def test_tensor_parallel_is_refused():
    with pytest.raises(ValueError, match="overlap_scheduling needs tensor_parallel_size=1"):
        EngineConfig("ckpt", overlap_scheduling=True, tensor_parallel_size=2)


@pytest.mark.parametrize("blocks", [64, 9])
def test_simulator_with_overlap_makes_the_engines_decisions(ckpt, blocks):
    """All requests at t=0 under FCFS: no decision depends on time, so the engine's step sequence and the
    simulator's are equal with overlap on; at 9 blocks, finishing sequences holding their blocks one step
    longer change the sequence against the synchronous one."""
    prompts = _prompts(10, [20, 30, 25, 12, 28, 17, 9])
    max_tokens = [20, 6, 14, 20, 9, 20, 11]
    shapes = {}
    for overlap in (False, True):
        llm = LLM(ckpt, num_kvcache_blocks=blocks, max_model_len=64, enable_prefix_caching=False,
                  overlap_scheduling=overlap)
        for i, (p, sp) in enumerate(zip(prompts, _greedy(max_tokens))):
            llm.add_request(p, sp, request_id=i, arrival_time_s=0.0)
        engine_steps = []
        while llm.has_unfinished():
            llm.step_batch()
            s = llm.last_step
            if s is not None:
                engine_steps.append((s.num_prefill_tokens, s.num_decode_seqs, s.num_preempted))
        sched = Scheduler(llm.scheduler.config)
        seqs = [Sequence(i, p, SamplingParams(max_tokens=m, ignore_eos=True)) for i, (p, m)
                in enumerate(zip(prompts, max_tokens))]
        sim = Simulator(Replica(sched, ConstantCostModel(step_s=0.01), overlap_scheduling=overlap), fast_path=False)
        sim.run(seqs)
        steps = sim.replicas[0].recorder.steps_frame()
        sim_steps = list(zip(steps["num_prefill_tokens"], steps["num_decode_seqs"], steps["num_preempted"]))
        assert sim_steps == engine_steps
        shapes[overlap] = engine_steps
    if blocks == 9:
        assert sum(s[2] for s in shapes[True]) > 0 and shapes[True] != shapes[False]


def test_padded_prefill_layout_takes_placeholders_on_the_device(ckpt):
    """Every step through the prefill graphs' padded buffers (uncaptured on CPU, as tests/engine/
    test_prefill_graphs.py does): the in-flight tokens are resolved in their device input ids."""
    prompts = _prompts(11, [50, 7, 23, 2, 30])
    params = _greedy([8, 12, 6, 10, 9])
    runs, resolved = [], []
    for overlap in (False, True):
        llm = LLM(ckpt, num_kvcache_blocks=64, max_model_len=128, enable_chunked_prefill=True,
                  max_num_batched_tokens=16, overlap_scheduling=overlap)
        graphs = llm.runner.make_prefill_graphs(capture=False)
        forward = graphs.forward

        def counted(step, size, resolve=None, forward=forward):
            resolved.append(resolve is not None)
            return forward(step, size, resolve) if resolve is not None else forward(step, size)

        graphs.forward = counted
        llm.runner.prefill_graphs = graphs
        runs.append([o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    assert runs[0] == runs[1] and any(resolved)
