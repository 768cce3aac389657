"""How long a receiver stays awake after its last message: serve.spin_window_ms.

    window = SpinWindow(0.05)        # seconds; 0: never spin (block on the socket at once)
    window.touch()                   # a message came in, a step ran, a request went out
    while window.open() and not sock.poll(0):
        window.pause()               # os.sched_yield(): the core goes to whoever else is runnable
    ... then block as before

A thread blocked in poll costs a wake-up when its message lands: the kernel schedules it, on an idle host
often on a core that has dropped into a deep sleep state; over ZeroMQ a hop pays two, its I/O thread's and
then the receiver's (benchmarks/wakeup_latency.py). Polling with zero timeout for a while after the last
activity takes the message as it lands; once the window has passed with nothing to do, the receiver blocks
again, so an idle server spends at most one window of CPU per burst of work. vLLM's shared-memory queue spins
(with sched_yield) for 10 s after its last read before it sleeps between polls (VLLM_SLEEP_WHEN_IDLE); SGLang's
scheduler polls with zero timeout for ever unless --sleep-on-idle.
"""
from __future__ import annotations

import os
import time

AUTO_WINDOW_MS = 50.0       # covers a 30 ms pause between requests (benchmarks/serve_hops.py's) with room to spare
AUTO_MIN_CORES = 4          # the two spinners and the engine's own work each need a core, and one is left over


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


def resolve_spin_window_ms(window_ms: float | None, num_cores: int | None = None) -> float:
    """The window a setting means: as given, or (None) AUTO_WINDOW_MS where this process may use at least
    AUTO_MIN_CORES cores and 0 on fewer: a spinning thread holds a core, and where the server, the engine and
    the client already share too few, spinning took the engine's forward pass's time (docs/serving.md)."""
    if window_ms is not None:
        if not float(window_ms) >= 0:
            raise ValueError(f"serve.spin_window_ms must be >= 0 (0: block at once) or null (auto), got {window_ms}")
        return float(window_ms)
    cores = usable_cores() if num_cores is None else num_cores
    return AUTO_WINDOW_MS if cores >= AUTO_MIN_CORES else 0.0


class SpinWindow:
    def __init__(self, window_s: float, clock=time.perf_counter):
        if not window_s >= 0:
            raise ValueError(f"spin window must be >= 0 s, got {window_s}")
        self.window_s = float(window_s)
        self.clock = clock                # seconds; the deadlines of a spinning wait read it too
        self._last_s = float("-inf")      # no activity yet: closed until the first touch
        self.num_pauses = 0               # zero-timeout polls that found nothing (for tests and the log)

    def touch(self) -> None:
        """Activity now: the window runs window_s from here."""
        if self.window_s:
            self._last_s = self.clock()

    def open(self) -> bool:
        """Whether the last activity is less than window_s ago (never with a window of 0)."""
        return self.window_s > 0 and self.clock() - self._last_s < self.window_s

    def pause(self) -> None:
        """One empty poll: give the core to another runnable thread before the next."""
        self.num_pauses += 1
        os.sched_yield()
