"""The prefix cache's CPU tier in the simulator: the same tables with private blocks as with every block
hashed, and with the fast path as step by step; tier hits raise the hit rate and cost copy time; the
cost models price the tier's copies; a tier beyond host memory is refused naming the field."""
import pandas as pd
import pytest

from engine.core.batch import Batch
from engine.core.scheduler import Scheduler, SchedulerConfig
from policies.eviction.fifo import FIFOEviction
from policies.eviction.lfu import LFUEviction
from policies.eviction.lru import LRUEviction
from policies.registry import SCHEDULING_POLICIES
from sim.cost_model import ConstantCostModel, RooflineCostModel
from sim.cost_model.calibrated import CalibratedCostModel
from sim.replica import Replica
from sim.simulator import Simulator
from sim.specs import get_hardware_spec, get_model_spec
from sim.specs.capacity import block_bytes_per_gpu, check_host_blocks, cpu_tier_blocks
from tests.sim.test_private_blocks import shared_workload

EVICTIONS = {"lru": LRUEviction, "fifo": FIFOEviction, "lfu": LFUEviction}


def run(wl, prompt_ids="auto", *, tier=60, eviction="lru", tier_eviction="lru", fast=True, blocks=120,
        policy=SCHEDULING_POLICIES["vllm"]):
    cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_num_seqs=32, max_model_len=512,
                          max_num_batched_tokens=512, num_cpu_blocks=300, cpu_cache_num_blocks=tier)
    cm = RooflineCostModel("Qwen3-0.6B", "H200", overhead_s=2e-3, max_model_len=512)
    sched = Scheduler(cfg, policy(), EVICTIONS[eviction](), EVICTIONS[tier_eviction]() if tier else None)
    res = Simulator(Replica(sched, cm), fast_path=fast, prompt_ids=prompt_ids).run(wl)
    return res, res.requests.sort_values("request_id", ignore_index=True), res.steps


@pytest.mark.parametrize("tier_eviction", list(EVICTIONS))
@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_private_blocks_and_fast_path_give_the_tables_of_hashing_step_by_step(eviction, tier_eviction):
    wl = shared_workload()
    ref, ref_req, ref_steps = run(wl, "hashed", fast=False, eviction=eviction, tier_eviction=tier_eviction)
    for prompt_ids, fast in (("auto", True), ("auto", False), ("hashed", True)):
        res, req, steps = run(wl, prompt_ids, fast=fast, eviction=eviction, tier_eviction=tier_eviction)
        pd.testing.assert_frame_equal(req, ref_req)
        pd.testing.assert_frame_equal(steps, ref_steps)
        assert res.end_time_s == ref.end_time_s
    assert ref_req["num_cpu_cached_tokens"].sum() > 0             # the tier served hits
    assert ref_steps["num_offload_blocks"].sum() > 0 and ref_steps["num_cpu_hit_blocks"].sum() > 0
    assert res.num_fast_steps > 0


def test_tier_raises_the_hit_rate_and_its_copies_take_time():
    wl = shared_workload()
    _, off_req, off_steps = run(wl, tier=0)
    _, on_req, on_steps = run(wl, tier=200)
    assert (off_req["num_cpu_cached_tokens"] == 0).all() and off_steps["num_offload_blocks"].sum() == 0
    assert on_req["num_cached_tokens"].sum() > off_req["num_cached_tokens"].sum()
    gpu_hits = on_req["num_cached_tokens"] - on_req["num_cpu_cached_tokens"]
    assert (gpu_hits >= 0).all()
    # each step's GPU hit blocks + CPU hit blocks are its admissions' first-time and re-admission hits
    assert on_steps["num_gpu_hit_blocks"].sum() * 16 >= gpu_hits.sum()
    # fewer prefill tokens computed with the tier
    assert on_steps["num_prefill_tokens"].sum() < off_steps["num_prefill_tokens"].sum()


