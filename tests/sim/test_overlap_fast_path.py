"""The overlap loop's decode fast path (sim/fast_path.py, Simulator._overlap_fast) is exact: the same
per-request and per-step tables as the overlap loop stepping one at a time (fast_path=False), across
policies, arrivals, memory pressure, prefix caching, replicas and cost models with and without a host share."""
import pandas as pd
import pytest

from engine.core.scheduler import Scheduler, SchedulerConfig
from sim.cost_model import ConstantCostModel, RooflineCostModel
from sim.cost_model.calibrated import CalibratedCostModel
from sim.replica import Replica
from sim.simulator import Simulator
from tests.sim.test_fast_path import ARRIVALS, FAST_OK, wl

# a fit with a device model: host seconds before the launch and after the tokens in every step
PROFILE = "benchmarks/results/generalize/chunk_grid/profile_h200_chunk_grid.json"


def roofline():
    return RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=2e-3, max_model_len=512)


def simulate(workload, policy_cls, fast, cost_model, *, blocks=400, prefix=True, replicas=1, router=None,
             cpu_cache_blocks=0):
    reps = []
    for _ in range(replicas):
        cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_num_seqs=32, max_model_len=512,
                              max_num_batched_tokens=512, num_cpu_blocks=200, enable_prefix_caching=prefix,
                              cpu_cache_num_blocks=cpu_cache_blocks)
        reps.append(Replica(Scheduler(cfg, policy_cls()), cost_model, overlap_scheduling=True))
    res = Simulator(reps, router, fast_path=fast, vocab_size=50).run(workload)
    return res, res.requests.sort_values(["replica", "request_id"], ignore_index=True), res.steps


def assert_same(workload, policy_cls, cost_model, **kw):
    slow, slow_req, slow_steps = simulate(workload, policy_cls, False, cost_model, **kw)
    fast, fast_req, fast_steps = simulate(workload, policy_cls, True, cost_model, **kw)
    assert slow.num_fast_steps == 0
    pd.testing.assert_frame_equal(fast_req, slow_req, rtol=1e-9)
    pd.testing.assert_frame_equal(fast_steps, slow_steps, rtol=1e-9)
    assert fast.end_time_s == pytest.approx(slow.end_time_s, rel=1e-12)
    assert fast.replicas[0].scheduler.num_in_flight == 0
    return slow, fast


@pytest.mark.parametrize("policy", FAST_OK, ids=lambda c: c.name)
@pytest.mark.parametrize("arrival", ["poisson", "all_at_once"], ids=str)
@pytest.mark.parametrize("prefix", [False, True], ids=["no_prefix_cache", "prefix_cache"])
def test_matches_the_loop_step_by_step(policy, arrival, prefix):
    _, fast = assert_same(wl(ARRIVALS[arrival]), policy, roofline(), prefix=prefix)
    assert fast.num_fast_steps > fast.num_steps // 10          # the fast path was really exercised


@pytest.mark.parametrize("policy", FAST_OK, ids=lambda c: c.name)
@pytest.mark.parametrize("prefix", [False, True], ids=["no_prefix_cache", "prefix_cache"])
def test_under_memory_pressure(policy, prefix):
    # 40 blocks for requests of up to 320 tokens: admission stalls, evictions of cached blocks, preemptions
    slow, fast = assert_same(wl(ARRIVALS["bursty"], prompt=(64, 200), output=(40, 120)), policy, roofline(),
                             blocks=40, prefix=prefix)
    assert fast.num_fast_steps > 0 and (fast.requests["status"] == "finished").all()
    if policy.name == "vllm":
        assert fast.steps["num_preempted"].sum() > 0


@pytest.mark.parametrize("blocks", [400, 40])
@pytest.mark.parametrize("policy", ["fcfs", "vllm_swap"])
def test_with_a_host_share(policy, blocks):
    """A calibrated fit with a device model: every step has host seconds before its launch and after its
    tokens, so the rows are the overlap recursion's, not the step times."""
    cls = next(c for c in FAST_OK if c.name == policy)
    cm = CalibratedCostModel.load(PROFILE)
    assert cm.device_model is not None
    slow, fast = assert_same(wl(ARRIVALS["poisson"], prompt=(64, 200), output=(40, 120)), cls, cm, blocks=blocks)
    assert fast.num_fast_steps > 0
    dur = fast.steps["duration_s"].to_numpy()
    assert not (abs(dur - cm.predict_table(fast.steps)) < 1e-12).all()      # rows are not the steps' own times


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding_tokens", "prefix_affinity"])
def test_replicas_and_routers(router):
    """Routers that read replica state too: every fast step's tokens reach the host before the next arrival."""
    cls = next(c for c in FAST_OK if c.name == "vllm")
    _, fast = assert_same(wl(ARRIVALS["poisson"], n=150), cls, roofline(), replicas=3, router=router)
    assert fast.num_fast_steps > 0
    assert (fast.requests["replica"].value_counts() > 10).all()      # every replica served


def test_with_a_cpu_tier():
    cls = next(c for c in FAST_OK if c.name == "vllm")
    _, fast = assert_same(wl(ARRIVALS["poisson"], prompt=(64, 200), output=(40, 120)), cls, roofline(),
                          blocks=40, cpu_cache_blocks=100)
    assert fast.num_fast_steps > 0


def test_a_model_without_decode_parts_steps_one_at_a_time():
    class SplitConstant(ConstantCostModel):
        def overlap_parts_s(self, batch):           # a host share, with no decode_overlap_parts_lists of its own
            return 0.2 * self.step_s, 0.6 * self.step_s, 0.2 * self.step_s

    cm = SplitConstant(step_s=0.01)
    assert cm.decode_overlap_parts_lists(4, 100, 3) is None
    cls = next(c for c in FAST_OK if c.name == "fcfs")
    slow, fast = assert_same(wl(ARRIVALS["poisson"]), cls, cm)
    assert fast.num_fast_steps == 0


def test_decode_parts_are_overlap_parts_of_each_batch():
    """decode_overlap_parts_lists gives what overlap_parts_s gives each decode step's batch (to the last bits of
    a float: the lists are vectorized, as decode_step_times_list is)."""
    from engine.core.batch import Batch
    cm = CalibratedCostModel.load(PROFILE)
    n, s0, k, m0 = 6, 6 * 300, 5, 700
    lists = cm.decode_overlap_parts_lists(n, s0, k, m0)
    for i in range(k):
        ctx = [(s0 + i * n - (m0 + i)) // (n - 1)] * (n - 1)
        ctx.append(s0 + i * n - sum(ctx))
        assert max(ctx) == m0 + i
        batch = Batch(seqs=[object()] * n, num_new_tokens=[1] * n, context_lens=ctx, num_prefill_seqs=0)
        assert [p[i] for p in lists] == pytest.approx(list(cm.overlap_parts_s(batch)), rel=1e-12, abs=1e-18)
