"""Cost models: hand-computed roofline steps, exact constant model, vectorized == scalar, errors, bound."""
import numpy as np
import pytest

from engine.core.batch import Batch
from engine.core.sequence import SamplingParams, Sequence
from sim.cost_model import (
    COST_MODELS,
    ConstantCostModel,
    CostModel,
    CostModelError,
    RooflineCostModel,
    get_cost_model,
    register_cost_model,
)
from sim.lower_bound import decode_schedule, workload_lower_bound


def make_seq(prompt_len, num_outputs=0, computed=None, rid=0):
    seq = Sequence(rid, list(range(prompt_len)), SamplingParams(max_tokens=4096, ignore_eos=True))
    seq.token_ids.extend([7] * num_outputs)
    seq.num_computed_tokens = len(seq.token_ids) - 1 if computed is None else computed
    return seq


def make_batch(prefill, decode_contexts, swaps=0):
    """prefill: list of (seq, num_new_tokens); decode_contexts: context length (incl. new token) per decode."""
    seqs = [s for s, _ in prefill] + [make_seq(c - 1, 1, rid=1000 + i) for i, c in enumerate(decode_contexts)]
    new = [n for _, n in prefill] + [1] * len(decode_contexts)
    ctx = [s.num_computed_tokens + n for s, n in prefill] + list(decode_contexts)
    return Batch(seqs=seqs, num_new_tokens=new, num_prefill_seqs=len(prefill), context_lens=ctx,
                 swap_in=[(i, i) for i in range(swaps)])


# Qwen3-0.6B on H200 at the measured ceilings: 793e12 FLOP/s, 4.26e12 B/s.
#   linear params 440,401,920 (28 layers * 15,728,640); weights 880,803,840 B
#   attention FLOPs per query-key pair 4 * 28 layers * 16 q heads * 128 = 229,376
#   KV bytes per token 114,688; LM head 151,936 * 1024 = 155,582,464 params: 311,164,928 FLOPs/token and bytes
def test_roofline_known_batch_by_hand():
    cm = RooflineCostModel("Qwen3-0.6B", "H200")
    # One fresh 512-token prompt (samples) + 64 decodes at context 1000 each (sum 64,000).
    linear = max(2 * 440_401_920 * 576 / 793e12,      # 576 tokens: 6.3978e-4 s  (compute-bound)
                 880_803_840 / 4.26e12)                #             2.0676e-4 s
    prefill_attn = max(131_328 * 229_376 / 793e12,     # pairs 512*512 - 512*511/2 = 131,328: 3.7987e-5 s
                       1024 * 114_688 / 4.26e12)       # read 512 + write 512 KV:             2.7568e-5 s
    decode_attn = max(64_000 * 229_376 / 793e12,       # 1.8512e-5 s
                      64_064 * 114_688 / 4.26e12)      # read 64,000 + write 64 KV: 1.72474e-3 s (memory-bound)
    lm_head = max(65 * 311_164_928 / 793e12,           # 65 sampling tokens: 2.5505e-5 s
                  311_164_928 / 4.26e12)               # head weights once:  7.3043e-5 s
    expected = linear + prefill_attn + decode_attn + lm_head
    assert expected == pytest.approx(2.47554e-3, rel=1e-5)
    assert cm.step_time_from_shape([512], [512], 64, 64_000) == pytest.approx(expected, rel=1e-12)
    batch = make_batch([(make_seq(512, computed=0), 512)], [1000] * 64)
    assert cm.step_time_s(batch) == pytest.approx(expected, rel=1e-12)


