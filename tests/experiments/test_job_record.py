"""Jobs that wrote no results are named by servelab-report (which job, its log, the line that says why):
a job that raised, one killed while running, one submitted that never started."""
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from experiments.job_record import JOB_RECORD, NO_FOLDER, error_line, failed_jobs, launched_jobs

ROOT = Path(__file__).resolve().parents[2]
GOOD = "scheduler=fcfs,workload.arrival.rate_rps=5,workload.num_requests=20"
BAD = "scheduler=fcfs,workload.arrival.rate_rps=-1,workload.num_requests=20"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


@pytest.fixture(scope="module")
def half_failed(tmp_path_factory):
    """A sweep (basic launcher: in-process, one job after the other) whose second job fails on a bad rate."""
    tmp = tmp_path_factory.mktemp("failing_sweep")
    cmd = [sys.executable, "-m", "experiments.run", "-m", "hydra/launcher=basic", "experiment=smoke",
           "workload.num_requests=20", "scheduler=fcfs", "workload.arrival.rate_rps=5,-1",
           f"hydra.sweep.dir={tmp / 'sw'}", "progress=false", "print_summary=false", "plots=false"]
    proc = subprocess.run(cmd, cwd=tmp, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "rate_rps must be > 0" in proc.stderr, proc.stderr
    return tmp / "sw"


def report_cli(sweep_dir):
    proc = subprocess.run([sys.executable, "-m", "experiments.report", str(sweep_dir)], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_each_sweep_job_records_what_ran_it(half_failed):
    rec = json.loads((half_failed / GOOD / JOB_RECORD).read_text())
    assert rec["launcher"] == "process" and rec["pid"] > 0 and "error" not in rec
    assert rec["log"] == str(half_failed / GOOD / "servelab.log")
    bad = json.loads((half_failed / BAD / JOB_RECORD).read_text())
    assert bad["error"] == "workload.arrival.rate_rps must be > 0, got -1"


def test_report_names_a_job_that_raised(half_failed):
    out = report_cli(half_failed)
    assert f"read 1 run under {half_failed}:\n  {GOOD}\n" in out
    assert ("FAILED: 1 job(s) wrote no results (relaunch the sweep to run only those):\n"
            f"  {BAD}: workload.arrival.rate_rps must be > 0, got -1; "
            f"log: {half_failed / BAD / 'servelab.log'}\n") in out
    failed = (half_failed / "report" / "failed_jobs.csv").read_text()
    assert failed.startswith("run_dir,overrides,job_id,log,error\n") and "rate_rps must be > 0" in failed


def test_a_job_killed_while_running_is_named_by_its_logs_last_error(half_failed, tmp_path):
    sw = tmp_path / "sw"
    shutil.copytree(half_failed, sw)
    (sw / GOOD / "summary.json").unlink()              # it was killed before it wrote its results
    log = tmp_path / "9_1_0_log.err"
    log.write_text("submitit INFO - Starting with JobEnvironment(job_id=9_1, hostname=vm)\n"
                   "slurmstepd: error: *** JOB 11 ON vm CANCELLED AT 2026-12-01T11:40:00 ***\n"
                   "submitit WARNING - Bypassing signal SIGTERM\n")
    rec = json.loads((sw / GOOD / JOB_RECORD).read_text())
    (sw / GOOD / JOB_RECORD).write_text(json.dumps({**rec, "log": str(log), "submitit_job_id": "9_1",
                                                    "slurm_job_id": "11"}))
    jobs = {j.run_dir: j for j in failed_jobs(sw)}
    assert set(jobs) == {GOOD, BAD}
    assert jobs[GOOD].error == "slurmstepd: error: *** JOB 11 ON vm CANCELLED AT 2026-12-01T11:40:00 ***"
    assert jobs[GOOD].job_id == "9_1, SLURM id 11" and jobs[GOOD].log == str(log)
    assert error_line(tmp_path / "absent.err") is None


def submit(sweep_dir, job_id, overrides, result=None):
    """What a submitit launcher leaves for a job it submitted: .submitit/<id>/<id>_submitted.pkl, whose
    `args[0]` are the job's overrides (here a stand-in object with the same shape), and once the job ended,
    <id>_0_result.pkl: ("success", value) or ("error", traceback text)."""
    folder = sweep_dir / ".submitit" / job_id
    folder.mkdir(parents=True)
    with open(folder / f"{job_id}_submitted.pkl", "wb") as f:
        pickle.dump(SimpleNamespace(args=(list(overrides), "hydra.sweep.dir", 0, "x", {})), f)
    if result is not None:
        with open(folder / f"{job_id}_0_result.pkl", "wb") as f:
            pickle.dump(result, f)


def test_a_job_that_never_started_or_raised_early_is_named_unless_a_later_launch_ran_it(half_failed, tmp_path):
    sw = tmp_path / "sw"
    shutil.copytree(half_failed, sw)
    shutil.rmtree(sw / BAD)
    never = ["experiment=smoke", "scheduler=vllm", "workload.arrival.rate_rps=5"]
    submit(sw, "9_2", never)
    ran = yaml.safe_load((sw / GOOD / ".hydra" / "overrides.yaml").read_text())
    submit(sw, "8_0", reversed(ran))                   # an earlier launch's submission of a job that is done
    submit(sw, "9_0", ["scheduler=srpt"], result=("success", None))
    submit(sw, "9_1", ["scheduler=sjf"], result=("error", "Traceback (most recent call last):\n  ...\n"
                                                           "hydra.errors.ConfigCompositionException: bad\n"))
    submit(sw, "9_3", ["scheduler=mlfq"])
    killed_log = sw / ".submitit" / "9_3" / "9_3_0_log.err"
    killed_log.write_text("submitit INFO - Starting with JobEnvironment(job_id=9_3, hostname=vm)\n")
    raised, job, killed, unsubmitted = failed_jobs(sw)
    assert unsubmitted.run_dir is None and unsubmitted.job_id is None and unsubmitted.error == NO_FOLDER
    assert "workload.arrival.rate_rps=-1" in unsubmitted.overrides      # its folder is gone and nothing submitted it
    assert raised.job_id == "9_1" and raised.error == "hydra.errors.ConfigCompositionException: bad"
    assert job.run_dir is None and job.overrides == tuple(never) and job.job_id == "9_2"
    assert job.error == "never started (cancelled or failed before it ran)" and job.log is None
    assert killed.error == "ended without results and without an error line in its log (killed?)"
    assert killed.log == str(killed_log)
    out = report_cli(sw)
    assert "  experiment=smoke scheduler=vllm workload.arrival.rate_rps=5 (job 9_2): never started" in out


def test_a_job_of_the_launch_that_never_got_a_folder_is_named(half_failed, tmp_path):
    """A sweep stopped before a job ran (Ctrl-C, a killed launcher) leaves no folder and, with the basic or joblib
    launcher, no submission: the sweep's multirun.yaml still lists it."""
    sw = tmp_path / "sw"
    shutil.copytree(half_failed, sw)
    ran = [tuple(yaml.safe_load((sw / d / ".hydra" / "overrides.yaml").read_text())) for d in (GOOD, BAD)]
    assert launched_jobs(sw) == ran                          # as Hydra gave them to the jobs, in launch order
    assert [j.run_dir for j in failed_jobs(sw)] == [BAD]     # the other job has its results
    shutil.rmtree(sw / BAD)
    (job,) = failed_jobs(sw)
    assert job.overrides == ran[1] and job.run_dir is None and job.error == NO_FOLDER and job.log is None
    out = report_cli(sw)
    assert f"FAILED: 1 job(s) wrote no results (relaunch the sweep to run only those):\n  {' '.join(ran[1])}: " \
           f"{NO_FOLDER}; log: none\n" in out
    multirun = sw / "multirun.yaml"
    text = multirun.read_text()
    multirun.write_text(text.replace("hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "my.OptunaSweeper"))
    assert launched_jobs(sw) == [] and failed_jobs(sw) == []        # its jobs cannot be listed
    multirun.write_text(text[: len(text) // 3])             # torn
    assert launched_jobs(sw) == []
