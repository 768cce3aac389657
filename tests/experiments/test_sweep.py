"""A tiny sweep end to end (2 rates x 2 schedulers), its report, and a relaunch that skips finished jobs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
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
    # every pair of policies at each rate; the roofline has no price band, so each ranking says it has none
    diff = __import__("pandas").read_csv(swept / "sw" / "report" / "differences.csv")
    assert sorted(set(zip(diff["request_rate_rps"], diff["a"], diff["b"]))) == [(5.0, "fcfs", "vllm"),
                                                                                  (50.0, "fcfs", "vllm")]
    assert not diff["band_known"].any() and not any(c.endswith("_sim_band") for c in df.columns)


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


def report_cli(*args):
    return subprocess.run([sys.executable, "-m", "experiments.report", *map(str, args)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)


def test_report_lists_the_runs_it_read_and_moves_an_earlier_reports_files_apart(swept):
    out = swept / "rep_stale"
    out.mkdir()
    (out / "step_timeline_srpt.png").write_bytes(b"from an earlier report of other runs")
    (out / "notes.txt").write_text("not the report's")
    proc = report_cli(swept / "sw", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"read 4 runs under {swept / 'sw'}:" in proc.stdout
    for job in run_ids(swept / "sw"):
        assert f"  {job}\n" in proc.stdout
    assert f"the earlier report there differs (other runs or options) and is kept in {swept / 'rep_stale.1'}\n" \
        in proc.stdout
    assert not (out / "step_timeline_srpt.png").exists() and (out / "notes.txt").exists()
    assert [p.name for p in (swept / "rep_stale.1").iterdir()] == ["step_timeline_srpt.png"]
    assert (out / "step_timeline_fcfs.png").is_file()


def test_a_report_never_overwrites_an_earlier_one_that_differs(swept, tmp_path):
    import shutil
    copy = tmp_path / "sw"
    shutil.copytree(swept / "sw", copy, ignore=shutil.ignore_patterns("report*"))
    report = copy / "report"

    def files(folder):
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}

    assert report_cli(copy).returncode == 0
    first = files(report)
    # the same runs again: the same files, byte for byte, so the report there is left as it was
    again = report_cli(copy)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == (
        f"4 runs; {report} already holds this report (the same {len(first)} files, left as they were)")
    assert files(report) == first
    # runs changed (one job deleted): the new report replaces the earlier, which is kept whole beside it
    shutil.rmtree(copy / "scheduler=vllm,workload.arrival.rate_rps=50,workload.num_requests=20")
    changed = report_cli(copy)
    assert changed.returncode == 0 and changed.stdout.splitlines()[-1].endswith(
        f"; the earlier report there differs (other runs or options) and is kept in {copy / 'report.1'}")
    assert files(copy / "report.1") == first
    assert len(pd.read_csv(report / "results.csv")) == 3
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith((".", "report"))) == ["report", "report.1"]


def test_report_names_the_runs_it_left_out(swept, tmp_path):
    import shutil
    copy = tmp_path / "sw"
    shutil.copytree(swept / "sw", copy)
    job = "scheduler=fcfs,workload.arrival.rate_rps=5,workload.num_requests=20"
    s = json.loads((copy / job / "summary.json").read_text())
    (copy / job / "summary.json").write_text(json.dumps({**s, "complete": False}))
    proc = report_cli(copy)
    assert proc.returncode == 0, proc.stderr
    assert f"read 3 runs under {copy} (left out 1 incomplete: {job}):" in proc.stdout


@pytest.mark.parametrize("flag, value, expected", [
    ("--x", "request_rate", "error: --x 'request_rate' is not a column of the sweep table; did you mean "
                            "'request_rate_rps'?"),
    ("--by", "polcy", "error: --by 'polcy' is not a column of the sweep table; did you mean 'policy'?"),
    # a part of a dotted override name finds it (difflib alone would offer 'router')
    ("--x", "rate", "error: --x 'rate' is not a column of the sweep table; did you mean 'workload.arrival.rate_rps'?"),
])
def test_report_unknown_column(swept, flag, value, expected):
    proc = report_cli(swept / "sw", "--out", swept / "rep_bad", flag, value)
    assert proc.returncode == 2 and proc.stderr.startswith(f"servelab-report: {expected}")
    assert proc.stderr.count("\n") == 1 and not (swept / "rep_bad").exists()


@pytest.fixture(scope="module")
def swept_fair(swept):
    """The sweep with fairness numbers in its summaries (as a sweep with tenants has): its table has those columns."""
    import shutil
    shutil.copytree(swept / "sw", swept / "sw_fair")
    for summary in (swept / "sw_fair").rglob("summary.json"):
        s = json.loads(summary.read_text())
        s["metrics"].update(jain_index_overall=0.8, jain_index=0.9)     # in the order a summary has them
        summary.write_text(json.dumps(s))
    return swept


@pytest.mark.parametrize("args, expected", [
    # a misspelt option (argparse alone says "unrecognized arguments" and prints its usage)
    (["sw_fair", "--bye", "policy"], "error: unrecognized argument '--bye'; did you mean '--by'? (options: --help, "
                                     "--out, --x, --by)"),
    (["sw_fair", "--X=scheduler"], "error: unrecognized argument '--X'; did you mean '--x'?"),
    # a misspelt sweep folder: each missing part matched among the folders beside it
    (["sw_fairr"], "error: sweep folder not found: sw_fairr; did you mean 'sw_fair'?"),
    (["Sw/../sw_fai"], "error: sweep folder not found: Sw/../sw_fai; did you mean 'sw/../sw_fair'?"),
    # nothing close: what the folder holds, or where sweeps come from
    (["sw/zzz"], "error: sweep folder not found: sw/zzz; sw holds "),
    (["qqq_none"], "error: sweep folder not found: qqq_none; give a folder that `servelab -m name=<name> ...` wrote "
                   "(sweeps/<name>)"),
    # a column named by a part of it: the shortest column that holds it
    (["sw_fair", "--by", "jain"], "error: --by 'jain' is not a column of the sweep table; did you mean 'jain_index'?"),
])
def test_report_typos_get_the_nearest_name(swept_fair, monkeypatch, args, expected):
    monkeypatch.chdir(swept_fair)
    proc = report_cli(*args, "--out", swept_fair / "rep_typo")
    assert proc.returncode == 2 and proc.stderr.startswith(f"servelab-report: {expected}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (swept_fair / "rep_typo").exists()


def test_report_of_a_folder_without_results_is_one_line(tmp_path):
    proc = report_cli(tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"servelab-report: error: no complete runs (summary.json) under {tmp_path}; give "
                                  "a folder that `servelab -m ...` wrote")
