"""Run summaries on a tiny hand-made table (every number worked out by hand), and plots."""
import math

import numpy as np
import pandas as pd
import pytest

from engine.core.recorder import REQUEST_COLUMNS, STEP_COLUMNS
from experiments.metrics import PER_REPLICA_COLUMNS, SLO, itl_values, per_replica, summaries_frame, summary


def requests_table():
    nan = float("nan")
    arrival = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    ttft = np.array([0.5, 1.0, 0.25, 2.0, nan])
    e2e = np.array([2.0, 3.0, 1.0, 4.0, nan])
    nout = np.array([3, 5, 1, 9, 0])
    df = pd.DataFrame({
        "request_id": [0, 1, 2, 3, 4], "status": ["finished"] * 4 + ["rejected"],
        "reject_reason": [None] * 4 + ["too long"], "num_prompt_tokens": [10, 20, 30, 40, 50],
        "num_output_tokens": nout, "max_output_tokens": [3, 5, 1, 9, 4], "arrival_time_s": arrival,
        "first_scheduled_time_s": arrival + [0.25, 0.5, 0.0, 1.0, nan], "first_token_time_s": arrival + ttft,
        "finish_time_s": arrival + e2e, "ttft_s": ttft,
        "tpot_s": [0.75, 0.5, nan, 0.25, nan], "e2e_s": e2e, "queueing_delay_s": [0.25, 0.5, 0.0, 1.0, nan],
        "num_preemptions": [0, 2, 0, 1, 0], "num_swaps": [0, 0, 1, 0, 0], "num_cached_tokens": [0, 10, 0, 20, 0],
        "priority": 0, "replica": 0, "tenant": "default", "ttft_slo_s": nan, "tpot_slo_s": nan})
    for c in ("ttft_slo_met", "tpot_slo_met", "slo_met"):      # no targets: NA
        df[c] = pd.array([pd.NA] * len(df), dtype="boolean")
    return df[list(REQUEST_COLUMNS)]


def steps_table():
    df = pd.DataFrame({c: [0, 0] for c in STEP_COLUMNS})
    df["start_time_s"] = [0.0, 1.0]
    df["duration_s"] = [1.0, 0.5]
    df["batch_size"] = [2, 4]
    df["kv_blocks_used"] = [3, 5]
    df["kv_blocks_free"] = [7, 5]
    return df


def test_summary_hand_computed():
    s = summary(requests_table(), steps_table(), slo=SLO(ttft_s=1.0, tpot_s=0.6))
    assert (s["num_requests"], s["num_finished"], s["num_rejected"]) == (5, 4, 1)
    assert s["makespan_s"] == 7.0                                  # first arrival 0 -> last finish 7
    assert s["request_throughput_rps"] == pytest.approx(4 / 7)
    assert s["output_throughput_tps"] == pytest.approx(18 / 7)
    assert s["total_throughput_tps"] == pytest.approx(118 / 7)
    # TTFT of finished requests, sorted: 0.25 0.5 1.0 2.0 (linear interpolation)
    assert s["ttft_s_p50"] == pytest.approx(0.75) and s["ttft_s_p90"] == pytest.approx(1.7)
    assert s["ttft_s_p99"] == pytest.approx(1.97) and s["ttft_s_mean"] == pytest.approx(0.9375)
    assert s["tpot_s_p50"] == pytest.approx(0.5) and s["tpot_s_mean"] == pytest.approx(0.5)   # 1-token output left out
    assert s["e2e_s_p50"] == pytest.approx(2.5)
    assert s["normalized_latency_s_mean"] == pytest.approx((2 / 3 + 0.6 + 1.0 + 4 / 9) / 4)
    assert s["queueing_delay_s_p50"] == pytest.approx(0.375)
    # good: request 1 (ttft 1.0, tpot 0.5) and request 2 (1 token: TPOT counts as 0)
    assert s["num_good"] == 2 and s["goodput_rps"] == pytest.approx(2 / 7) and s["slo_attainment"] == 0.4
    assert (s["num_preemptions"], s["num_preempted_requests"], s["num_swaps"]) == (3, 2, 1)
    assert s["prefix_cache_hit_rate"] == pytest.approx(30 / 100)
    assert s["num_steps"] == 2 and s["mean_batch_size"] == 3.0
    assert s["kv_usage_mean"] == pytest.approx(0.4) and s["kv_usage_max"] == 0.5 and s["busy_time_s"] == 1.5
    assert "itl_s_p50" not in s


def two_replicas_and_an_idle_one():
    req = requests_table().assign(replica=[0, 1, 0, 1, 1])
    return req, steps_table().assign(replica=[0, 1])


