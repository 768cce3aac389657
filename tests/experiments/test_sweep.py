"""A tiny sweep end to end (2 rates x 2 schedulers), its report, and a relaunch that skips finished jobs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.report import collect, make_report

ROOT = Path(__file__).resolve().parents[2]


def sweep(tmp_path, *extra):
    cmd = [sys.executable, "-m", "experiments.run", "-m", "experiment=smoke", "workload.num_requests=20",
           "scheduler=fcfs,vllm", "workload.arrival.rate_rps=5,50", f"hydra.sweep.dir={tmp_path / 'sw'}",
           "progress=false", "print_summary=false", "plots=false", *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def run_ids(sweep_dir):
    return {p.parent.name: json.loads(p.read_text())["run_id"] for p in sweep_dir.rglob("summary.json")}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    sweep(tmp, "hydra/launcher=local", "hydra.launcher.n_jobs=2")      # the default launcher (joblib)
    return tmp


def test_sweep_writes_one_folder_per_job_keyed_by_overrides(swept):
    ids = run_ids(swept / "sw")
    assert sorted(ids) == [f"scheduler={s},workload.arrival.rate_rps={r},workload.num_requests=20"
                           for s in ("fcfs", "vllm") for r in (5, 50)]
    assert len(set(ids.values())) == 4


def test_report_collects_and_plots(swept, capsys):
    df = collect(swept / "sw")
    assert len(df) == 4 and sorted(df["policy"].unique()) == ["fcfs", "vllm"]
    assert sorted(df["request_rate_rps"].unique()) == [5.0, 50.0]
    assert (df["num_finished"] == 20).all() and (df["workload.num_requests"] == 20).all()
    # the same workload draws for both policies (one root seed): same offered load per rate
    assert df.groupby("request_rate_rps")["measured_rate_rps"].nunique().eq(1).all()
    _, files = make_report(swept / "sw")
    names = {f.name for f in files}
    assert {"overview.png", "throughput_latency_ttft_s.png", "latency_cdf_ttft_s.png", "results.csv",
            "step_timeline_fcfs.png"} <= names
    assert all(f.stat().st_size > 0 for f in files)


def test_relaunch_runs_only_unfinished_jobs(swept):
    before = run_ids(swept / "sw")
    redo = "scheduler=vllm,workload.arrival.rate_rps=50,workload.num_requests=20"
    (swept / "sw" / redo / "summary.json").unlink()
    out = sweep(swept, "hydra/launcher=basic")
    after = run_ids(swept / "sw")
    ran = [k for k in after if after[k] != before.get(k)]
    assert ran == [redo] and out.count("[skip]") == 3


def test_report_command_line(swept):
    proc = subprocess.run([sys.executable, "-m", "experiments.report", str(swept / "sw"), "--out",
                           str(swept / "rep")], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "4 runs" in proc.stdout and (swept / "rep" / "overview.png").is_file()


def test_report_of_an_empty_folder_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="no complete runs"):
        collect(tmp_path)
