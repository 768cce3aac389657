"""What Ctrl-C does during a run: the run's loop stops at once, but what surrounds it (building the workload,
turning what finished into tables, writing them) finishes first, so a Ctrl-C never loses a finished run.

    with held("stopping once the results so far are written"):     # experiments/run.py: set-up to files
        result = runner(cfg)      # inside: `with interruptible(): sim.run(...)`, the runner catching
        save(result)              # KeyboardInterrupt there and returning what finished (complete=false)

Inside `held`, a first Ctrl-C is held (one line says so) and raised as KeyboardInterrupt when the block ends; a
second raises at once. Inside `interruptible`, Ctrl-C acts as Python's own (asyncio's runner installs its handler
there as usual), and a Ctrl-C held before the loop began raises as it starts; with `protect`, a Ctrl-C that
arrives while code of those source files runs (a Recorder's hooks: a step half recorded would leave its columns
of different lengths) is raised 1 ms later, once that code has returned. Only the main thread takes signals:
elsewhere both blocks change nothing.
"""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

from engine.core import recorder

_state: dict = {}       # inside `held`: previous (the handler before it), what, count (Ctrl-Cs seen)


def _hold(signum, frame) -> None:
    _state["count"] += 1
    if _state["count"] > 1:
        raise KeyboardInterrupt
    print(f"\nCtrl-C: {_state['what']} (Ctrl-C again to stop at once, losing them)", file=sys.stderr, flush=True)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def held(what: str):
    """Holds a first Ctrl-C until the block ends, then raises KeyboardInterrupt (not over another exception)."""
    if _state or not _main_thread():
        yield
        return
    _state.update(previous=signal.signal(signal.SIGINT, _hold), what=what, count=0)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, _state["previous"])
        count = _state["count"]
        _state.clear()
    if count:
        raise KeyboardInterrupt


RECORDER_FILES = (recorder.__file__,)      # engine/core/recorder.py: a run's tables


def _outside(files: frozenset, frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename in files:
            return False
        frame = frame.f_back
    return True


@contextmanager
def interruptible(protect: tuple[str, ...] = ()):
    """A run's loop: Ctrl-C stops it (KeyboardInterrupt, for the loop's owner to catch), never inside `protect`."""
    if not _main_thread():
        yield
        return
    if _state.get("count"):
        raise KeyboardInterrupt             # the user asked to stop before the loop began
    files = frozenset(protect)

    def stop(signum, frame):
        if _outside(files, frame):
            raise KeyboardInterrupt
        signal.setitimer(signal.ITIMER_REAL, 0.001)         # again once the protected code has returned

    if files:
        previous_alarm = signal.signal(signal.SIGALRM, stop)
        previous = signal.signal(signal.SIGINT, stop)
    else:
        previous = signal.signal(signal.SIGINT, _state.get("previous", signal.getsignal(signal.SIGINT)))
    try:
        yield
    except KeyboardInterrupt:
        if _state:
            _state["count"] += 1        # a second Ctrl-C, while what finished is written, stops at once
        raise
    finally:
        if files:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signal.SIGINT, previous)
