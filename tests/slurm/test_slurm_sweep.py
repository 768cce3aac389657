"""The SLURM launcher (conf/hydra/launcher/slurm.yaml) against a running SLURM cluster: one node on this machine
(tests/slurm/local_cluster.sh), a sweep of 2 policies x 2 rates, 300 requests each, on the simulator.

Checked: every job ran as a SLURM job (one job array; each job's job.json holds its SLURM ids, and slurmctld's
completion log, read with `sacct --completion`, has each id COMPLETED on the node; submitit's folder holds a
result per array task); the results and the servelab-report table equal the local (joblib) launcher's for the
same seed; a job cancelled with scancel is reported by servelab-report, and relaunching the sweep runs only that
job and loses nothing.
"""
import json
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments.report import collect

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["experiment=smoke", "workload.num_requests=300", "scheduler=fcfs,vllm", "workload.arrival.rate_rps=5,50",
         "progress=false", "print_summary=false", "plots=false"]
SLURM = ["hydra/launcher=slurm", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10"]
LOCAL = ["hydra/launcher=local", "hydra.launcher.n_jobs=2"]
JOBS = [f"scheduler={s},workload.arrival.rate_rps={r},workload.num_requests=300" for s in ("fcfs", "vllm")
        for r in (5, 50)]
# What differs between two runs of one config: the run's id and clocks.
VARYING = {"run_id", "finished_at", "wall_time_s", "sim_wall_time_s"}


def command(sweep_dir, *launcher):
    return [sys.executable, "-m", "experiments.run", "-m", *SWEEP, *launcher, f"hydra.sweep.dir={sweep_dir}"]


def sweep(env, sweep_dir, *launcher) -> float:
    """Runs the sweep to the end; returns its wall time (s)."""
    t0 = time.perf_counter()
    proc = subprocess.run(command(sweep_dir, *launcher), cwd=sweep_dir.parent, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return time.perf_counter() - t0


def report(env, sweep_dir):
    proc = subprocess.run([sys.executable, "-m", "experiments.report", str(sweep_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def table_of(report_output: str) -> str:
    """The report's table: what it prints before the folders it read (those name the sweep folder)."""
    return report_output.split("\nread ")[0]


def record(sweep_dir, job):
    return json.loads((sweep_dir / job / "job.json").read_text())


def run_ids(sweep_dir):
    return {p.parent.name: json.loads(p.read_text())["run_id"] for p in sweep_dir.glob("*/summary.json")}


def without_varying(d):
    if isinstance(d, dict):
        return {k: without_varying(v) for k, v in d.items() if k not in VARYING}
    return d


def wait_for(predicate, what: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def swept(slurm_cluster, tmp_path_factory):
    """The same sweep through the local (joblib, 2 workers) launcher and through SLURM."""
    tmp = tmp_path_factory.mktemp("slurm_sweep")
    wall = {"local": sweep(slurm_cluster.env, tmp / "local", *LOCAL),
            "slurm": sweep(slurm_cluster.env, tmp / "slurm", *SLURM)}
    print(f"sweep wall time: local (joblib, 2 workers) {wall['local']:.1f} s, SLURM {wall['slurm']:.1f} s")
    return tmp


@pytest.fixture(scope="module")
def reports(swept, slurm_cluster):
    """servelab-report's output for each of the two sweeps."""
    return {s: report(slurm_cluster.env, swept / s) for s in ("local", "slurm")}


def test_every_job_ran_as_a_slurm_job(swept, slurm_cluster):
    sw = swept / "slurm"
    records = [record(sw, job) for job in JOBS]
    assert [(r["launcher"], r["slurm_node"]) for r in records] == [("slurm", slurm_cluster.node)] * 4, records
    arrays = {r["slurm_array_job_id"] for r in records}
    assert len(arrays) == 1                                             # one job array for the sweep
    assert sorted(int(r["slurm_array_task_id"]) for r in records) == [0, 1, 2, 3]
    ids = [r["slurm_job_id"] for r in records]
    assert len(set(ids)) == 4
    # slurmctld's own account of them: the completion log (jobcomp/filetxt; no slurmdbd). A job's line lands
    # there once slurmctld has seen its end, which can come a moment after its result file (the sweep's end)
    def completed():
        out = slurm_cluster.slurm("sacct", "--completion", "--parsable2", "--noheader", "-o",
                                  "JobID,State,NodeList", *[a for i in ids for a in ("-j", i)])
        return {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines()}

    wait_for(lambda: set(completed()) >= set(ids), "slurmctld's completion records of the 4 jobs", timeout_s=60)
    assert all(completed()[i] == ["COMPLETED", slurm_cluster.node] for i in ids), completed()
    # submitit's folder: a successful result per array task, logs named by the array id
    (array,) = arrays
    for task in range(4):
        with open(sw / ".submitit" / f"{array}_{task}" / f"{array}_{task}_0_result.pkl", "rb") as f:
            assert pickle.load(f)[0] == "success"
    for r in records:
        assert Path(r["log"]).is_file() and f"/{array}_{r['slurm_array_task_id']}_0_log.err" in r["log"], r


def test_results_and_report_equal_the_local_launchers(swept, reports):
    for job in JOBS:
        local, slurm = swept / "local" / job, swept / "slurm" / job
        for table in ("requests.parquet", "steps.parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(local / table), pd.read_parquet(slurm / table))
        summaries = [json.loads((d / "summary.json").read_text()) for d in (local, slurm)]
        assert summaries[0]["complete"] and without_varying(summaries[0]) == without_varying(summaries[1])
    frames = [collect(swept / s) for s in ("local", "slurm")]
    pd.testing.assert_frame_equal(*(df.drop(columns=[c for c in df if c in VARYING]) for df in frames))
    tables = [table_of(reports[s]) for s in ("local", "slurm")]
    assert tables[0] == tables[1] and len(tables[0].splitlines()) == 5
    assert "FAILED" not in reports["slurm"]


def test_a_cancelled_job_is_reported_and_a_relaunch_runs_only_it(reports, slurm_cluster, tmp_path):
    """Jobs wait on a drained node, so one is cancelled before it starts (a fixed point in time, not a race);
    with no accounting database submitit cannot see that it ended, so the sweep command is stopped (Ctrl-C) once
    the other three are done, as a user would; the relaunch then has to rerun exactly that job."""
    sw, env = tmp_path / "sw", slurm_cluster.env
    slurm_cluster.slurm("scontrol", "update", f"NodeName={slurm_cluster.node}", "State=DRAIN", "Reason=servelab-test")
    log = open(tmp_path / "master.log", "w")
    master = subprocess.Popen(command(sw, *SLURM), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        queued = lambda: slurm_cluster.slurm("squeue", "-h", "-r", "-o", "%i").split()  # noqa: E731
        wait_for(lambda: len(queued()) == 4, "the sweep's 4 array tasks in the queue")
        cancelled = sorted(queued())[1]
        slurm_cluster.slurm("scancel", cancelled)
    finally:
        slurm_cluster.slurm("scontrol", "update", f"NodeName={slurm_cluster.node}", "State=RESUME")
    try:
        wait_for(lambda: len(run_ids(sw)) == 3 and not queued(), "the other 3 jobs to finish")
    finally:
        master.send_signal(signal.SIGINT)
        master.wait(timeout=60)
        log.close()
    out = (tmp_path / "master.log").read_text()
    assert master.returncode == 130, out[-3000:]
    assert "holds 3 complete job(s)" in out

    (missed,) = set(JOBS) - set(run_ids(sw))
    rep = report(env, sw)
    failed = [line for line in rep.splitlines() if line.startswith("  ") and f"(job {cancelled})" in line]
    assert "FAILED: 1 job(s) wrote no results" in rep and len(failed) == 1, rep
    assert "never started" in failed[0] and all(o in failed[0] for o in missed.split(","))

    before = run_ids(sw)
    sweep(env, sw, *SLURM)
    after = run_ids(sw)
    assert sorted(after) == sorted(JOBS)
    assert [j for j in JOBS if after[j] != before.get(j)] == [missed]    # only the cancelled job ran again
    assert record(sw, missed)["slurm_array_job_id"] != cancelled.split("_")[0]
    rep = report(env, sw)
    assert "FAILED" not in rep and table_of(rep) == table_of(reports["local"])


def test_a_job_that_raises_ends_the_sweep_with_its_error_and_is_reported(slurm_cluster, tmp_path):
    """A bad value in one job: the job's error comes back through submitit's result file (no waiting for a job
    whose end submitit cannot see), the command ends with it as one line, and the report names the job."""
    sw, bad = tmp_path / "sw", "scheduler=fcfs,workload.arrival.rate_rps=-1,workload.num_requests=300"
    cmd = [sys.executable, "-m", "experiments.run", "-m", "experiment=smoke", "workload.num_requests=300",
           "scheduler=fcfs", "workload.arrival.rate_rps=5,-1", "progress=false", "print_summary=false", "plots=false",
           *SLURM, f"hydra.sweep.dir={sw}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=slurm_cluster.env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == "error: workload.arrival.rate_rps must be > 0, got -1"
    rec = record(sw, bad)
    assert rec["launcher"] == "slurm" and rec["error"] == "workload.arrival.rate_rps must be > 0, got -1"
    rep = report(slurm_cluster.env, sw)
    assert (f"  {bad} (job {rec['submitit_job_id']}, SLURM id {rec['slurm_job_id']}): workload.arrival.rate_rps "
            f"must be > 0, got -1; log: {rec['log']}") in rep
