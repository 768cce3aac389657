"""Ctrl-C never loses a finished run: experiments/ctrl_c.py's hold around a run (its loop still stops at once), and
a parallel sweep's first Ctrl-C (experiments/sweep_stop.py) lets the running jobs write what they have and starts
no queued job."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.ctrl_c import held, interruptible
from experiments.job_record import JOB_RECORD
from experiments.sweep_stop import NOT_RUN, STOP_FILE

ROOT = Path(__file__).resolve().parents[2]


def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.01)        # the handler runs at the next bytecode boundary of the main thread


def test_a_held_ctrl_c_lets_the_block_finish_then_raises(capsys):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held("writing"):
            ctrl_c()
            done.append("wrote")
    assert done == ["wrote"]
    assert "Ctrl-C: writing (Ctrl-C again to stop at once" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler       # restored


def test_a_second_ctrl_c_raises_at_once():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held("writing"):
            ctrl_c()
            ctrl_c()
            done.append("wrote")
    assert done == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_loop_stops_at_once_and_what_follows_is_held():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with held("writing"):
            try:
                with interruptible():
                    for i in range(100):
                        steps.append(i)
                        if i == 3:
                            ctrl_c()
            except KeyboardInterrupt:
                steps.append("stopped")
            steps.append("writing")
            ctrl_c()                    # a second Ctrl-C while what finished is written: at once
            steps.append("wrote")
    assert steps == [0, 1, 2, 3, "stopped", "writing"]


def test_what_follows_a_stopped_loop_is_written_whole():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with held("writing"):
            try:
                with interruptible():
                    ctrl_c()
            except KeyboardInterrupt:
                steps.append("stopped")
            steps.append("wrote")
    assert steps == ["stopped", "wrote"]


def test_a_ctrl_c_held_before_the_loop_stops_it_as_it_starts():
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with held("writing"):
            ctrl_c()                    # during set-up
            try:
                with interruptible():
                    ran.append("loop")
            except KeyboardInterrupt:
                ran.append("stopped")
    assert ran == ["stopped"]


def test_without_a_hold_the_loop_block_changes_nothing():
    with interruptible():
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()


HOOK = """
import os, signal

def record(log, i, interrupt):
    log.append((i, "start"))
    if interrupt:
        os.kill(os.getpid(), signal.SIGINT)
    total = 0
    for k in range(20000):          # bytecodes, where the signal's handler runs
        total += k
    log.append((i, "end"))
"""


@pytest.mark.parametrize("protected", [True, False])
def test_a_ctrl_c_inside_protected_code_waits_until_it_returns(tmp_path, protected):
    """A loop calling a hook whose two appends must go together (as a Recorder's columns): Ctrl-C inside the hook
    stops the loop only once the hook has returned; unprotected it stops between the two."""
    import importlib.util
    (tmp_path / "hook.py").write_text(HOOK)
    spec = importlib.util.spec_from_file_location("hook", tmp_path / "hook.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    log = []
    with pytest.raises(KeyboardInterrupt):
        with interruptible(protect=(hook.__file__,) if protected else ()):
            for i in range(10_000):
                hook.record(log, i, interrupt=i == 2)
    if protected:
        assert (2, "end") in log and log[-1][1] == "end"
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    else:
        assert log[-1] == (2, "start")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_first_ctrl_c_of_a_parallel_sweep_keeps_the_running_jobs_results(tmp_path):
    """Two workers, four jobs of a long simulation: Ctrl-C to the whole process group (as a terminal sends it)
    once a job runs. The running jobs write their partial results, the queued ones record that they did not run,
    and servelab exits with 130 naming what the sweep holds."""
    sweep = tmp_path / "sw"
    cmd = [sys.executable, "-m", "experiments.run", "-m", "experiment=smoke", "workload.num_requests=40000",
           "workload.arrival.rate_rps=5,10,20,40", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
           "progress=false", "print_summary=false", "plots=false"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(sweep.glob(f"*/{JOB_RECORD}")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Ctrl-C: stopping the sweep" in err and "interrupted: sweep" in err
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    summaries = {p.name: json.loads((p / "summary.json").read_text()) for p in jobs if (p / "summary.json").exists()}
    not_run = {p.name for p in jobs if json.loads((p / JOB_RECORD).read_text()).get("error") == NOT_RUN}
    assert summaries, err[-2000:]                             # the running jobs kept what they had
    assert all(s["complete"] is False for s in summaries.values())
    assert len(summaries) + len(not_run) == 4 and not (set(summaries) & not_run)
    assert not (sweep / STOP_FILE).exists()
    assert f"holds 0 complete job(s) and {len(summaries)} interrupted one(s)" in err