def test_roofline_latency_floors_by_hand():
    """H200 floors (gpu_floor_h200.json): 4.33 us per matmul-like kernel, 0.81 us per elementwise kernel,
    11.5 us per launch + sync. One decode at context 10: every group sits on its floor."""
    cm = RooflineCostModel("Qwen3-0.6B", "H200", latency_floors=True)
    linear = max(880_803_840 / 4.26e12, 4 * 28 * 4.33e-6)            # 2.07e-4 < 4.85e-4: the floor
    attn = max(11 * 114_688 / 4.26e12, 2 * 28 * 4.33e-6)             # split pass + merge per layer
    lm_head = max(311_164_928 / 4.26e12, 4.33e-6)                     # 7.3e-5: bandwidth
    fixed = 4 * 28 * 0.81e-6 + 11.5e-6          # 2 add+norms, SiLU-and-mul, fused q/k norm + RoPE + KV store
    expected = fixed + linear + attn + lm_head
    assert cm.step_time_from_shape([], [], 1, 10) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(9.027e-4, rel=1e-3)        # 0.90 ms, against ~1.8 ms on the engine
    pure = RooflineCostModel("Qwen3-0.6B", "H200")
    big = ([2048], [2048], 200, 200 * 3000)                            # far above every floor: unchanged
    assert cm.step_time_from_shape(*big) == pytest.approx(pure.step_time_from_shape(*big) + fixed, rel=1e-12)
    with pytest.raises(ValueError, match="latency_floors=True needs the measured floors of 'L40S'"):
        RooflineCostModel("Llama-3.1-8B", "L40S", latency_floors=True)


def test_roofline_chunked_prefill_chunk_does_not_sample():
    cm = RooflineCostModel("Qwen3-0.6B", "H200")
    # Middle chunk: 256 new tokens after 256 computed, of a 1000-token prompt: context 512, no token sampled.
    batch = make_batch([(make_seq(1000, computed=256), 256)], [])
    pairs = 256 * 512 - 256 * 255 / 2                 # 98,432
    expected = (max(2 * 440_401_920 * 256 / 793e12, 880_803_840 / 4.26e12)
                + max(pairs * 229_376 / 793e12, (512 + 256) * 114_688 / 4.26e12))   # no LM head
    assert cm.step_time_s(batch) == pytest.approx(expected, rel=1e-12)
    assert cm.step_time_from_shape([256], [512], 0, 0, num_prefill_samples=0) == pytest.approx(expected, rel=1e-12)


def test_roofline_tensor_parallel_and_swap_by_hand():
    cm = RooflineCostModel("Qwen3-0.6B", "H200", tensor_parallel_size=2)
    # 8 decodes, context sum 8,000. Per GPU: half the weights, 8 of 16 q heads, 4 of 8 KV heads.
    linear = max(2 * 440_401_920 * 8 / 2 / 793e12, 880_803_840 / 2 / 4.26e12)
    attn = max(8_000 * (4 * 28 * 8 * 128) / 793e12, 8_008 * (2 * 28 * 4 * 128 * 2) / 4.26e12)
    lm_head = max(8 * 311_164_928 / 2 / 793e12, 311_164_928 / 2 / 4.26e12)
    # 2 all-reduces per layer of 1024 * 2 bytes per token, ring factor 2*(2-1)/2 = 1, NVLink 450e9 B/s
    allreduce = 8 * 2 * 28 * 1024 * 2 * 1.0 / 450e9
    assert cm.step_time_from_shape([], [], 8, 8_000) == pytest.approx(linear + attn + lm_head + allreduce,
                                                                      rel=1e-12)
    # Swap-only step: 10 blocks * 16 tokens * 114,688 B over PCIe 64e9 B/s, nothing else.
    one = RooflineCostModel("Qwen3-0.6B", "H200")
    assert one.step_time_s(make_batch([], [], swaps=10)) == pytest.approx(10 * 16 * 114_688 / 64e9, rel=1e-12)
    assert one.step_time_from_shape([], [], 0, 0) == 0.0


def test_roofline_efficiencies_and_datasheet_rates():
    lb = RooflineCostModel("Llama-3.1-8B", "H100-SXM")
    slow = RooflineCostModel("Llama-3.1-8B", "H100-SXM", matmul_efficiency=0.5, attention_efficiency=0.5,
                             memory_efficiency=0.5, overhead_s=1e-3)
    shape = ([300, 40], [300, 1040], 32, 32 * 2000)
    assert slow.step_time_from_shape(*shape) == pytest.approx(2 * lb.step_time_from_shape(*shape) + 1e-3)
    h200 = RooflineCostModel("Qwen3-8B", "H200", use_measured=False)
    # Pure weight-read step at the datasheet 4.8e12 B/s: 1 decode at context 1.
    w = 6_945_767_424 * 2 / 4.8e12 + 151_936 * 4096 * 2 / 4.8e12 + 2 * 36 * 8 * 128 * 2 * 2 / 4.8e12
    assert h200.step_time_from_shape([], [], 1, 1) == pytest.approx(w, rel=1e-12)
    with pytest.raises(ValueError, match="matmul_efficiency"):
        RooflineCostModel("Qwen3-8B", "H200", matmul_efficiency=1.5)


