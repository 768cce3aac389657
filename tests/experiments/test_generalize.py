"""The generalization suite on CPU: every conf/scheduler policy through the validation loop with the tiny model,
repeats and decisions kept, the table re-made from the saved runs; the policy-difference and divergence logic
on hand-made runs."""
import json

import numpy as np
import pandas as pd
import pytest

from experiments.divergence import first_divergence
from experiments.policy_diff import pair_difference, policy_differences
from tests.experiments.test_validation import tiny  # noqa: F401  (the tiny checkpoint fixture)

ALL_POLICIES = "fcfs,vllm,vllm+chunked,vllm_swap,sjf,srpt,priority,mlfq,sarathi"


def test_policy_labels_build_the_hydra_configs():
    from experiments.policy_conf import make_policy, parse_label, policy_names, swaps
    assert {"fcfs", "vllm", "vllm_swap", "sjf", "srpt", "priority", "mlfq", "sarathi"} <= set(policy_names())
    assert make_policy("priority").victim.name == "lowest_priority"      # the YAML's victim, not the default
    assert parse_label("vllm+chunked").chunked is True and parse_label("vllm+nochunk").chunked is False
    assert parse_label("vllm").chunked is None
    assert swaps("mlfq") and swaps("vllm_swap") and not swaps("vllm+chunked")
    with pytest.raises(ValueError, match="allowed: .*fcfs"):
        parse_label("lifo")
    with pytest.raises(ValueError, match="suffix"):
        parse_label("vllm+fast")


def test_every_policy_validates_on_cpu_and_generalize_remakes_the_table(tiny, tmp_path):
    from experiments import generalize, validate
    real = tmp_path / "real" / "mix"
    wl = ["--num-requests", "6", "--arrival", "poisson", "--rate-rps", "30", "--prompt-len", "8:64",
          "--output-len", "4:16", "--max-model-len", "256", "--num-kvcache-blocks", "16", "--num-cpu-blocks", "32",
          "--priority-classes", "0:0.5,1:0.5", "--policies", ALL_POLICIES]
    assert validate.main(["--model", str(tiny), "--device", "cpu", "--out-dir", str(real), "--name", "mix", *wl,
                          "--max-wall-s", "60", "--repeats", "2", "--record-decisions", "--no-roofline", "--no-plot",
                          "--real-dir", str(real)]) == 0
    report = json.loads((real / "validation_mix.json").read_text())
    for p in ALL_POLICIES.split(","):
        assert report["policies"][p]["real"]["summary"]["num_finished"] == 6, p
        assert (real / "repeat1" / f"mix_{p}_requests.parquet").is_file()
        assert (real / f"mix_{p}_decisions.parquet").is_file()
    assert report["policies"]["vllm+chunked"]["real"]["info"]["scheduler"]["enable_chunked_prefill"] is True
    assert report["policies"]["vllm"]["real"]["info"]["scheduler"]["enable_chunked_prefill"] is False
    assert report["policies"]["mlfq"]["real"]["info"]["scheduler"]["num_cpu_blocks"] == 32
    meta = json.loads((real / "mix_real.json").read_text())
    assert "--policies" in meta["argv"] and "--repeats" in meta["argv"]

    out = tmp_path / "gen"
    assert generalize.main(["--real-root", str(tmp_path / "real"), "--profile",
                            "benchmarks/results/profile_cpu_tiny.json", "--out", str(out),
                            "--divergence", "mix:vllm"]) == 0
    table = pd.read_parquet(out / "generalize.parquet")
    assert list(table["policy"]) == ALL_POLICIES.split(",")
    redo = json.loads((out / "reports" / "validation_mix.json").read_text())
    row = table[table["policy"] == "srpt"].iloc[0]
    assert row["e2e_median_err"] == redo["policies"]["srpt"]["sims"]["calibrated"]["e2e_s"]["median_rel_err"]
    assert np.isfinite(row["floor_e2e_median"]) and np.isfinite(row["step_sum_ratio"])
    assert (table["e2e_gain"] > 0).all()            # every cell's E2E moves when every price does
    kinds = pd.read_parquet(out / "step_kinds.parquet")
    allk = kinds[(kinds["policy"] == "vllm") & (kinds["kind"] == "all")].iloc[0]
    assert allk["sum_ratio"] == pytest.approx(table[table["policy"] == "vllm"].iloc[0]["step_sum_ratio"])
    diffs = pd.read_parquet(out / "policy_diff.parquet")
    assert len(diffs) == 9 * 8 // 2 * 5
    assert diffs["sim_band"].notna().all() and (diffs["sim_band"] >= 0).all()    # every pair simulated at +-1%
    div = json.loads((out / "divergence.json").read_text())
    assert div[0]["policy"] == "vllm" and div[0]["num_real_rows"] > 0 and div[0]["num_sim_rows"] > 0
    assert (out / "generalize.md").read_text().count("\n") == 2 + 9
    assert (out / "generalize.png").stat().st_size > 0
    summary = json.loads((out / "generalize.json").read_text())["summary"]
    assert summary["num_cells"] == 9 and set(summary["e2e_median_err_by_workload"]) == {"mix"}
    assert summary["cells_e2e_goal"] == int((table["e2e_median_err"].abs() <= 0.03).sum())
    assert summary["e2e_median_err_max"] == table["e2e_median_err"].abs().max()
    # synchronous runs record no launch times: no TTFT split by launch stall
    assert table["requests_near_stalls"].isna().all() and summary["cells_ttft_p50_goal_away_from_stalls"] is None


