"""hydra/launcher=submitit_local: each job a submitit process of its own on this machine. A job's error comes
back to the submitting command as one line, the job's record names submitit's log, and the report lists it."""
import importlib.util
import json
import os
import subprocess
import sys
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
    assert proc.stderr.splitlines()[-1] == "error: arrival: Poisson.rate_rps must be > 0, got -1"
    assert "Traceback" not in proc.stderr and "UncompletedJobError" not in proc.stderr
    assert "is validated against ConfigStore schema" not in proc.stderr

    sw = tmp_path / "sw"
    good = json.loads((sw / GOOD / "job.json").read_text())
    assert good["launcher"] == "local" and good["submitit_job_id"]
    assert good["log"] == str(sw / ".submitit" / good["submitit_job_id"] / f"{good['submitit_job_id']}_0_log.err")
    assert json.loads((sw / GOOD / "summary.json").read_text())["complete"]
    bad = json.loads((sw / BAD / "job.json").read_text())
    assert bad["error"] == "arrival: Poisson.rate_rps must be > 0, got -1"

    rep = subprocess.run([sys.executable, "-m", "experiments.report", str(sw)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert (f"  {BAD} (job {bad['submitit_job_id']}): arrival: Poisson.rate_rps must be > 0, got -1; "
            f"log: {bad['log']}\n") in rep.stdout