def test_per_replica_hand_computed():
    req, steps = two_replicas_and_an_idle_one()
    t = per_replica(req, steps, num_replicas=3)
    assert list(t.columns) == list(PER_REPLICA_COLUMNS) and t["replica"].tolist() == [0, 1, 2]
    assert t["num_requests"].tolist() == [2, 3, 0] and t["num_finished"].tolist() == [2, 2, 0]
    assert t["request_share"].tolist() == pytest.approx([0.4, 0.6, 0.0])
    assert t["num_tokens"].tolist() == [13 + 31, 25 + 49 + 50, 0]       # prompt + output, rejected included
    # busy: step durations 1.0 (replica 0) and 0.5 (replica 1) over the run's makespan of 7 s
    assert t["busy_time_s"].tolist() == [1.0, 0.5, 0.0]
    assert t["busy_fraction"].tolist() == pytest.approx([1 / 7, 0.5 / 7, 0.0])
    assert t["kv_usage_mean"].tolist()[:2] == [0.3, 0.5] and t["kv_usage_max"].tolist()[:2] == [0.3, 0.5]
    assert t["prefix_cache_hit_rate"].tolist()[:2] == [0.0, 0.5]           # 0/40 and 30/60 (finished only)
    assert t["ttft_s_p50"].tolist()[:2] == [0.375, 1.5]
    assert t["ttft_s_p99"].tolist()[:2] == pytest.approx([0.4975, 1.99])
    assert t.loc[2, ["kv_usage_mean", "prefix_cache_hit_rate", "ttft_s_p50"]].isna().all()   # idle: no data


def test_summary_adds_replica_balance_only_with_several_replicas():
    req, steps = two_replicas_and_an_idle_one()
    s = summary(req, steps, num_replicas=3)
    assert s["num_idle_replicas"] == 1
    assert s["replica_requests_max_over_mean"] == pytest.approx(3 / (5 / 3))
    assert s["replica_tokens_max_over_mean"] == pytest.approx(124 / (168 / 3))
    assert s["replica_busy_fraction_min"] == 0.0 and s["replica_busy_fraction_max"] == pytest.approx(1 / 7)
    assert summary(req, steps)["num_idle_replicas"] == 0                  # without num_replicas: replicas seen
    assert "num_idle_replicas" not in summary(requests_table(), steps_table())
    assert per_replica(requests_table(), None)["busy_fraction"].isna().all()


def test_slo_variants():
    req = requests_table()
    assert "goodput_rps" not in summary(req)                      # no SLO, no goodput
    assert summary(req, slo={"e2e_s": 2.0})["num_good"] == 2      # e2e 2.0 and 1.0
    assert summary(req, slo={"ttft_s": 10.0})["num_good"] == 4
    with pytest.raises(ValueError, match="unknown SLO key"):
        summary(req, slo={"ttft_ms": 1})
    with pytest.raises(ValueError, match="must be > 0"):
        SLO(tpot_s=0)


def test_itl_from_token_times():
    tt = pd.DataFrame({"request_id": [1, 0, 0, 1, 0], "token_index": [1, 2, 0, 0, 1],
                       "time_s": [2.25, 2.5, 1.0, 2.0, 1.5]})
    np.testing.assert_allclose(itl_values(tt), [0.5, 1.0, 0.25])
    s = summary(requests_table(), token_times_df=tt)
    assert s["itl_s_p50"] == pytest.approx(0.5) and s["itl_s_mean"] == pytest.approx(1.75 / 3)


def test_all_rejected_gives_nan_not_error():
    req = requests_table()
    req["status"] = "rejected"
    s = summary(req)
    assert s["num_finished"] == 0 and math.isnan(s["ttft_s_p50"]) and math.isnan(s["request_throughput_rps"])


def test_summaries_frame_one_row_per_run():
    df = summaries_frame({"a": (requests_table(), steps_table()), "b": (requests_table(), None)})
    assert df["run"].tolist() == ["a", "b"] and df["num_finished"].tolist() == [4, 4]


def test_plots_write_png(tmp_path):
    pytest.importorskip("matplotlib")
    from experiments import plots
    req = requests_table()
    p = plots.latency_cdf({"fcfs": req, "sjf": req.assign(ttft_s=req["ttft_s"] * 2)}, tmp_path / "cdf.png")
    p2 = plots.latency_cdf({"fcfs": req}, tmp_path / "sub" / "norm.png", metric="normalized_latency_s", log_x=True)
    rows = pd.DataFrame([{"policy": pol, "request_rate_rps": r, **summary(req)}
                         for pol in ("fcfs", "sjf") for r in (1.0, 2.0, 4.0)])
    p3 = plots.throughput_latency(rows, tmp_path / "tl.png", metric="ttft_s")
    p4 = plots.step_timeline(steps_table(), tmp_path / "steps.png", title="run")
    p5 = plots.replica_load(per_replica(*two_replicas_and_an_idle_one(), num_replicas=3), tmp_path / "rl.png")
    for path in (p, p2, p3, p4, p5):
        data = path.read_bytes()
        assert path.exists() and len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="lack column"):
        plots.throughput_latency(rows.drop(columns=["policy"]), tmp_path / "x.png")
    with pytest.raises(ValueError, match="unknown metric"):
        plots.latency_cdf({"a": req}, tmp_path / "y.png", metric="nope")