def test_e2e_gain_is_the_e2e_change_per_unit_of_price_bias():
    """1 where a request pays only its own steps (every E2E 1% longer), more where a queue compounds them; requests
    the biased run lacks are left out, and a fragile cell is named in the summary line."""
    from types import SimpleNamespace

    from experiments.generalize import FRAGILE_GAIN, e2e_gain, suite_summary, summary_line
    run = lambda e2e: SimpleNamespace(requests=pd.DataFrame(dict(request_id=range(len(e2e)), e2e_s=e2e)))  # noqa: E731
    base = run([1.0, 2.0, 4.0])
    assert e2e_gain(base, run([1.01, 2.02, 4.04]), 0.01) == pytest.approx(1.0)
    assert e2e_gain(base, run([1.05, 2.10, 4.40]), 0.01) == pytest.approx(5.0)      # median of 5, 5, 10 %
    assert e2e_gain(base, run([1.02, 2.04]), 0.01) == pytest.approx(2.0)             # request 2 not in both
    table = pd.DataFrame([dict(workload="w", policy=p, e2e_median_err=0.01, floor_e2e_median=0.0, step_sum_ratio=1.0,
                               meets_e2e_goal=True, meets_step_sum_goal=True, meets_quantile_goal=True,
                               ttft_q50_err=0.0, ttft_q90_err=0.0, ttft_q99_err=0.0, e2e_q50_err=0.0,
                               e2e_q90_err=0.0, e2e_q99_err=0.0, e2e_gain=g)
                          for p, g in (("a", 1.2), ("b", FRAGILE_GAIN + 1))])
    s = suite_summary(table)
    assert s["fragile_cells"] == ["w:b"] and "fragile" in summary_line(s) and "w:b" in summary_line(s)


def test_workload_argv_drops_engine_flags_and_reroots_traces():
    from experiments.saved_runs import workload_argv
    saved = ["--model", "/tmp/m", "--device", "cuda", "--trace", "/device/data/t.jsonl", "--max-requests", "5",
             "--record-decisions", "--repeats", "2", "--real-dir", "/x", "--policies", "vllm", "--no-roofline"]
    assert workload_argv(saved, "../shared/traces") == ["--trace", "../shared/traces/t.jsonl", "--max-requests",
                                                        "5", "--policies", "vllm"]


def _s(**kw):
    return dict(kw)


