"""The simulator's speed paths change nothing in the results: zero prompts without a prefix
cache, no step rows, the heap loop instead of SimPy, the roofline's list and batch shortcuts,
and the block manager's bulk allocation."""
import random
from collections import deque

import pandas as pd
import pytest

from engine.core.batch import Batch
from engine.core.block_manager import BlockManager
from engine.core.free_blocks import FreeBlockQueue
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from experiments.workloads import Poisson, Uniform, synthetic_workload
from sim.cost_model import RooflineCostModel
from sim.cost_model.base import CostModel
from sim.replica import Replica
from sim.simulator import Simulator


def replicas(n=1, prefix=False, blocks=300):
    cfg = dict(num_kvcache_blocks=blocks, block_size=16, max_num_seqs=32, max_model_len=512,
               max_num_batched_tokens=512, enable_prefix_caching=prefix)
    return [Replica(Scheduler(SchedulerConfig(**cfg)),
                    RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=2e-3, max_model_len=512)) for _ in range(n)]


def workload(n=80, seed=0):
    return synthetic_workload(n, Poisson(40.0), Uniform(1, 200), Uniform(1, 120), seed=seed)


def tables(res):
    return res.requests.sort_values(["replica", "request_id"], ignore_index=True), res.steps


def test_zero_prompts_give_the_tables_of_hashed_prompts_without_a_prefix_cache():
    wl = workload()
    a = Simulator(replicas(), prompt_ids="hashed").run(wl)
    b = Simulator(replicas(), prompt_ids="auto").run(wl)
    for x, y in zip(tables(a), tables(b)):
        pd.testing.assert_frame_equal(x, y)
    assert Simulator(replicas()).prompt_ids == "zeros"
    assert Simulator(replicas(prefix=True)).prompt_ids == "private"     # tests/sim/test_private_blocks.py
    with pytest.raises(ValueError, match="prompt_ids"):
        Simulator(replicas(), prompt_ids="random")


def test_record_steps_none_keeps_requests_and_counts():
    wl = workload()
    full = Simulator(replicas(2), "round_robin").run(wl)
    lean = Simulator(replicas(2), "round_robin", record_steps="none").run(wl)
    pd.testing.assert_frame_equal(tables(full)[0], lean.requests.sort_values(["replica", "request_id"],
                                                                             ignore_index=True))
    assert [r.recorder.num_steps for r in lean.replicas] == [r.recorder.num_steps for r in full.replicas]
    assert sum(r.recorder.num_steps for r in lean.replicas) == lean.num_steps == len(full.steps)
    with pytest.raises(ValueError, match="record_steps"):
        lean.steps
    with pytest.raises(ValueError, match="record_steps"):
        Simulator(replicas(), record_steps="sampled")


@pytest.mark.parametrize("n", [1, 3])
def test_heap_loop_matches_simpy(n):
    # until=1e9 ends after the last event either way but forces the SimPy event loop
    wl = workload(100, seed=2)
    direct = Simulator(replicas(n, blocks=60), "round_robin").run(wl)
    simpy_ = Simulator(replicas(n, blocks=60), "round_robin").run(wl, until=1e9)
    for x, y in zip(tables(direct), tables(simpy_)):
        pd.testing.assert_frame_equal(x, y)
    assert direct.end_time_s == max(direct.requests["finish_time_s"])


def test_roofline_list_durations_and_batch_pricing_equal_the_checked_paths():
    rng = random.Random(0)
    for eff, floors in ((1.0, False), (0.01, False), (1.0, True), (0.01, True)):
        # bytes-bound and FLOP-bound decode attention, with and without the latency floors (which the
        # short contexts below sit on)
        cm = RooflineCostModel("Qwen3-8B", "H200", overhead_s=2e-3, max_model_len=4096, attention_efficiency=eff,
                               per_seq_overhead_s=1e-5, latency_floors=floors)
        for _ in range(300):
            n, k = rng.randint(1, 64), rng.randint(1, 300)
            s0 = rng.randint(n, n * (4096 - k))
            assert cm.decode_step_times_list(n, s0, k) == cm.decode_step_times_s(n, s0, k).tolist()
        for _ in range(3000):
            p, d = rng.randint(0, 3), rng.randint(0, 4)
            seqs, new, ctx = [], [], []
            for i in range(p + d):
                length = rng.randint(1, 4200)
                seqs.append(Sequence(i, [0] * length, SamplingParams(max_tokens=5)))
                if i < p:
                    new.append(rng.randint(0, length + 1))
                    ctx.append(rng.randint(max(0, new[-1] - 1), length + 2))
                else:
                    new.append(rng.choice([1, 1, 2]))
                    ctx.append(rng.randint(0, length))
            batch = Batch(seqs=seqs, num_new_tokens=new, num_prefill_seqs=p, context_lens=ctx)
            outcomes = []
            for price in (CostModel.step_time_s, RooflineCostModel.step_time_s):
                try:
                    outcomes.append(price(cm, batch))
                except ValueError as e:       # invalid shapes must fail the same way
                    outcomes.append(type(e))
            assert outcomes[0] == outcomes[1]


def test_free_block_queue_is_a_fifo():
    q, ref = FreeBlockQueue(range(3000)), deque(range(3000))
    rng = random.Random(1)
    for _ in range(2000):
        op = rng.random()
        if op < 0.4 and len(ref) > 40:
            m = rng.randint(1, 40)
            assert q.take(m) == [ref.popleft() for _ in range(m)]
        elif op < 0.6 and ref:
            assert q.popleft() == ref.popleft()
        else:
            ids = [rng.randint(0, 10**6) for _ in range(rng.randint(1, 30))]
            q.extend(ids)
            ref.extend(ids)
        assert len(q) == len(ref) and list(q) == list(ref) and bool(q) == bool(ref)
    with pytest.raises(IndexError):
        FreeBlockQueue().popleft()


@pytest.mark.parametrize("prefix", [False, True])
def test_allocate_each_equals_allocate_in_order(prefix):
    def seqs():
        return [Sequence(i, [i] * (5 + 7 * i), SamplingParams(max_tokens=50)) for i in range(6)]
    a, b = BlockManager(64, 4, prefix), BlockManager(64, 4, prefix)
    sa, sb = seqs(), seqs()
    for bm, ss in ((a, sa), (b, sb)):
        for s in ss:
            bm.allocate(s, len(s.token_ids))
            s.num_computed_tokens = len(s.token_ids)
    a.allocate_each(sa, 6)
    for s in sb:
        b.allocate(s, 6)
    assert [s.block_table for s in sa] == [s.block_table for s in sb]
    assert a.ref_counts == b.ref_counts and list(a.free_ids) == list(b.free_ids)
    assert a.num_used_blocks == b.num_used_blocks
    a.check_invariants(sa)
    with pytest.raises(RuntimeError):
        a.allocate_each(sa, 500)          # more than the cache holds: the checked path raises