def test_constant_model_exact():
    cm = ConstantCostModel(step_s=0.5, per_prefill_token_s=2**-10, per_decode_seq_s=2**-6, per_swap_block_s=2**-4)
    batch = make_batch([(make_seq(100, computed=0), 100), (make_seq(60, computed=20), 40)], [10, 20, 30], swaps=2)
    # 0.5 + 140/1024 + 3/64 + 2/16 = 0.5 + 0.13671875 + 0.046875 + 0.125
    assert cm.step_time_s(batch) == 0.80859375
    assert cm.step_time_from_shape([], [], 0, 0) == 0.0
    assert list(cm.decode_step_times_s(4, 40, 3)) == [0.5 + 4 / 64] * 3


@pytest.mark.parametrize("cm", [
    RooflineCostModel("Qwen3-0.6B", "H200"),
    RooflineCostModel("Qwen3-32B", "H100-SXM", tensor_parallel_size=4, matmul_efficiency=0.7,
                      attention_efficiency=0.6, memory_efficiency=0.8, overhead_s=3e-4, per_seq_overhead_s=2e-6,
                      allreduce_latency_s=5e-6),
    RooflineCostModel("Llama-3.1-8B", "L40S"),
    RooflineCostModel("Qwen3-0.6B", "H200", latency_floors=True),
    ConstantCostModel(step_s=0.01, per_decode_seq_s=1e-4),
], ids=["roofline", "roofline-tp4", "roofline-l40s", "roofline-floors", "constant"])
@pytest.mark.parametrize("num_seqs,start", [(1, 1), (7, 7 * 300), (256, 256 * 100), (512, 512 * 3000)])
def test_vectorized_decode_equals_scalar_loop(cm, num_seqs, start):
    k = 200
    vec = cm.decode_step_times_s(num_seqs, start, k)
    loop = [cm.step_time_from_shape([], [], num_seqs, start + i * num_seqs, 0) for i in range(k)]
    assert vec.shape == (k,)
    np.testing.assert_allclose(vec, loop, rtol=1e-13, atol=0)
    # and the base-class reference loop
    np.testing.assert_allclose(vec, CostModel.decode_step_times_s(cm, num_seqs, start, k), rtol=1e-13)
    assert len(cm.decode_step_times_s(num_seqs, start, 0)) == 0


def test_unpriceable_batches_raise_named_errors():
    cm = RooflineCostModel("Qwen3-0.6B", "H200")       # max_model_len 40960
    long = make_batch([], [100, 50_000])                 # one context beyond the limit, sum under 2*40960
    with pytest.raises(CostModelError, match=r"step shape\(.*max_model_len=40960"):
        cm.step_time_s(long)
    with pytest.raises(CostModelError, match=r"step shape\(prefill_new_tokens=\[-3\]"):
        cm.step_time_from_shape([-3], [10], 0, 0)
    with pytest.raises(CostModelError, match="smaller than its new tokens"):
        cm.step_time_from_shape([512], [100], 0, 0)
    with pytest.raises(CostModelError, match="num_decode_seqs"):
        cm.step_time_from_shape([], [], -1, 0)
    with pytest.raises(CostModelError, match="max_model_len"):
        cm.decode_step_times_s(10, 10 * 40_000, 2000)    # grows past 40960 within the window
    assert issubclass(CostModelError, ValueError) and not issubclass(CostModelError, KeyError)
    with pytest.raises(CostModelError, match="step shape"):
        ConstantCostModel(max_model_len=100).step_time_from_shape([], [], 1, 101)