def _batch(offload, load, decodes=4):
    b = Batch(block_size=16)
    from engine.core.sequence import SamplingParams, Sequence
    b.seqs = [Sequence(i, [1] * 100, SamplingParams(max_tokens=5)) for i in range(decodes)]
    for s in b.seqs:
        s.token_ids.append(2)
    b.num_new_tokens = [1] * decodes
    b.context_lens = [101] * decodes
    b.offload = [(i, i) for i in range(offload)]
    b.load = [(i, 100 + i) for i in range(load)]
    return b


def test_cost_models_price_the_tier_copies():
    roof = RooflineCostModel("Qwen3-0.6B", "H200", max_model_len=512)
    base = roof.step_time_s(_batch(0, 0))
    link = 16 * roof.s_swap_per_token
    hbm = 16 * roof.s_kv_per_token
    # loads: host link + scatter before the forward pass
    assert roof.step_time_s(_batch(0, 10)) == pytest.approx(base + 10 * (link + 2 * hbm))
    # a few offloads hide behind the forward pass (only the gather shows); many do not
    assert roof.step_time_s(_batch(2, 0)) == pytest.approx(base + 4 * hbm)
    assert roof.step_time_s(_batch(5000, 0)) == pytest.approx(2 * 5000 * hbm + 5000 * link)
    # beyond the engine's two staging buffers the transfer runs ahead of the forward pass
    assert roof.step_time_s(_batch(600, 0)) == pytest.approx(1200 * hbm + 88 * link + max(base, 512 * link))
    const = ConstantCostModel(step_s=1.0, per_swap_block_s=0.5)
    assert const.step_time_s(_batch(3, 4)) == const.step_time_s(_batch(0, 0)) + 3.5
    cal = CalibratedCostModel(coefficients=dict(step=1.0, tier_step=10.0, tier_out_blocks=100.0,
                                                tier_in_blocks=1000.0))
    assert cal.step_time_s(_batch(2, 3)) == cal.step_time_s(_batch(0, 0)) + 10.0 + 200.0 + 3000.0


def test_tier_beyond_host_memory_is_refused_naming_the_field():
    model, hw = get_model_spec("Qwen3-8B"), get_hardware_spec("H200")
    check_host_blocks(model, hw, 16, 1, 1820, 100_000)           # 230 GiB: fits in 256 GiB per GPU
    with pytest.raises(ValueError, match=r"cpu_cache_num_blocks=200000 .* host memory per GPU of H200 "
                                         r"\(hardware.host_memory_gib\); use cpu_cache_num_blocks <= 11"):
        check_host_blocks(model, hw, 16, 1, 1820, 200_000)


def test_tier_in_gib_converts_with_the_models_block_bytes_and_is_checked_against_host_memory():
    model, hw = get_model_spec("Qwen3-8B"), get_hardware_spec("H200")
    block = block_bytes_per_gpu(model, 16, 1)                    # 144 KiB a token x 16: 2.25 MiB
    assert block == 2 * 36 * 16 * 8 * 128 * 2
    assert cpu_tier_blocks(model, 16, 1, 0, 28.0) == int(28 * 2**30 // block) == 12743
    assert cpu_tier_blocks(model, 16, 2, 0, 28.0) == 25486       # half the KV heads per GPU: half the block
    assert cpu_tier_blocks(model, 16, 1, 500, None) == 500
    with pytest.raises(ValueError, match=r"^cpu_cache_num_blocks=500 and cpu_cache_gib=28 both size the CPU tier"):
        cpu_tier_blocks(model, 16, 1, 500, 28.0)
    blocks = cpu_tier_blocks(model, 16, 1, 0, 300.0)
    with pytest.raises(ValueError, match=r"^cpu_cache_gib=300 \(136533 blocks of Qwen3-8B KV, plus 4.0 GiB of swap "
                                         r"space\) exceeds the 256 GiB .* use cpu_cache_gib <= 252$"):
        check_host_blocks(model, hw, 16, 1, 1820, blocks, 300.0)
    check_host_blocks(model, hw, 16, 1, 1820, cpu_tier_blocks(model, 16, 1, 0, 252.0), 252.0)

