"""The simulator's decode fast path is exact: the same per-request and per-step tables as one
scheduler step per event (fast_path=False), across workloads, policies, memory pressure and routers."""
import pandas as pd
import pytest

from engine.core.scheduler import Scheduler, SchedulerConfig
from experiments.workloads import AllAtOnce, Constant, Gamma, Poisson, Uniform, synthetic_workload
from policies.registry import SCHEDULING_POLICIES
from policies.scheduling.base import SchedulingPolicy
from policies.scheduling.vllm import VLLMPolicy
from sim.cost_model import ConstantCostModel, RooflineCostModel
from sim.fast_forward import DecodeChain
from sim.replica import Replica
from sim.simulator import Simulator

FAST_OK = [cls for cls in SCHEDULING_POLICIES.values() if cls.fast_forward_ok]
ARRIVALS = {"poisson": Poisson(rate_rps=40.0), "bursty": Gamma(rate_rps=40.0, cv=4.0), "all_at_once": AllAtOnce()}


def simulate(workload, policy_cls, fast, *, blocks=400, replicas=1, router=None, cost_model=None, cpu_blocks=200,
             prefix=True):
    reps = []
    for _ in range(replicas):
        cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_num_seqs=32, max_model_len=512,
                              max_num_batched_tokens=512, num_cpu_blocks=cpu_blocks, enable_prefix_caching=prefix)
        cm = cost_model or RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=2e-3, max_model_len=512)
        reps.append(Replica(Scheduler(cfg, policy_cls()), cm))
    sim = Simulator(reps, router, fast_path=fast, vocab_size=50)   # small vocab: some accidental block hits
    res = sim.run(workload)
    return res, res.requests.sort_values(["replica", "request_id"], ignore_index=True), res.steps


def assert_same(workload, policy_cls, **kw):
    slow, slow_req, slow_steps = simulate(workload, policy_cls, False, **kw)
    fast, fast_req, fast_steps = simulate(workload, policy_cls, True, **kw)
    assert slow.num_fast_steps == 0
    pd.testing.assert_frame_equal(fast_req, slow_req, rtol=1e-9)
    pd.testing.assert_frame_equal(fast_steps, slow_steps, rtol=1e-9)
    assert fast.end_time_s == pytest.approx(slow.end_time_s, rel=1e-12)
    assert fast.num_finished + fast.num_rejected == len(workload)
    return slow, fast


def wl(arrival, n=60, seed=0, prompt=(1, 200), output=(1, 120)):
    return synthetic_workload(n, arrival, Uniform(*prompt), Uniform(*output), seed=seed)


@pytest.mark.parametrize("policy", FAST_OK, ids=lambda c: c.name)
@pytest.mark.parametrize("arrival", list(ARRIVALS), ids=str)
def test_fast_path_matches_step_by_step(policy, arrival):
    _, fast = assert_same(wl(ARRIVALS[arrival]), policy)
    assert fast.num_fast_steps > fast.num_steps // 4         # the fast path was really exercised


@pytest.mark.parametrize("policy", FAST_OK, ids=lambda c: c.name)
@pytest.mark.parametrize("arrival", ["poisson", "all_at_once"], ids=str)
def test_fast_path_under_memory_pressure(policy, arrival):
    # 40 blocks of 16 tokens for requests of up to 320 tokens: admission stalls and (vllm) preemptions
    slow, fast = assert_same(wl(ARRIVALS[arrival], prompt=(64, 200), output=(40, 120)), policy, blocks=40)
    assert fast.num_fast_steps > 0
    req = fast.requests
    assert (req["status"] == "finished").all()
    if policy.name == "vllm":
        assert req["num_preemptions"].sum() > 0 and fast.steps["num_preempted"].sum() > 0


@pytest.mark.parametrize("policy", FAST_OK, ids=lambda c: c.name)
@pytest.mark.parametrize("blocks", [400, 40])
@pytest.mark.parametrize("prefix", [False, True], ids=["no_prefix_cache", "prefix_cache"])
def test_fast_calls_run_past_finishes(policy, blocks, prefix, monkeypatch):
    """With nothing waiting, one fast call runs past sequence finishes: all-at-once arrivals (the
    queue drains, then only finishes) and sparse Poisson ones, under memory pressure too (40 blocks:
    a chain stops before blocks its own finishes free). Policies serving in admission order plan the
    steps as one DecodeChain (with a prefix cache too, while the running sequences' blocks are private
    and unpublished); the others chain exact segments."""
    finishes, chains = [], []
    fast_forward, apply = Simulator._fast_forward, DecodeChain.apply

    def counting_fast_forward(self, *a):
        before = self.num_finished
        end = fast_forward(self, *a)
        finishes.append(self.num_finished - before)
        return end

    monkeypatch.setattr(Simulator, "_fast_forward", counting_fast_forward)
    monkeypatch.setattr(DecodeChain, "apply", lambda self, *a: chains.append(1) or apply(self, *a))
    for arrival in (AllAtOnce(), Poisson(rate_rps=5.0)):
        _, fast = assert_same(wl(arrival, prompt=(64, 200), output=(40, 120)), policy, blocks=blocks, prefix=prefix)
        assert fast.num_fast_steps > 0
    assert max(finishes) > 1                   # several sequences finished inside one call
    in_order = not policy.ranked and policy.order_running is SchedulingPolicy.order_running
    assert bool(chains) == in_order


def test_integer_times_arrivals_coincide_with_step_ends():
    # Constant 1 s steps and arrivals every 2 s: arrivals land exactly on step boundaries,
    # where "a step starting at t sees arrivals at t" must hold on both paths.
    for policy in FAST_OK:
        assert_same(wl(Constant(rate_rps=0.5), n=30, prompt=(1, 40), output=(1, 30)), policy,
                    cost_model=ConstantCostModel(step_s=1.0))


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding_tokens", "prefix_affinity"])
def test_fast_path_with_replicas_and_routers(router):
    for arrival in ("poisson", "bursty"):
        _, fast = assert_same(wl(ARRIVALS[arrival], n=80, seed=3), VLLMPolicy, replicas=3,
                              router=router, blocks=60)
        assert fast.num_fast_steps > 0
        assert fast.requests["replica"].nunique() == 3


SLOW_ONLY = [cls for cls in SCHEDULING_POLICIES.values() if not cls.fast_forward_ok]


@pytest.mark.parametrize("policy", SLOW_ONLY, ids=lambda c: c.name)
def test_policies_without_fast_forward_never_take_it(policy):
    _, fast = assert_same(wl(ARRIVALS["poisson"], n=30), policy)
    assert fast.num_fast_steps == 0
