"""A one-node SLURM cluster on this machine for the session (tests/slurm/local_cluster.sh).

Started once, stopped at the end unless it was already running. Needs root, Debian's slurm-wlm and munge and
the `slurm` extra (hydra-submitit-launcher): `.ci/run` installs them, so on CI (CI set) a missing piece fails
the tests instead of skipping them.
"""
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "slurm" / "local_cluster.sh"
COMMANDS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel", "sacct")


@dataclass(frozen=True)
class Cluster:
    env: dict            # os.environ plus SLURM_CONF and PYTHONPATH: for sbatch/squeue and servelab sweeps
    node: str            # the one node's name

    def slurm(self, *args: str) -> str:
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc.stdout


def missing() -> str | None:
    """Why the local cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (slurmd runs jobs as their owner)"
    absent = [c for c in COMMANDS if shutil.which(c) is None]
    if absent:
        return f"{', '.join(absent)} not installed: apt-get install -y slurm-wlm munge"
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        return "hydra-submitit-launcher is not installed: pip install -e '.[slurm]'"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (on CI, .ci/run installs these)")
        pytest.skip(reason)
    env = dict(os.environ)
    was_up = subprocess.run([str(SCRIPT), "status"], env=env, capture_output=True).returncode == 0
    proc = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the script's last line: export SLURM_CONF=...
    conf = proc.stdout.strip().splitlines()[-1].removeprefix("export SLURM_CONF=")
    env.update(SLURM_CONF=conf, PYTHONPATH=str(ROOT))
    cluster = Cluster(env, "")
    cluster = Cluster(env, cluster.slurm("sinfo", "-h", "-N", "-o", "%N").split()[0])
    yield cluster
    if not was_up:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
