"""Private blocks (Sequence.private_from, prompt_ids="private", the default with a prefix cache) give
exactly the tables of hashing every token of every block (prompt_ids="hashed"): with prefix sharing,
preemption by recompute and swap, evictions under memory pressure, each eviction policy, the fast
path on and off, and prompts past several KV blocks."""
import numpy as np
import pandas as pd
import pytest

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from experiments.workloads import Poisson, Uniform, Workload, synthetic_workload
from policies.eviction.fifo import FIFOEviction
from policies.eviction.lfu import LFUEviction
from policies.eviction.lru import LRUEviction
from policies.registry import SCHEDULING_POLICIES
from sim.cost_model import RooflineCostModel
from sim.fast_forward import DecodeChain
from sim.replica import Replica
from sim.simulator import Simulator

EVICTIONS = {"lru": LRUEviction, "fifo": FIFOEviction, "lfu": LFUEviction}


def shared_workload(n=120, seed=0, block_tokens=32, rate=30.0, prompt=(20, 400), output=(1, 150)):
    """Poisson requests; two thirds start with one of 4 shared prefixes of 1-5 prefix blocks (then a
    private tail), the rest are wholly private."""
    base = synthetic_workload(n, Poisson(rate), Uniform(*prompt), Uniform(*output), seed=seed)
    rng = np.random.default_rng(seed)
    hashes = []
    for i in range(n):
        group = int(rng.integers(0, 6))
        hashes.append(tuple(100 * group + j for j in range(int(rng.integers(1, 6)))) if group < 4 else None)
    return Workload(base.arrival_time_s, base.num_prompt_tokens, base.num_output_tokens, base.priority,
                    prefix_hash_ids=hashes, prefix_block_tokens=block_tokens)


def run(wl, prompt_ids, *, policy=SCHEDULING_POLICIES["vllm"], eviction="lru", blocks=120, fast=True, replicas=1,
        router=None, max_model_len=512):
    reps = []
    for _ in range(replicas):
        cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_num_seqs=32, max_model_len=max_model_len,
                              max_num_batched_tokens=max_model_len, num_cpu_blocks=300)
        cm = RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=2e-3, max_model_len=max_model_len)
        reps.append(Replica(Scheduler(cfg, policy(), EVICTIONS[eviction]()), cm))
    sim = Simulator(reps, router, fast_path=fast, prompt_ids=prompt_ids)
    res = sim.run(wl)
    return res, res.requests.sort_values(["replica", "request_id"], ignore_index=True), res.steps


def assert_same_as_hashing(wl, **kw):
    ref, ref_req, ref_steps = run(wl, "hashed", **kw)
    res, req, steps = run(wl, "auto", **kw)
    pd.testing.assert_frame_equal(req, ref_req)
    pd.testing.assert_frame_equal(steps, ref_steps)
    assert res.end_time_s == ref.end_time_s
    return res


@pytest.mark.parametrize("eviction", list(EVICTIONS))
@pytest.mark.parametrize("policy", [SCHEDULING_POLICIES["vllm"], SCHEDULING_POLICIES["vllm_swap"],
                                    SCHEDULING_POLICIES["srpt"]], ids=lambda c: c.name)
@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "step_by_step"])
def test_private_blocks_give_the_tables_of_full_hashing(policy, eviction, fast):
    res = assert_same_as_hashing(shared_workload(), policy=policy, eviction=eviction, fast=fast)
    req, steps = res.requests, res.steps
    assert req["num_preemptions"].sum() > 0                      # preemptions (and re-admissions) happened
    assert req["num_cached_tokens"].sum() > 0                    # shared prefixes were hit
    assert steps["kv_blocks_cached"].nunique() > 10              # the cached-free count moved
    assert (steps["kv_blocks_free"] == steps["kv_blocks_cached"]).any()   # the plain free blocks ran out


def test_own_blocks_are_found_again_after_a_preemption():
    # Wholly private prompts: any hit is a preempted request finding its own blocks again.
    wl = synthetic_workload(80, Poisson(30.0), Uniform(100, 400), Uniform(50, 150), seed=4)
    res = assert_same_as_hashing(wl, blocks=90)
    req = res.requests
    assert req["num_preemptions"].sum() > 0
    assert res.steps["num_prefill_tokens"].sum() < (req["num_prompt_tokens"]
                                                    + req["num_output_tokens"] * (req["num_preemptions"] > 0)).sum()


