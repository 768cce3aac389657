"""Ctrl-C in a parallel sweep (the local launcher: joblib's worker processes) keeps what the running jobs did.

A terminal's Ctrl-C reaches every process of the sweep at once. Each running job stops its run and writes what
finished (summary.json complete=false), which takes seconds for a large run; but joblib, on the KeyboardInterrupt in
the launching process, kills its workers at once, so those results were lost, and a job killed while writing its
results lost even finished ones. So while a parallel sweep runs, the launching process takes the first Ctrl-C
itself (`SweepStop`, a Hydra callback):

* it writes `<sweep folder>/.stopping` and prints one line; the launch goes on, so joblib waits for its workers;
* a job in a worker process (`in_sweep_worker`) that is interrupted writes what it has and returns instead of
  raising (experiments/run.py), and a job that starts after the file exists records "not run: the sweep was
  stopped" and returns at once (`stop_requested`), so the jobs still queued end in a moment;
* when the launch ends, `servelab` says what the sweep folder holds and exits with status 130, as for any Ctrl-C.

A second Ctrl-C stops at once, as before (joblib kills the workers). The basic launcher runs its jobs in the
launching process and keeps Python's own Ctrl-C; so do submitit's launchers, whose jobs are not its children.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

STOP_FILE = ".stopping"
PARENT_ENV = "SERVELAB_SWEEP_PARENT_PID"    # the launching process's pid, inherited by its workers
NOT_RUN = "not run: the sweep was stopped (Ctrl-C) before it started"
_state: dict = {}                           # sweep_dir, previous handler, stopped (the launching process only)


def _parallel(config) -> bool:
    return "joblib" in str(config.hydra.launcher.get("_target_", ""))


def _on_sigint(signum, frame) -> None:
    if _state.get("stopped"):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt
    _state["stopped"] = True
    try:
        (Path(_state["sweep_dir"]) / STOP_FILE).touch()
    except OSError:
        pass                # the folder is gone: the workers' own Ctrl-C still stops the running jobs
    print("\nCtrl-C: stopping the sweep; running jobs write what they have, queued ones do not start "
          "(Ctrl-C again to stop at once, losing what the running jobs have not written)", file=sys.stderr, flush=True)


class SweepStop(Callback):
    """In the launching process of a parallel sweep: the first Ctrl-C stops the sweep without killing its jobs."""

    def on_multirun_start(self, config, **kwargs) -> None:
        if not _parallel(config):
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        (sweep_dir / STOP_FILE).unlink(missing_ok=True)        # an earlier launch's
        _state.update(sweep_dir=str(sweep_dir), stopped=False, previous=signal.signal(signal.SIGINT, _on_sigint))
        os.environ[PARENT_ENV] = str(os.getpid())

    def on_multirun_end(self, config, **kwargs) -> None:
        end_sweep_stop()


def end_sweep_stop() -> None:
    """Python's Ctrl-C back and the stop file gone: when the launch ends, or a second Ctrl-C or an error ended it."""
    if "previous" not in _state:
        return
    signal.signal(signal.SIGINT, _state.pop("previous"))
    os.environ.pop(PARENT_ENV, None)
    (Path(_state["sweep_dir"]) / STOP_FILE).unlink(missing_ok=True)


def stopped_by_user() -> bool:
    """True in the launching process once its first Ctrl-C stopped the sweep (read after the launch ends)."""
    return bool(_state.get("stopped"))


def in_sweep_worker() -> bool:
    """True in a worker process of a parallel sweep (not in the launching process)."""
    parent = os.environ.get(PARENT_ENV)
    return parent is not None and parent != str(os.getpid())


def stop_requested(sweep_dir) -> bool:
    """True in a worker once the launching process was asked to stop the sweep."""
    return in_sweep_worker() and (Path(sweep_dir) / STOP_FILE).exists()
