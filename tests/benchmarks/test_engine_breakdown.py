"""benchmarks/engine_breakdown.py's trace arithmetic on a made-up trace (the GPU run itself needs CUDA)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import engine_breakdown as eb  # noqa: E402


@pytest.mark.parametrize("name,group", [
    ("_decode_split_kernel", "attention_decode"), ("_decode_reduce_kernel", "attention_decode"),
    ("_prefill_kernel", "attention_prefill"), ("nvjet_sm90_tst_64x32_64x16_1x2_h_bz_TNT", "gemm"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm_rope_kv_store"),
    ("_qk_norm_rope_store_kernel", "norm_rope_kv_store"), ("triton_poi_fused_mul_silu_split_0", "activation"),
    ("_race_argmax_kernel", "sampling"), ("void at::native::index_select_kernel", "other"),
])
def test_kernel_groups(name, group):
    assert eb.kernel_group(name) == group


def _trace(*events):
    return {"traceEvents": [dict(ph="X", cat=c, name=n, ts=t, dur=d) for c, n, t, d in events]
            + [dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=0, dur=500)]}


def test_idle_split_and_groups_exact():
    trace = _trace(("kernel", "nvjet_a", 100, 10),            # busy 100-110
                   ("kernel", "_decode_split_kernel", 112, 20),  # gap 2 (launch), busy 112-132
                   ("kernel", "silu_x", 120, 5),                # overlaps: no gap
                   ("gpu_memcpy", "Memcpy HtoD", 140, 4),       # gap 8 (host)
                   ("kernel", "_decode_split_kernel", 200, 30))  # gap 56 (host); ends at 230
    events = eb.device_events(trace)
    assert [e[3] for e in events] == ["gemm", "attention_decode", "activation", "copies", "attention_decode"]
    idle = eb.idle_gaps(events)
    assert idle == dict(span_us=130.0, busy_us=10 + 20 + 4 + 30, launch_gaps_us=2.0, launch_gaps=1,
                        host_gaps_us=64.0, host_gaps=2)
    assert idle["busy_us"] + idle["launch_gaps_us"] + idle["host_gaps_us"] == idle["span_us"]
    b = eb.breakdown(events, roofline_s={"attention_decode": 25e-6, "linear": 4e-6, "lm_head": 1e-6}, steps=2)
    assert b["groups"]["attention_decode"] == dict(s=50e-6, calls=2, share=pytest.approx(50 / 69))
    assert b["roofline"]["attention_decode"]["floor_over_measured"] == pytest.approx(0.5)
    assert b["roofline"]["gemm"]["floor_over_measured"] == pytest.approx(0.5)
    assert b["per_step_ms"]["host_gaps"] == pytest.approx(0.032)
    assert b["top_kernels"][0]["name"] == "_decode_split_kernel"
    assert "| attention_decode | 0.000 |" in eb.table({"traced": b})


def test_attention_by_batch_assigns_calls_to_steps_in_order():
    """Two layers: step 1 (8 sequences, 1,000 keys) ran calls 0-1, step 2 (200 sequences, 50,000 keys) calls 2-3
    (the second with a reduce); a fifth call (the drained step) is left out."""
    k = [("kernel", "_decode_split_kernel", 0, 10), ("kernel", "nvjet", 10, 5),
         ("kernel", "_decode_split_kernel", 20, 10),
         ("kernel", "_decode_split_kernel", 40, 100), ("kernel", "_decode_split_kernel", 150, 90),
         ("kernel", "_decode_reduce_kernel", 240, 10), ("kernel", "_decode_split_kernel", 300, 50)]
    events = eb.device_events(_trace(*k))
    rows = eb.attention_by_batch(events, [(8, 1000), (200, 50_000)], layers=2, kv_bytes_per_token=4096,
                                 bytes_per_s=4e12)
    assert [r["batch"] for r in rows] == ["1-16", "129-256"]
    small, big = rows
    assert small["calls"] == 2 and small["s"] == pytest.approx(20e-6)
    assert small["tb_per_s"] == pytest.approx(2 * 1000 * 4096 / 20e-6 / 1e12)
    assert big["calls"] == 2 and big["s"] == pytest.approx(200e-6)          # 100 + 90 + the reduce's 10
    assert big["of_datasheet"] == pytest.approx(2 * 50_000 * 4096 / 200e-6 / 4e12)
    text = eb.table({"traced": dict(eb.breakdown(events), attention_by_batch=rows)})
    assert "| 129-256 | 0.000 |" in text


def test_time_split():
    assert eb.time_split([(100, 0.3), (0, 0.01), (5, 0.02), (0, 0.01)]) == dict(
        prefill_steps=2, prefill_s=pytest.approx(0.32), decode_s=pytest.approx(0.02), longest_step_s=0.3,
        longest_step_index=0)
    assert eb.time_split([(0, 0.01), (0, 0.5), (3, 0.1)])["longest_step_index"] == 1
    assert eb.time_split([]) == dict(prefill_steps=0, prefill_s=0, decode_s=0, longest_step_s=0.0,
                                     longest_step_index=None)
