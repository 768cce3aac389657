"""The simulator's own band (experiments/sim_band.py): a run with a fitted cost model simulated again at every price
1 +- price_band, the summary's sim_band, and servelab-report's differences.csv with its verdicts."""
import math
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from experiments.report import collect, make_report
from experiments.run import execute, format_summary
from experiments.sim_band import band_section, count_line, differences, pair_difference
from sim.cost_model.calibrated import PRICE_BAND, CalibratedCostModel

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "benchmarks/results/profile_h200_qwen3_0p6b.json"
CAL = ["model=qwen3_0p6b", "backend/cost_model=calibrated", f"backend.cost_model.profile={FIT}", "progress=false",
       "plots=false", "print_summary=false", "workload.num_requests=60", "workload/prompt_len=uniform",
       "workload.prompt_len.lo=100", "workload.prompt_len.hi=2000"]


def band(scales, a_values, b_values):
    return {"price_band": 0.01, "scales": scales, "metrics": [{"e2e_s_p50": v} for v in a_values]}, \
           {"price_band": 0.01, "scales": scales, "metrics": [{"e2e_s_p50": v} for v in b_values]}


def test_a_difference_the_band_can_flip_is_no_difference():
    # d = +10%; at x1.01 the pair differs by +20%, at x0.99 by 0%: the prediction moves 10 points, as much as itself
    ba, bb = band([1.01, 0.99], [1.0, 1.0], [1.2, 1.0])
    row = pair_difference({"e2e_s_p50": 1.0}, {"e2e_s_p50": 1.1}, "e2e_s_p50", ba, bb)
    assert row["diff"] == pytest.approx(0.1) and row["sim_band"] == pytest.approx(0.1)
    assert row["verdict"] == "no difference" and row["better"] == ""


def test_a_difference_outside_the_band_is_ranked_with_the_metric_direction():
    ba, bb = band([1.01, 0.99], [1.0, 1.0], [1.12, 1.08])
    row = pair_difference({"e2e_s_p50": 1.0}, {"e2e_s_p50": 1.1}, "e2e_s_p50", ba, bb)
    assert row["sim_band"] == pytest.approx(0.02) and row["verdict"] == "B higher" and row["better"] == "A"
    tput = pair_difference({"output_throughput_tps": 100.0}, {"output_throughput_tps": 110.0},
                           "output_throughput_tps", None, None)
    assert tput["verdict"] == "B higher" and tput["better"] == "B"      # higher throughput wins
    assert math.isnan(tput["sim_band"]) and not tput["band_known"]      # no band: ranked, and it says so


def test_resolution_and_mismatched_scales():
    assert pair_difference({"m": 1.0}, {"m": 1.0005}, "m", None, None)["verdict"] == "no difference"
    ba, bb = band([1.01, 0.99], [1.0, 1.0], [1.2, 1.0])
    bb["scales"] = [1.02, 0.98]            # bands made at other price scales are not comparable
    assert math.isnan(pair_difference({"e2e_s_p50": 1.0}, {"e2e_s_p50": 1.1}, "e2e_s_p50", ba, bb)["sim_band"])


def test_band_section_is_the_largest_relative_move():
    s = band_section(0.01, {"ttft_s_p50": 2.0, "num_finished": 10, "note": "x"},
                     [(1.01, {"ttft_s_p50": 2.1, "num_finished": 10}), (0.99, {"ttft_s_p50": 1.7, "num_finished": 10})])
    assert s["relative"] == {"ttft_s_p50": pytest.approx(0.15), "num_finished": 0.0}
    assert s["scales"] == [1.01, 0.99] and s["metrics"][1]["ttft_s_p50"] == 1.7


def test_differences_pairs_runs_at_the_same_rate():
    df = pd.DataFrame({"run_dir": ["a5", "b5", "a9"], "policy": ["fcfs", "vllm", "fcfs"],
                       "request_rate_rps": [5.0, 5.0, 9.0], "e2e_s_p50": [1.0, 2.0, 3.0]})
    d = differences(df, {}, metrics=("e2e_s_p50",))
    assert d[["request_rate_rps", "a", "b", "verdict", "better"]].values.tolist() == [[5.0, "fcfs", "vllm",
                                                                                        "B higher", "A"]]


def test_yaml_default_is_the_model_default():
    text = (ROOT / "conf/backend/cost_model/calibrated.yaml").read_text()
    assert f"price_band: {PRICE_BAND}" in text.splitlines()
    assert CalibratedCostModel(profile=FIT).price_band == PRICE_BAND
    with pytest.raises(ValueError, match="backend.cost_model.price_band"):
        CalibratedCostModel(profile=FIT, price_band=-0.1)


