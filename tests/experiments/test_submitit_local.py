"""hydra/launcher=submitit_local: each job a submitit process of its own on this machine. A job's error comes
back to the submitting command as one line, the job's record names submitit's log, and the report lists it."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = "scheduler=fcfs,workload.arrival.rate_rps=5,workload.num_requests=20"
BAD = "scheduler=fcfs,workload.arrival.rate_rps=-1,workload.num_requests=20"

if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
    if os.environ.get("CI"):
        pytest.fail("hydra-submitit-launcher is not installed (on CI, .ci/run installs the slurm extra)",
                    pytrace=False)
    pytest.skip("hydra-submitit-launcher is not installed: pip install -e '.[slurm]'", allow_module_level=True)


def test_a_failing_job_comes_back_as_one_line_and_is_reported(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HYDRA_FULL_ERROR="0")
    cmd = [sys.executable, "-m", "experiments.run", "-m", "hydra/launcher=submitit_local", "experiment=smoke",
           "workload.num_requests=20", "scheduler=fcfs", "workload.arrival.rate_rps=5,-1",
           f"hydra.sweep.dir={tmp_path / 'sw'}", "progress=false", "print_summary=false", "plots=false"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == "error: workload.arrival.rate_rps must be > 0, got -1"
    assert "Traceback" not in proc.stderr and "UncompletedJobError" not in proc.stderr
    assert "is validated against ConfigStore schema" not in proc.stderr

    sw = tmp_path / "sw"
    good = json.loads((sw / GOOD / "job.json").read_text())
    assert good["launcher"] == "local" and good["submitit_job_id"]
    assert good["log"] == str(sw / ".submitit" / good["submitit_job_id"] / f"{good['submitit_job_id']}_0_log.err")
    assert json.loads((sw / GOOD / "summary.json").read_text())["complete"]
    bad = json.loads((sw / BAD / "job.json").read_text())
    assert bad["error"] == "workload.arrival.rate_rps must be > 0, got -1"

    rep = subprocess.run([sys.executable, "-m", "experiments.report", str(sw)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert (f"  {BAD} (job {bad['submitit_job_id']}): workload.arrival.rate_rps must be > 0, got -1; "
            f"log: {bad['log']}\n") in rep.stdout


def test_a_killed_job_ends_the_command_with_one_line_naming_it(tmp_path):
    """A job that leaves no result file (killed here; on SLURM: cancelled, past its time limit) ends the command
    with one line naming the job, its state and its log, not submitit's traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HYDRA_FULL_ERROR="0")
    sw = tmp_path / "sw"
    cmd = [sys.executable, "-m", "experiments.run", "-m", "hydra/launcher=submitit_local", "experiment=smoke",
           "workload.num_requests=20", "scheduler=fcfs", f"hydra.sweep.dir={sw}", "progress=false",
           "print_summary=false", "plots=false"]
    master = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # submitit_local names a job's folder by its process id once the process started: kill it there, long
    # before it can finish (the interpreter alone takes most of a second to start) or write a log
    deadline = time.monotonic() + 120
    while not (jobs := [d for d in sw.glob(".submitit/*") if d.name.isdigit()]):
        assert time.monotonic() < deadline and master.poll() is None, "no submitit job folder appeared"
        time.sleep(0.02)
    pid = int(jobs[0].name)
    os.kill(pid, signal.SIGKILL)
    out, err = master.communicate(timeout=180)
    assert master.returncode == 2, out + err
    assert err.splitlines()[-1] == (
        f"error: sweep job {pid} ended without results (state: INTERRUPTED); log: none. "
        f"Jobs still running go on and finished ones are kept: servelab-report {sw} lists the jobs without "
        "results; the same command again runs only those")
    assert "Traceback" not in err
    rep = subprocess.run([sys.executable, "-m", "experiments.report", str(sw)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 2 and rep.stderr.count("\n") == 1, rep.stderr
    assert (f"(1 failed job(s), first: experiment=smoke workload.num_requests=20 scheduler=fcfs progress=False "
            f"print_summary=False plots=False (job {pid}): never started (cancelled or failed before it ran); "
            "log: none)") in rep.stderr


def test_lost_job_lines_from_submitits_own_messages(tmp_path):
    """The two errors submitit raises for a job without a result, in the words submitit writes them
    (submitit/core/core.py: Job._get_outcome_and_result, Job.exception)."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    from experiments.job_record import lost_job_line

    folder = tmp_path / ".submitit" / "12_3"
    folder.mkdir(parents=True)
    (folder / "12_3_0_log.err").write_text("slurmstepd: error: *** JOB 15 ON vm DUE TO TIME LIMIT ***\n")
    lost = UncompletedJobError(f"Job 12_3 (task: 0) with path {folder}/12_3_0_result.pkl\n"
                               "has not produced any output (state: TIMEOUT)\nError stream produced:\n" + "-" * 40)
    assert lost_job_line(lost) == ("sweep job 12_3 ended without results (state: TIMEOUT): slurmstepd: error: *** "
                                   f"JOB 15 ON vm DUE TO TIME LIMIT ***; log: {folder}/12_3_0_log.err")
    failed = FailedJobError("Job (task=0) failed during processing with trace:\n----------------------\n"
                            "Traceback (most recent call last):\n  ...\nKeyError: 'hydra'\n----------------------\n"
                            "You can check full logs with 'job.stderr(0)' and 'job.stdout(0)'or at paths:\n"
                            f"  - {folder}/12_3_0_log.err\n  - {folder}/12_3_0_log.out")
    assert lost_job_line(failed) == (f"a sweep job failed before it began: KeyError: 'hydra'; "
                                     f"log: {folder}/12_3_0_log.err")
    assert lost_job_line(ValueError("bad")) is None
