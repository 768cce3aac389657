"""serve.spin_window_ms (experiments/serve/spin.py): after activity both processes of the engine-process layout
poll without sleeping for the window, then block again. A message landing inside the window is read by the
zero-timeout polls, never by a blocking one; a window with nothing in it ends (a fake clock, no timing); an idle
server and engine process spend next to no CPU once it has (a real server, CPU time read from /proc)."""
from __future__ import annotations

import asyncio
import os
import pickle
import time

import pytest

from experiments.serve.spin import AUTO_WINDOW_MS, SpinWindow, resolve_spin_window_ms


class FakeClock:
    """Seconds that advance by step_s at every reading: a spin loop's every turn moves time on."""

    def __init__(self, step_s: float = 0.001):
        self.now_s, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now_s += self.step_s
        return self.now_s


class FakeInbox:
    """The engine process's end of its channel: poll(timeout_ms) is recorded; a message lands at the given poll."""

    def __init__(self, lands_at_poll: int | None = None, msg=("stop",)):
        self.polls: list[int] = []
        self.lands_at_poll, self.msg = lands_at_poll, pickle.dumps(msg, protocol=5)

    def poll(self, timeout_ms):
        self.polls.append(timeout_ms)
        return self.lands_at_poll is not None and len(self.polls) >= self.lands_at_poll

    def take(self):         # what the polls read: the message once it has landed
        if self.msg is None or self.lands_at_poll is None or len(self.polls) < self.lands_at_poll:
            return None
        msg, self.msg = self.msg, None
        return msg


def test_a_window_of_zero_never_opens_and_a_touched_one_closes():
    clock = FakeClock()
    closed = SpinWindow(0.0, clock=clock)
    closed.touch()
    assert not closed.open()
    w = SpinWindow(0.010, clock=clock)
    assert not w.open()                 # nothing happened yet: no spinning at start
    w.touch()
    turns = 0
    while w.open():
        turns += 1
        assert turns < 100
    assert 5 <= turns <= 10             # 1 ms a reading, a 10 ms window


def test_the_setting_is_honoured_and_auto_follows_the_cores():
    assert resolve_spin_window_ms(None, num_cores=2) == 0.0
    assert resolve_spin_window_ms(None, num_cores=16) == AUTO_WINDOW_MS
    assert resolve_spin_window_ms(50, num_cores=2) == 50.0        # given: as given, whatever the host
    assert resolve_spin_window_ms(0, num_cores=64) == 0.0
    with pytest.raises(ValueError, match="serve.spin_window_ms must be >= 0"):
        resolve_spin_window_ms(-1)


def _core(inbox, window_s, clock):
    from experiments.serve.engine_process import EngineCore
    return EngineCore(None, inbox, None, os.getppid(), SpinWindow(window_s, clock=clock))


def test_the_engine_takes_a_message_landing_in_the_window_without_a_blocking_poll():
    clock = FakeClock()
    core = _core(FakeInbox(lands_at_poll=4), 0.050, clock)
    core.spin.touch()
    core._drain(1000)                   # what the idle engine calls
    assert core._stopping               # the message was read and applied
    assert set(core.inp.polls) == {0}   # only zero-timeout polls: the process never slept
    assert core.spin.num_pauses == 3


def test_the_engine_blocks_once_the_window_passes_empty():
    clock = FakeClock()
    core = _core(FakeInbox(), 0.010, clock)
    core.spin.touch()
    core._drain(1000)
    polls = core.inp.polls
    assert polls[-1] > 0 and set(polls[:-1]) == {0}    # spun, then one blocking poll for the time left
    assert len(polls) <= 12                            # ~10 turns of 1 ms: the window ended


def test_with_a_window_of_zero_the_engine_blocks_at_once():
    core = _core(FakeInbox(), 0.0, FakeClock())
    core.spin.touch()
    core._drain(1000)
    assert core.inp.polls == [1000] and core.spin.num_pauses == 0


class FakeChannel:
    """The server's end of the channel: one message, whole from the given read on."""

    closed = False

    def __init__(self, lands_at_read: int | None, msg):
        self.reads, self.lands_at_read, self.msg = 0, lands_at_read, pickle.dumps(msg, protocol=5)
        self.landed = None

    def fill(self):
        self.reads += 1
        if self.msg is not None and self.lands_at_read is not None and self.reads >= self.lands_at_read:
            self.landed, self.msg = self.msg, None

    def take(self):
        msg, self.landed = self.landed, None
        return msg


def _spinning_server(ch, window_s):
    from experiments.serve.engine_client import ProcessEngine
    engine = ProcessEngine()
    engine.spin = SpinWindow(window_s, clock=FakeClock())
    engine._ch = ch
    return engine


def test_the_server_loop_reads_a_message_landing_in_the_window_and_then_stops_spinning():
    async def main():
        engine = _spinning_server(FakeChannel(5, ("probe", 7, {"live": 0})), 0.020)
        engine._loop = asyncio.get_running_loop()
        fut = engine._probes[7] = engine._loop.create_future()
        engine._keep_awake()            # a request went out; no add_reader: only the spin can read the channel
        for _ in range(1000):
            await asyncio.sleep(0)      # other tasks run between the spin's turns
            if not engine._spinning:
                break
        return engine, fut

    engine, fut = asyncio.run(main())
    assert fut.done() and fut.result() == {"live": 0}
    assert not engine._spinning                         # the window (restarted by the message) ended
    assert engine.spin.num_pauses < 60


def test_the_server_does_not_spin_with_a_window_of_zero():
    async def main():
        engine = _spinning_server(FakeChannel(None, ("probe", 1, {})), 0.0)
        engine._loop = asyncio.get_running_loop()
        engine._keep_awake()
        return engine

    engine = asyncio.run(main())
    assert not engine._spinning and engine._ch.reads == 0


def _cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds of process pid, or of its thread tid alone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = open(path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads CPU time from /proc (Linux)")
def test_a_spinning_server_serves_and_its_idle_cpu_is_bounded(ckpt):
    pytest.importorskip("torch")
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("zmq")
    from tests.experiments.serve.server import running_server

    with running_server(ckpt, engine_process=True, spin_window_ms=50) as srv:
        assert srv.engine.spin.window_s == 0.05
        body = {"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True, "temperature": 0}
        whole = httpx.post(f"{srv.url}/completions", json=body, timeout=30).json()
        with httpx.stream("POST", f"{srv.url}/completions", json={**body, "stream": True}, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert whole["usage"]["completion_tokens"] == 4 and len(events) == 4
        assert srv.wait_idle()["live"] == 0
        time.sleep(0.5)                 # ten windows: both sides have stopped spinning
        pid = srv.engine.pid
        # the server's loop thread alone: the test process's other threads (earlier tests' leftovers) do not count
        engine0, server0 = _cpu_s(pid), _cpu_s(os.getpid(), srv.thread_id)
        time.sleep(1.0)
        engine_s, server_s = _cpu_s(pid) - engine0, _cpu_s(os.getpid(), srv.thread_id) - server0
    # a spinner holds a core (~1 s of CPU a second; a quarter of that on a loaded 2-core host); a blocked
    # process wakes once a second (the engine's parent check) and uvicorn ten times (its tick)
    assert engine_s < 0.1, f"the idle engine process used {engine_s:.2f} s of CPU in 1 s"
    assert server_s < 0.1, f"the idle server used {server_s:.2f} s of CPU in 1 s"
