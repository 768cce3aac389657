"""The concerns a calibrated file's own metadata raises: the device model's held-out bias, a drifting replay."""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from sim.cost_model.fit_trust import DEVICE_BIAS_WARN, REPLAY_DRIFT_WARN, fit_concerns, fit_warning

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "benchmarks/results/profile_h200_qwen3_0p6b.json"


def meta(dev_sum=None, drift=None):
    m = {}
    if dev_sum is not None:
        m["device_heldout"] = {"sum_pred_over_real": dev_sum, "median_rel_err": 0.008}
    if drift is not None:
        m["replay_drift"] = {"calib_a.parquet": {"range": 0.01, "tenths": [0.0] * 10},
                             "calib_b.parquet": {"range": drift, "tenths": [0.0] * 10}}
    return m


def test_a_device_model_off_its_own_held_out_steps_is_a_concern_either_way():
    (short,) = fit_concerns(meta(dev_sum=0.974))
    assert "0.974 of their seconds" in short and "2.6% short" in short
    (long,) = fit_concerns(meta(dev_sum=1.02))
    assert "1.020" in long and "2.0% long" in long
    assert fit_concerns(meta(dev_sum=1 - DEVICE_BIAS_WARN + 0.001)) == []
    assert fit_concerns(meta(dev_sum=1 + DEVICE_BIAS_WARN - 0.001)) == []


def test_host_drift_concerns_synchronous_runs_only_and_names_the_worst_replay():
    (line,) = fit_concerns(meta(drift=0.087))
    assert "8.7%" in line and "calib_b.parquet" in line
    assert fit_concerns(meta(drift=0.087), overlapped=True) == []
    assert fit_concerns(meta(drift=REPLAY_DRIFT_WARN - 0.001)) == []


def test_files_without_those_numbers_raise_nothing():
    assert fit_concerns(None) == [] and fit_concerns({}) == []
    assert fit_warning(fit_concerns({})) is None
    assert fit_concerns({"device_heldout": {"sum_pred_over_real": float("nan")}}) == []


def test_one_warning_line_carries_every_concern():
    line = fit_warning(fit_concerns(meta(dev_sum=0.97, drift=0.09)), "profile.json")
    assert line.startswith("WARNING: profile.json: ") and "\n" not in line
    assert "0.970" in line and "9.0%" in line


@pytest.fixture
def hydra_conf():
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        yield


def test_a_simulation_with_a_doubtful_fit_warns_and_records_it(tmp_path, capsys, hydra_conf):
    from experiments.run import execute
    data = json.loads(FIT.read_text())
    data["metadata"].update(meta(dev_sum=0.974, drift=0.087))
    doubtful = tmp_path / "doubtful.json"
    doubtful.write_text(json.dumps(data))
    base = ["model=qwen3_0p6b", "backend/cost_model=calibrated", f"backend.cost_model.profile={doubtful}",
            "progress=false", "plots=false", "workload.num_requests=20"]
    s = execute(compose("config", overrides=base), tmp_path / "sync")
    assert len(s["meta"]["cost_model_fit_concerns"]) == 2
    out = capsys.readouterr()
    warnings = [ln for ln in out.err.splitlines() if ln.startswith("WARNING")]
    assert len(warnings) == 1 and "0.974" in warnings[0] and "8.7%" in warnings[0]
    assert "cost-model doubts" in out.out and "2 (the WARNING above" in out.out
    saved = json.loads((tmp_path / "sync" / "summary.json").read_text())
    assert saved["meta"]["cost_model_fit_concerns"] == s["meta"]["cost_model_fit_concerns"]
    s = execute(compose("config", overrides=[*base, "overlap_scheduling=true"]), tmp_path / "overlap")
    (only,) = s["meta"]["cost_model_fit_concerns"]
    assert "0.974" in only
    (warning,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("WARNING")]
    assert "0.974" in warning and "8.7%" not in warning
    s = execute(compose("config", overrides=[*base[:2], f"backend.cost_model.profile={FIT}", *base[3:]]),
                tmp_path / "plain")
    assert s["meta"]["cost_model_fit_concerns"] == []
    out = capsys.readouterr()
    assert "WARNING" not in out.err and "cost-model doubts" not in out.out