def test_policy_difference_logic_by_hand():
    # A: e2e p50 1.0 / 1.1 over two repeats, B: 1.5 / 1.5 -> d = (1.5 - 1.05) / 1.05
    real_a, real_b = [_s(e2e_s_p50=1.0), _s(e2e_s_p50=1.1)], [_s(e2e_s_p50=1.5), _s(e2e_s_p50=1.5)]
    r = pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=2.8), "e2e_s_p50")
    d = 0.45 / 1.05
    assert r["real_diff"] == pytest.approx(d)
    assert r["noise_band"] == pytest.approx(max(abs(0.5 - d), abs(0.4 / 1.1 - d)))
    assert r["real_significant"] and r["sim_diff"] == pytest.approx(0.4)
    assert r["sign_agrees"] and r["size_agrees"] and r["verdict"] == "agree" and r["ok"]
    # the right sign, a size off by more than a third
    r = pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=2.2), "e2e_s_p50")
    assert r["verdict"] == "sign only" and not r["ok"]
    # the wrong sign
    r = pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=1.0), "e2e_s_p50")
    assert r["verdict"] == "wrong sign"
    # a simulated difference inside the noise band is "no difference", not a ranking
    r = pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=2.05), "e2e_s_p50")
    assert r["sim_no_difference"] and r["verdict"] == "sim: no difference" and not r["ok"]
    # a real difference below twice its band: nothing to rank; a simulated "no difference" is right
    noisy_a, noisy_b = [_s(e2e_s_p50=1.0), _s(e2e_s_p50=1.4)], [_s(e2e_s_p50=1.3), _s(e2e_s_p50=1.3)]
    r = pair_difference(noisy_a, noisy_b, _s(e2e_s_p50=1.0), _s(e2e_s_p50=1.0), "e2e_s_p50")
    assert not r["real_significant"] and r["verdict"] == "real: no difference" and r["ok"]
    # the simulator's own band: the same pair under prices 1% longer / shorter moves from +40% to +10% / +45%
    r = pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=2.8), "e2e_s_p50",
                        [_s(e2e_s_p50=2.0), _s(e2e_s_p50=2.0)], [_s(e2e_s_p50=2.2), _s(e2e_s_p50=2.9)])
    assert r["sim_band"] == pytest.approx(0.3) and not r["sim_within_own_band"] and r["verdict"] == "agree"
    # ... and a prediction its own 1% uncertainty flips is no ranking, whatever the real band says
    r = pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=2.8), "e2e_s_p50",
                        [_s(e2e_s_p50=2.0)], [_s(e2e_s_p50=1.9)])
    assert r["sim_band"] == pytest.approx(0.45) and r["sim_within_own_band"]
    assert r["verdict"] == "sim: no difference" and not r["ok"]
    assert np.isnan(pair_difference(real_a, real_b, _s(e2e_s_p50=2.0), _s(e2e_s_p50=2.8), "e2e_s_p50")["sim_band"])
    # two real runs with the very same value: a band of 0 does not make a 0.01% difference a ranking
    r = pair_difference([_s(x=1.0), _s(x=1.0)], [_s(x=1.0001), _s(x=1.0001)], _s(x=1.0), _s(x=0.9999), "x")
    assert r["noise_band"] == pytest.approx(0.0, abs=1e-12) and not r["real_significant"]
    assert r["verdict"] == "real: no difference" and r["sim_no_difference"] and r["ok"]
    r = pair_difference([_s(x=1.0), _s(x=1.0)], [_s(x=1.01), _s(x=1.01)], _s(x=1.0), _s(x=1.0005), "x")
    assert r["real_significant"] and r["verdict"] == "sim: no difference"
    df = policy_differences({"a": real_a, "b": real_b}, {"a": _s(e2e_s_p50=2.0), "b": _s(e2e_s_p50=2.8)},
                            metrics=("e2e_s_p50",), perturbed={"a": [_s(e2e_s_p50=2.0)], "b": [_s(e2e_s_p50=1.9)]})
    assert df["sim_within_own_band"].tolist() == [True]
    df = policy_differences({"a": real_a, "b": real_b, "c": noisy_b}, {"a": _s(e2e_s_p50=2.0)},
                            metrics=("e2e_s_p50",))
    assert list(zip(df["policy_a"], df["policy_b"])) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert set(df["verdict"]) == {"no simulation"}


def _dec(rows):
    return pd.DataFrame(rows, columns=["step", "start_time_s", "prefill_ids", "preempted_ids", "swapped_out_ids",
                                       "swapped_in_ids"])