@pytest.fixture(autouse=True, scope="module")
def hydra_conf():
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        yield


def run(out, *overrides, scheduler="vllm"):
    cfg = compose("config", overrides=[*CAL, f"scheduler={scheduler}", *overrides])
    return execute(cfg, out, choices={"scheduler": scheduler}, overrides=[f"scheduler={scheduler}", *overrides])


def test_a_calibrated_run_records_its_band(tmp_path, capsys):
    s = run(tmp_path / "run", "workload.arrival.rate_rps=2")
    b = s["sim_band"]
    assert b["price_band"] == PRICE_BAND and b["scales"] == [1 + PRICE_BAND, 1 - PRICE_BAND]
    # at 2 req/s nothing queues: a decode step, and so TPOT p50, is 1% longer at x1.01 and 1% shorter at x0.99
    tpot = s["metrics"]["tpot_s_p50"]
    assert b["metrics"][0]["tpot_s_p50"] / tpot == pytest.approx(1.01, abs=2e-3)
    assert b["metrics"][1]["tpot_s_p50"] / tpot == pytest.approx(0.99, abs=2e-3)
    assert b["relative"]["tpot_s_p50"] == pytest.approx(0.01, abs=2e-3)
    assert b["metrics"][0]["num_finished"] == s["metrics"]["num_finished"] == 60
    assert "simulator's band" not in capsys.readouterr().out          # print_summary=false
    line = next(x for x in format_summary(s).splitlines() if x.startswith("simulator's band"))
    assert "every step price +-1% moves TTFT p50" in line


@pytest.mark.parametrize("overrides", [[*CAL, "backend.cost_model.price_band=0"], [*CAL[:1], *CAL[3:]]])
def test_no_band_without_a_fitted_price_band(tmp_path, overrides):
    cfg = compose("config", overrides=overrides)             # price_band 0; the roofline
    s = execute(cfg, tmp_path / "run")
    assert "sim_band" not in s and s["meta"].get("price_band") is None


def test_report_differences_use_the_band(tmp_path):
    for sched in ("fcfs", "sjf"):
        run(tmp_path / "sw" / sched, "workload.arrival.rate_rps=30", "num_kvcache_blocks=400", scheduler=sched)
    df = collect(tmp_path / "sw")
    assert (df["e2e_s_p50_sim_band"] > 0).all()
    _, files = make_report(tmp_path / "sw")
    assert tmp_path / "sw" / "report" / "differences.csv" in files
    diff = pd.read_csv(tmp_path / "sw" / "report" / "differences.csv")
    assert diff["band_known"].all() and set(diff["a"]) == {"fcfs"} and set(diff["b"]) == {"sjf"}
    e2e = diff.set_index("metric").loc["e2e_s_p50"]
    assert e2e["diff"] == pytest.approx(e2e["value_b"] / e2e["value_a"] - 1)
    inside = (diff["diff"].abs() <= diff["sim_band"]) | (diff["diff"].abs() <= 1e-3)
    assert ((diff["verdict"] == "no difference") == inside).all()


def test_with_two_varying_keys_only_pairs_that_differ_in_one_are_compared():
    df = pd.DataFrame({"run_dir": ["a0", "b0", "a1", "b1"], "policy": ["a,0", "b,0", "a,1", "b,1"],
                       "scheduler": ["a", "b", "a", "b"], "seed": [0, 0, 1, 1], "e2e_s_p50": [1.0, 2.0, 1.5, 2.5]})
    d = differences(df, {}, x=None, metrics=("e2e_s_p50",), keys=["scheduler", "seed"])
    assert sorted(zip(d["a"], d["b"], d["differs_in"])) == [("a,0", "a,1", "seed"), ("a,0", "b,0", "scheduler"),
                                                            ("a,1", "b,1", "scheduler"), ("b,0", "b,1", "seed")]
    assert len(differences(df, {}, x=None, metrics=("e2e_s_p50",))) == 6          # no keys: every pair


def test_the_count_line_says_how_many_rankings_lack_a_band():
    d = pd.DataFrame({"verdict": ["B faster", "B slower", "no difference"], "band_known": [True, False, True]})
    assert count_line(d).endswith(", 1 of the ranked without a band (cost model without price_band)")
    assert count_line(d.assign(band_known=False)).endswith(", none of them with a band (cost model without "
                                                           "price_band)")
    assert "without" not in count_line(d.assign(band_known=True)) and count_line(d.iloc[:0]) == "no pairs to compare"
