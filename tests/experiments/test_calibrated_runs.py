"""servelab with the calibrated cost model: coverage by the fitted envelope in summary.json, the printed summary
and a WARNING line; a file made for another model refused, or used and recorded with allow_mismatch=true."""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.run import execute
from sim.cost_model.base import CostModelError

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "benchmarks/results/profile_h200_qwen3_0p6b.json"
CAL = ["backend/cost_model=calibrated", f"backend.cost_model.profile={FIT}", "progress=false", "plots=false",
       "workload.num_requests=40", "workload/prompt_len=uniform"]


@pytest.fixture(autouse=True, scope="module")
def hydra_conf():
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        yield


def run(tmp_path, *overrides):
    return execute(compose("config", overrides=[*CAL, *overrides]), tmp_path / "run")


def test_inside_the_envelope_no_warning(tmp_path, capsys):
    s = run(tmp_path, "model=qwen3_0p6b", "workload.prompt_len.lo=100", "workload.prompt_len.hi=2000")
    cov = s["meta"]["cost_model_coverage"]
    assert cov["num_steps_outside"] == 0 and cov["num_steps"] == s["metrics"]["num_steps"]
    out = capsys.readouterr()
    assert "0.0% of steps, 0.0% of step time outside the fitted envelope" in out.out and "WARNING" not in out.err
    assert "cost_model_mismatch" not in s["meta"]


def test_long_prompts_beyond_the_envelope_are_counted_and_warned(tmp_path, capsys):
    s = run(tmp_path, "model=qwen3_0p6b", "max_model_len=8192", "workload.prompt_len.lo=5000",
            "workload.prompt_len.hi=7000")
    cov = s["meta"]["cost_model_coverage"]
    assert cov["share_steps_outside"] > 0.5 and cov["outside_by"]["max_prefill_context_tokens"] > 0
    steps = __import__("pandas").read_parquet(tmp_path / "run" / "steps.parquet")
    assert cov["num_steps_outside"] == int((steps["max_context_tokens"] > 4096).sum())
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "outside the envelope the calibrated cost model was fitted on" in warnings[0]
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["meta"]["cost_model_coverage"]["num_steps_outside"] == cov["num_steps_outside"]


def test_a_file_for_another_model_is_refused_or_used_on_request(tmp_path, capsys):
    with pytest.raises(CostModelError, match="fitted for Qwen3-0.6B-random on H200, not for this run's Qwen3-8B on "
                                             "H200"):
        run(tmp_path, "model=qwen3_8b")
    s = run(tmp_path, "model=qwen3_8b", "backend.cost_model.allow_mismatch=true", "name=brave")
    assert s["meta"]["cost_model_allow_mismatch"] is True
    assert s["meta"]["cost_model_mismatch"].startswith("model Qwen3-0.6B-random vs Qwen3-8B")
    out = capsys.readouterr()
    assert "made for another model or GPU" in out.out and "used anyway (allow_mismatch=true)" in out.err