def test_first_divergence_names_its_cause():
    base = [(0, 0.00, "a", "", "", ""), (5, 0.10, "b", "", "", "")]
    real = _dec(base + [(9, 0.20, "c d", "", "", ""), (20, 0.5, "", "c", "", "")])
    # d arrives at 0.195: in time for the real step at 0.20, not for the simulated one at 0.19
    sim = _dec(base + [(9, 0.19, "c", "", "", ""), (10, 0.21, "d", "", "", "")])
    arrivals = {"a": 0.0, "b": 0.09, "c": 0.15, "d": 0.195}
    out = first_divergence(real, sim, arrivals)
    assert out["diverged"] and out["index"] == 2 and out["cause"] == "arrival boundary"
    assert out["prefill_only_real"] == ["d"] and out["arrived_between"] == ["d"] and out["num_matched"] == 2
    assert out["drift_s"] == pytest.approx(-0.01) and out["drift_s_at_last_match"] == 0.0
    # a preemption after a different number of decode steps: time drift through the state
    sim2 = _dec(base + [(9, 0.20, "c d", "", "", ""), (18, 0.45, "", "d", "", "")])
    out = first_divergence(real, sim2, arrivals)
    assert out["cause"] == "step count" and out["steps_since_match_real"] == 11 and out["steps_since_match_sim"] == 9
    # the same step count and no arrival to blame: a different decision
    sim3 = _dec(base + [(9, 0.20, "c d", "", "", ""), (20, 0.5, "", "d", "", "")])
    assert first_divergence(real, sim3, arrivals)["cause"] == "different decision"
    # a more important request arriving in between changes whom the policy admits: still time drift
    real4 = _dec(base + [(9, 0.20, "c d", "", "", ""), (20, 0.50, "f", "", "", "")])
    sim4 = _dec(base + [(9, 0.20, "c d", "", "", ""), (20, 0.52, "e", "f", "", "")])
    out = first_divergence(real4, sim4, {**arrivals, "f": 0.3, "e": 0.51})
    assert out["cause"] == "arrival boundary" and out["arrived_between"] == ["e"]
    assert first_divergence(real, real, arrivals) == {
        "diverged": False, "num_matched": 4, "num_real_rows": 4, "num_sim_rows": 4, "drift_s_at_last_match": 0.0,
        "max_abs_drift_s_before": 0.0}
    assert first_divergence(real, real.iloc[:3], arrivals)["cause"] == "length"


def test_two_simulated_clocks_part_ways_and_the_recorder_says_where():
    """A forced divergence end to end: the same requests under two step-time scales, decisions recorded."""
    from engine.core.recorder import Recorder
    from engine.core.scheduler import SchedulerConfig
    from experiments.validate import simulate
    from experiments.workloads import Poisson, Uniform, synthetic_workload
    from sim.cost_model.base import CostModel

    class Scaled(CostModel):
        def __init__(self, scale):
            self.scale = scale

        def step_time_from_shape(self, prefill_new_tokens, prefill_context_lens, num_decode_seqs,
                                 decode_context_sum, num_swap_blocks=0, num_prefill_samples=None, block_size=16):
            return self.scale * (1e-3 + 2e-6 * (sum(prefill_new_tokens) + num_decode_seqs))

    specs = synthetic_workload(40, Poisson(200.0), Uniform(16, 64), Uniform(8, 32), seed=1).specs()
    cfg = SchedulerConfig(num_kvcache_blocks=24, max_model_len=256)
    fast = simulate(specs, "vllm", Scaled(1.0), cfg, 1000, record_decisions=True)
    slow = simulate(specs, "vllm", Scaled(1.6), cfg, 1000, record_decisions=True)
    assert list(fast.decisions.columns) == ["step", "start_time_s", "prefill_ids", "preempted_ids",
                                            "swapped_out_ids", "swapped_in_ids"]
    prefilled = {i for ids in fast.decisions["prefill_ids"] for i in ids.split()}
    assert prefilled == {str(s.request_id) for s in specs}              # every request got prefill work
    out = first_divergence(fast.decisions, slow.decisions, {s.request_id: s.arrival_time_s for s in specs})
    assert out["diverged"] and out["cause"] in ("arrival boundary", "step count")
    assert first_divergence(fast.decisions, fast.decisions, {})["diverged"] is False
    with pytest.raises(ValueError, match="record_decisions"):
        Recorder().decisions_frame()