def test_registry():
    assert set(COST_MODELS) >= {"roofline", "constant"}
    cm = get_cost_model("roofline", model="qwen3_8b", hardware="h100")
    assert cm.model.name == "Qwen3-8B" and cm.hardware.name == "H100-SXM"
    with pytest.raises(ValueError) as e:
        get_cost_model("calibrated-nope")
    assert "roofline" in str(e.value) and "constant" in str(e.value)

    @register_cost_model("test-const")
    class Half(ConstantCostModel):
        pass
    try:
        assert isinstance(get_cost_model("test-const", step_s=0.5), Half)
        with pytest.raises(ValueError, match="already registered"):
            register_cost_model("test-const")(ConstantCostModel)
    finally:
        COST_MODELS.pop("test-const")


# -- workload lower bound -----------------------------------------------------------------------
def test_decode_schedule_by_hand():
    # (prompt, output): decode steps per request = output - 1 = 4, 2, 0.
    n, S = decode_schedule(np.array([100, 50, 200]), np.array([5, 3, 1]))
    # step 1: contexts 101 + 51; step 2: 102 + 52; steps 3, 4: only the first request (103, 104)
    assert n.tolist() == [2, 2, 1, 1] and S.tolist() == [152, 154, 103, 104]


def test_lower_bound_equals_priced_ideal_schedule():
    reqs = [(100, 5), (50, 3), (200, 1)]
    cm = RooflineCostModel("Qwen3-0.6B", "H200")
    expected = cm.step_time_from_shape([100, 50, 200], [100, 50, 200], 0, 0, num_prefill_samples=3)
    expected += sum(cm.step_time_from_shape([], [], n, s) for n, s in [(2, 152), (2, 154), (1, 103), (1, 104)])
    b = workload_lower_bound(reqs, "Qwen3-0.6B", "H200")
    assert b.time_s == pytest.approx(expected, rel=1e-12)
    assert (b.output_tokens, b.prompt_tokens, b.num_decode_steps, b.kv_limited) == (9, 350, 4, False)


def test_lower_bound_kv_limited_adds_weight_reads():
    reqs = [(1000, 500)] * 64
    free = workload_lower_bound(reqs, "Qwen3-8B", "H200")
    # 64 requests need ~64 * 1250 resident tokens on average; a 16k-token cache forces ~5x the steps.
    tight = workload_lower_bound(reqs, "Qwen3-8B", "H200", kv_capacity_tokens=16_384)
    assert not free.kv_limited and tight.kv_limited
    assert tight.num_decode_steps == -(-sum(64 * (1000 + t) for t in range(1, 500)) // 16_384)
    assert tight.time_s > free.time_s
    with pytest.raises(ValueError, match="cannot be served"):
        workload_lower_bound([(20_000, 10)], "Qwen3-8B", "H200", kv_capacity_tokens=16_384)


def test_nano_vllm_benchmark_floor():
    # nano-vllm's benchmark: Qwen3-0.6B on an H200, 256 requests, prompt and output lengths uniform in [100, 1024].
    # Decode reads the KV cache (~21 GB per step at the full batch of 256 * ~700 tokens * 114,688 B), which
    # dominates: the floor is about 35,500 output tokens/s.
    rng = np.random.default_rng(0)
    reqs = list(zip(rng.integers(100, 1025, 256), rng.integers(100, 1025, 256)))
    b = workload_lower_bound(reqs, "Qwen3-0.6B", "H200")
    assert 34_500 < b.output_tokens_per_s < 36_500
    assert not b.kv_limited
    assert b.time_by_group_s["attention_decode"] > 0.8 * b.time_s
    assert 19e9 < b.peak_kv_tokens * 114_688 < 24e9


def test_every_cost_model_file_is_registered_and_has_a_yaml():
    """The registry is discovered from sim/cost_model/'s files; each entry has its conf/backend/cost_model YAML."""
    from pathlib import Path
    conf = Path(__file__).resolve().parents[2] / "conf" / "backend" / "cost_model"
    assert set(COST_MODELS) == {p.stem for p in conf.glob("*.yaml")}
    assert all(cls.__module__ == f"sim.cost_model.{name}" for name, cls in COST_MODELS.items())