@pytest.mark.parametrize("block_tokens", [24, 512])
def test_prefix_blocks_not_aligned_to_kv_blocks_and_long_prompts(block_tokens):
    # 24-token prefix blocks end inside KV blocks (a KV block mixing shared and private tokens is
    # private); 3-6k-token prompts span hundreds of KV blocks and several 512-token prefix blocks.
    wl = shared_workload(40, seed=2, block_tokens=block_tokens, rate=5.0, prompt=(3000, 6000), output=(1, 200))
    res = assert_same_as_hashing(wl, blocks=2000, max_model_len=8192)
    assert res.requests["num_cached_tokens"].sum() > 0


@pytest.mark.parametrize("router", ["round_robin", "prefix_affinity"])
def test_private_blocks_behind_routers(router):
    assert_same_as_hashing(shared_workload(150, seed=1, rate=60.0), replicas=3, router=router, blocks=80)


def test_decode_chains_run_with_a_prefix_cache(monkeypatch):
    chains = []
    apply = DecodeChain.apply
    monkeypatch.setattr(DecodeChain, "apply", lambda self, *a: chains.append(1) or apply(self, *a))
    wl = synthetic_workload(60, Poisson(5.0), Uniform(50, 300), Uniform(20, 200), seed=3)
    assert_same_as_hashing(wl, blocks=150)
    assert chains


def test_auto_falls_back_to_hashing_where_private_keys_would_not_be_exact():
    def reps(bs):
        cfg = SchedulerConfig(num_kvcache_blocks=64, block_size=bs, max_model_len=64, max_num_batched_tokens=64)
        return [Replica(Scheduler(cfg), RooflineCostModel("Qwen3-0.6B", "H200", max_model_len=64))]
    assert Simulator(reps(16)).prompt_ids == "private"
    assert Simulator(reps(2)).prompt_ids == "hashed"          # 151936**2 < 2**64: blocks could match by chance
    assert Simulator(reps(16), vocab_size=4).prompt_ids == "hashed"
    # equal request ids would give equal private streams: hashed for that run
    from experiments.workloads import RequestSpec
    sim = Simulator(reps(16))
    sim.run([RequestSpec(0, 0.0, 40, 2), RequestSpec(0, 0.5, 40, 2)])
    assert sim._arrivals.prompts == "hashed"


def test_a_finished_private_sequence_leaves_dead_cached_blocks():
    bm = BlockManager(8, 4)
    seq = Sequence(0, [0] * 10, SamplingParams(max_tokens=4))
    seq.private_from = 0
    bm.allocate(seq, 10)
    seq.num_computed_tokens = 10
    bm.register_computed_blocks(seq)
    assert not bm.hash_to_block                   # never freed unfinished: nothing published
    seq.status = SequenceStatus.FINISHED
    bm.free(seq)
    assert bm.num_cached_free_blocks == 2 and bm.num_free_blocks == 8   # its two full blocks, as if hashed
    bm.check_invariants([])
    other = Sequence(1, [0] * 29, SamplingParams(max_tokens=4))
    bm.allocate(other, 29)                        # 8 blocks: the 6 plain ones first, then the dead ones
    assert bm.num_cached_free_blocks == 0 and not bm.free_ids
    bm.check_invariants([other])


@pytest.mark.parametrize("policy", [SCHEDULING_POLICIES["sarathi"], SCHEDULING_POLICIES["fcfs"],
                                    SCHEDULING_POLICIES["mlfq"], SCHEDULING_POLICIES["priority"]], ids=lambda c: c.name)
def test_private_blocks_with_chunked_prefill_and_other_policies(policy):
    # sarathi: prefill chunks register blocks part by part; mlfq: preemptive, never fast-forwarded
    res = assert_same_as_hashing(shared_workload(100, seed=5), policy=policy, blocks=100)
    assert res.requests["num_cached_tokens"].sum() > 0


def test_prefix_chains_tell_equal_blocks_under_different_parents_apart():
    # hash ids (g, 7, 8): prefix blocks 2 and 3 carry equal tokens under different first blocks, which
    # share no cached prefix; requests with the same g share all three blocks
    base = synthetic_workload(60, Poisson(20.0), Uniform(60, 200), Uniform(1, 60), seed=6)
    hashes = [(i % 3, 7, 8) for i in range(60)]
    wl = Workload(base.arrival_time_s, base.num_prompt_tokens, base.num_output_tokens, base.priority,
                  prefix_hash_ids=hashes, prefix_block_tokens=32)
    res = assert_same_as_hashing(wl, blocks=200)
    assert res.requests["num_cached_tokens"].sum() > 0