def test_overrides_reach_both_sides_of_a_validation(tiny, tmp_path):
    """--override composes the policy groups as `servelab` would: the victim and the eviction policy
    given there run in the engine replay and in the simulator alike; --cost-model prices with a
    conf/backend/cost_model option, its parameters overridden the same way."""
    from experiments import validate
    from experiments.policy_conf import make_eviction, make_policy
    assert make_policy("srpt", ["victim=most_blocks"]).victim.name == "most_blocks"
    assert make_policy("srpt").victim.name == "newest" and make_eviction().name == "lru"
    assert make_eviction(["eviction=fifo"]).name == "fifo"
    wl = ["--num-requests", "6", "--arrival", "poisson", "--rate-rps", "30", "--prompt-len", "8:64",
          "--output-len", "4:16", "--max-model-len", "256", "--num-kvcache-blocks", "16", "--num-cpu-blocks", "32",
          "--policies", "srpt,mlfq,sarathi", "--override", "victim=most_blocks", "--override", "eviction=fifo",
          "--cost-model", "constant", "--override", "backend.cost_model.step_s=0.002"]
    assert validate.main(["--model", str(tiny), "--device", "cpu", "--out-dir", str(tmp_path), "--name", "ov", *wl,
                          "--max-wall-s", "60", "--no-plot"]) == 0
    report = json.loads((tmp_path / "validation_ov.json").read_text())
    for p in ("srpt", "mlfq", "sarathi"):
        entry = report["policies"][p]
        assert entry["real"]["summary"]["num_finished"] == 6, p
        for info in (entry["real"]["info"], entry["sims"]["roofline"]["info"], entry["sims"]["constant"]["info"]):
            assert (info["victim"], info["eviction"]) == ("most_blocks", "fifo"), (p, info)
        steps = entry["sims"]["constant"]["steps"]         # conf/backend/cost_model/constant.yaml, step_s given
        assert steps["busy_s_sim"] == pytest.approx(0.002 * steps["sim"])


def test_a_quantile_counts_within_its_real_vs_real_floor():
    """table_row: a quantile error above the 3% goal still counts when the real runs' own quantiles sit further
    apart (quantiles_within_goal_or_floor), never when the floor is unknown; the strict goal is unchanged, and the
    summary counts both and the cells whose real TTFT quantiles repeat within 3%."""
    from experiments.generalize import suite_summary, summary_line, table_row

    def report(ttft_p99):
        q = lambda p99: {"median_rel_err": 0.01, "p90_rel_err": 0.02,      # noqa: E731
                         "quantile_rel_err": {"p50": 0.01, "p90": 0.02, "p99": p99}}
        return {"ttft_s": q(ttft_p99), "e2e_s": q(0.01), "tpot_s": q(0.0), "throughput": {"rel_err": 0.0},
                "step_time": {"sum_pred_over_real": 1.0, "median_rel_err": 0.0}, "preemptions": {"real": 0, "sim": 0}}
    floor = {f"floor_{m}_q{q}": 0.0 for m in ("ttft", "e2e") for q in ("50", "90")}
    noisy = table_row("w", "a", report(0.05), {**floor, "floor_ttft_q99": 0.06, "floor_e2e_q99": 0.0})
    tight = table_row("w", "b", report(0.05), {**floor, "floor_ttft_q99": 0.04, "floor_e2e_q99": 0.0})
    unknown = table_row("w", "c", report(0.05), {})
    assert noisy["quantiles_within_goal_or_floor"] and not noisy["meets_quantile_goal"]
    assert not tight["quantiles_within_goal_or_floor"] and not unknown["quantiles_within_goal_or_floor"]
    import pandas as pd
    s = suite_summary(pd.DataFrame([noisy, tight, unknown]).assign(e2e_gain=1.0))
    assert s["cells_quantiles_goal_or_floor"] == 1 and s["cells_ttft_quantiles_goal"] == 0
    assert s["cells_real_ttft_quantiles_repeat"] == 0          # floors 6% and 4%; the unknown one is NaN
    assert "real-vs-real floor 1/3" in summary_line(s)


def test_a_quantile_miss_inside_the_simulators_own_band_is_counted_apart():
    """with_quantile_bands: the band on a quantile is its largest relative move under the perturbed simulations;
    a 5% TTFT p99 error counts as within goal, floor or band when the p99 itself moves 6% with every price +-1%,
    not when it moves 4%; the summary counts the misses and how many of them sit inside the band."""
    from experiments.generalize import suite_summary, summary_line, table_row, with_quantile_bands

    rep = {"ttft_s": {"median_rel_err": 0.0, "p90_rel_err": 0.0, "quantile_rel_err": {"p50": 0.0, "p90": 0.0,
                                                                                       "p99": -0.05}},
           "e2e_s": {"median_rel_err": 0.0, "p90_rel_err": 0.0, "quantile_rel_err": {"p50": 0.0, "p90": 0.0,
                                                                                      "p99": 0.0}},
           "throughput": {"rel_err": 0.0}, "step_time": {"sum_pred_over_real": 1.0}}
    sim = {f"{m}_s_p{q}": 1.0 for m in ("ttft", "e2e") for q in ("50", "90", "99")}
    wide = with_quantile_bands(table_row("w", "a", rep, {}), sim, [dict(sim, ttft_s_p99=1.06), dict(sim)])
    narrow = with_quantile_bands(table_row("w", "b", rep, {}), sim, [dict(sim, ttft_s_p99=0.96), dict(sim)])
    assert wide["sim_band_ttft_q99"] == pytest.approx(0.06) and narrow["sim_band_ttft_q99"] == pytest.approx(0.04)
    assert wide["sim_band_e2e_q50"] == 0.0
    assert wide["quantiles_within_goal_floor_or_band"] and not narrow["quantiles_within_goal_floor_or_band"]
    assert not wide["quantiles_within_goal_or_floor"]            # the floor rule alone is unchanged
    s = suite_summary(pd.DataFrame([wide, narrow]).assign(e2e_gain=1.0))
    assert s["ttft_quantile_misses_inside_sim_band"] == [2, 1] and s["e2e_quantile_misses_inside_sim_band"] == [0, 0]
    assert s["cells_quantiles_goal_floor_or_band"] == 1
    assert "inside the simulator's own band: TTFT 1 of 2" in summary_line(s)
    assert s["quantile_misses_rank_pts"] is None        # reports saved before the rank columns


def test_quantile_misses_are_placed_in_the_real_distribution():
    """table_row copies each quantile's rank shift (percentile points); the summary counts the misses beyond 3%
    whose simulated value sits within RANK_PTS of the real quantile, and gives the largest shift among misses."""
    from experiments.generalize import RANK_PTS, suite_summary, summary_line, table_row

    def rep(ttft_p90, pts):
        q = lambda err, p: {"median_rel_err": 0.0, "p90_rel_err": 0.0,                      # noqa: E731
                            "quantile_rel_err": {"p50": 0.0, "p90": err, "p99": 0.0},
                            "quantile_rank_pts": {"p50": 0.0, "p90": p, "p99": 0.0}}
        return {"ttft_s": q(ttft_p90, pts), "e2e_s": q(0.0, 0.0), "throughput": {"rel_err": 0.0},
                "step_time": {"sum_pred_over_real": 1.0}}
    rows = [table_row("w", "near", rep(0.20, -0.5), {}), table_row("w", "far", rep(-0.10, -3.0), {}),
            table_row("w", "ok", rep(0.02, 2.5), {})]
    assert rows[1]["ttft_q90_rank_pts"] == -3.0 and rows[0]["e2e_q99_rank_pts"] == 0.0
    s = suite_summary(pd.DataFrame(rows).assign(e2e_gain=1.0))
    assert RANK_PTS == 1.0 and s["quantile_misses_rank_pts"] == [2, 1, 3.0]   # the 2.5-point cell is no miss
    assert "of the 2 quantiles beyond 3%, 1 sit within 1 percentile point(s) of the real one (largest shift 3.0" \
        in summary_line(s)


def test_step_kinds_split_mixed_steps_by_the_decodes_riding_their_chunk(monkeypatch):
    """Mixed steps fall in exactly one riding-decode bin (1-2, 3-8, 9+), with their own real and predicted sums;
    decode and prefill steps in none."""
    from experiments import step_tables
    st = pd.DataFrame({"num_prefill_seqs": [0, 1, 1, 1, 1, 1], "num_decode_seqs": [5, 0, 1, 2, 3, 9],
                       "num_prefill_tokens": [0, 512, 500, 500, 500, 500], "num_swap_blocks": [0] * 6,
                       "num_prefill_samples": [0, 1, 0, 1, 0, 1],
                       "duration_s": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    pred = np.array([1.0, 2.0, 3.3, 4.4, 5.0, 12.0])
    monkeypatch.setattr(step_tables, "priced_steps", lambda steps, cm, overlapped=False: (steps, pred))
    from experiments.generalize import step_kinds
    kinds = step_kinds(st, None).set_index("kind")
    assert kinds.loc["mixed, 1-2 decodes riding", "num_steps"] == 2
    assert kinds.loc["mixed, 1-2 decodes riding", "sum_ratio"] == pytest.approx(7.7 / 7.0)
    assert kinds.loc["mixed, 3-8 decodes riding", "sum_ratio"] == pytest.approx(1.0)
    assert kinds.loc["mixed, 9-max decodes riding", "real_s"] == 6.0
    assert kinds.loc["mixed", "num_steps"] == 4


def test_step_kinds_set_the_steps_by_a_launch_stall_apart(monkeypatch):
    """An overlapped run: a step whose launch took more than STALL_MARGIN_S beyond the cost model's host seconds
    before it (after the run's median excess, a constant), and the step before it (its row waits for that launch),
    are 'near a launch stall', the rest 'away'; the two split 'all'. A long launch the model expects (step 1) is no
    stall, nor is a constant offset. A synchronous run, one without launch_host_s or one without stalls gets
    neither row."""
    from experiments import step_tables
    from experiments.generalize import step_kinds
    from experiments.launch_stalls import STALL_MARGIN_S, near_launch_stalls
    launch = np.array([0.5e-3, 2.5e-3, 0.5e-3, 0.6e-3, 4.0e-3, 0.5e-3])
    expected = np.array([0.5e-3, 2.4e-3, 0.5e-3, 0.5e-3, 0.5e-3, 0.5e-3])     # step 1: a long prefill's launch
    st = pd.DataFrame({"num_prefill_seqs": [0] * 6, "num_decode_seqs": [8] * 6, "num_prefill_tokens": [0] * 6,
                       "num_swap_blocks": [0] * 6, "num_prefill_samples": [0] * 6,
                       "duration_s": [2.0, 2.0, 2.0, 6.0, 3.0, 2.0], "launch_host_s": launch})
    assert near_launch_stalls(st, expected).tolist() == [False, False, False, True, True, False]
    assert not near_launch_stalls(st, expected, margin_s=4e-3).any() and STALL_MARGIN_S < 3.4e-3
    assert near_launch_stalls(st, expected - 0.4e-3).tolist() == near_launch_stalls(st, expected).tolist()
    assert not near_launch_stalls(st.assign(launch_host_s=np.nan), expected).any()       # not recorded: no stall
    pred = np.full(6, 2.0)
    monkeypatch.setattr(step_tables, "priced_steps", lambda steps, cm, overlapped=False: (steps, pred))

    class Model:
        def overlap_parts_table(self, steps):
            return expected[:len(steps)], None, None

    kinds = step_kinds(st, Model(), overlapped=True).set_index("kind")
    assert kinds.loc["near a launch stall", "sum_ratio"] == pytest.approx(4.0 / 9.0)
    assert kinds.loc["away from launch stalls", "sum_ratio"] == pytest.approx(1.0)
    assert kinds.loc["near a launch stall", "share_of_real"] == pytest.approx(9.0 / 17.0)
    assert "near a launch stall" not in step_kinds(st, Model())["kind"].tolist()
    assert "near a launch stall" not in step_kinds(st.drop(columns="launch_host_s"), Model(), True)["kind"].tolist()
    calm = st.assign(launch_host_s=expected)
    assert "near a launch stall" not in step_kinds(calm, Model(), overlapped=True)["kind"].tolist()
