"""The HTTP server's handle on an engine running in its own process (experiments/serve/engine_process.py).

    engine = ProcessEngine.launch(factory)       # spawns the process, waits until its LLM is built
    engine.info, engine.tokenizer                # what the routes need (EngineInfo; the checkpoint's tokenizer)
    engine.metrics = ServerMetrics(...); engine.start(asyncio.get_running_loop())
    choices = engine.submit([(0, seq)], queue)   # then as experiments/serve/engine_loop.py's AsyncEngine
    engine.abort(choices); engine.stop(); engine.close()

The same interface as AsyncEngine (the engine in a thread), so the routes do not know which one serves
them. Requests and aborts leave as one message per call on a Unix socket (experiments/serve/channel.py;
what the socket cannot take at once waits for it to be writable, the loop never blocks on it); the engine
answers one message per step (every sequence's new tokens at once), read on the event loop when the
socket is readable, and, for serve.spin_window_ms after activity, by a callback that polls it on every
turn of the loop (the loop never sleeps then, so neither the engine's answer nor a client's request
waits for it to wake; experiments/serve/spin.py). The process is started with multiprocessing's spawn
method. It failing (a step raised, or it died: killed, out of memory) ends every request in flight with
finish_reason "error" (500, or an error event) and turns /health to 503; stop() aborts what is left and
joins it, killing it when it does not exit in time; close() (also at interpreter exit) makes sure no
process is left behind.
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import pickle
import shutil
import tempfile
import time

from experiments.serve.delivery import Choice, Deliveries
from experiments.serve.engine_process import to_wire
from experiments.serve.errors import APIError
from experiments.serve.spin import SpinWindow, resolve_spin_window_ms

log = logging.getLogger("servelab.serve")


class ProcessEngine:
    def __init__(self):
        self.info = None
        self.tokenizer = None
        self.metrics = None
        self.error: str | None = None   # why the engine process failed, when it did
        self.pid: int | None = None
        self._table: Deliveries | None = None
        self._proc = None
        self._ch = None                 # the Channel to the engine process
        self._fd = None
        self._watching = False          # the loop reads (and writes) the channel; False: blocking calls
        self._writing = False           # output waits for the socket to be writable (add_writer)
        self._dir: str | None = None
        self._loop = None
        self._stats = (0, 0, 0, 0.0)    # waiting, running, swapped, KV use (0-1), as of the last step
        self._num_sent_adds = 0
        self._num_drained_adds = 0
        self._stopping = False
        self._dead = False
        self._probes: dict = {}
        self._tokens = itertools.count()
        self.spin = SpinWindow(0.0)     # the loop polls the socket without sleeping this long after activity
        self._spinning = False

    # -- start --------------------------------------------------------------------------------------
    @classmethod
    def launch(cls, factory, log_level: str = "info", start_timeout_s: float = 3600.0,
               spin_window_ms: float | None = None) -> "ProcessEngine":
        """Spawns the engine process, which builds its LLM with factory(); returns once it is ready.
        ValueError (one line) when the LLM refused the config, RuntimeError when the process failed. Call it
        from a thread that outlives the engine (the main thread): on Linux the engine dies with that thread.
        spin_window_ms: serve.spin_window_ms, both processes' (experiments/serve/spin.py; None: its auto rule)."""
        import multiprocessing as mp
        import socket

        from engine.llm import _load_tokenizer
        from experiments.serve.engine_process import engine_main

        self = cls()
        window_s = resolve_spin_window_ms(spin_window_ms) / 1000
        self.spin = SpinWindow(window_s)
        self._dir = tempfile.mkdtemp(prefix="servelab-engine-")
        path = os.path.join(self._dir, "engine.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        atexit.register(self.close)
        # not a daemon: an engine with tensor_parallel_size > 1 starts worker processes of its own
        self._proc = mp.get_context("spawn").Process(
            target=engine_main, args=(factory, path, os.getpid(), log_level, window_s), name="servelab-engine")
        try:
            listener.bind(path)
            listener.listen(1)
            self._proc.start()
            self.pid = self._proc.pid
            msg = None
            if self._accept(listener, start_timeout_s):
                msg = self._wait_for(("ready", "start_failed"), start_timeout_s)
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        if msg is None or msg[0] == "start_failed":
            self.close()
            if msg is not None and msg[1]:
                raise ValueError(msg[2])
            why = msg[2] if msg is not None else f"it exited with code {self._proc.exitcode}"
            raise RuntimeError(f"the engine process failed to start: {why}")
        self.info = msg[1]
        self.tokenizer = _load_tokenizer(self.info.model_path)
        return self

    def _accept(self, listener, timeout_s: float) -> bool:
        """The engine process's connection (it connects first thing); False if the process ended first."""
        import select

        from experiments.serve.channel import Channel
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if select.select([listener], [], [], 0.1)[0]:
                self._ch = Channel(listener.accept()[0])
                return True
            if not self._proc.is_alive():
                return False
        raise TimeoutError(f"the engine process did not connect within {timeout_s} s")

    def _wait_for(self, kinds, timeout_s: float):
        """Reads messages (blocking, before the loop runs) until one of `kinds`; None if the process ended."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._ch.poll(100):
                msg = pickle.loads(self._ch.recv())
                if msg[0] in kinds:
                    return msg
                self._dispatch(msg)
            elif not self._proc.is_alive():
                return None
            elif self._ch.closed:       # it closed its end: it is exiting
                self._proc.join(0.1)
        raise TimeoutError(f"the engine process sent none of {kinds} within {timeout_s} s")

    def start(self, loop) -> None:
        self._loop = loop
        self._table = Deliveries(self.metrics)
        self._fd = self._ch.fileno()
        loop.add_reader(self._fd, self._on_readable)
        loop.add_reader(self._proc.sentinel, self._on_exit)
        self._watching = True
        self._on_readable()         # what came before the loop ran

    # -- the routes' side (the event loop's thread) ------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._dead and not self._stopping

    def num_waiting(self) -> int:
        """Requests not yet running: waiting in the scheduler as of the last step, plus adds not drained yet."""
        return self._stats[0] + self._num_sent_adds - self._num_drained_adds

    def queue_stats(self) -> tuple:
        """(waiting, running, swapped, KV blocks used / total) as of the engine's last step."""
        return self._stats

    def make_sequence(self, token_ids, params, request_id, arrival_time_s: float):
        """A Sequence for the engine process; the routes have checked its limits (what LLM.make_sequence checks)."""
        from engine.core.sequence import Sequence
        return Sequence(request_id, token_ids, params, arrival_time_s=arrival_time_s,
                        eos_token_id=self.info.eos_token_id)

    def submit(self, entries, queue) -> list[Choice]:
        if not self.alive:
            raise APIError(503, f"the engine is not running ({self.error or 'shutting down'}); retry later")
        choices = [Choice(i, seq, queue) for i, seq in entries]
        self._table.track(choices)
        self._num_sent_adds += len(choices)
        self._send(("add", [to_wire(c.seq) for c in choices]))
        self._keep_awake()
        return choices

    def abort(self, choices, count_as_aborted: bool = True) -> None:
        gone = [(c.seq.request_id, count_as_aborted) for c in choices
                if self._table.choices.pop(c.seq.request_id, None) is not None]
        if gone and not (self._dead or self._stopping):      # stopping: the engine aborts everything itself
            self._send(("abort", gone))
            self._keep_awake()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Aborts every request left (each gets finish_reason "abort") and joins the engine process."""
        self._stopping = True
        if self._proc is None:
            return
        self._unwatch()
        if not self._dead and self._proc.is_alive():
            self._send(("stop",))
            try:
                self._wait_for(("stopped",), timeout_s)
            except TimeoutError:
                log.warning("the engine process did not stop within %s s; killing it", timeout_s)
        self._end_process(5.0)
        if self._table is not None:
            self._table.end_all("abort" if self.error is None else "error", self.error)

    def close(self) -> None:
        """Ends the process (killed if it does not stop) and frees the socket. Idempotent."""
        self._watching = False          # from here on, blocking sends: the loop may be gone
        if self._proc is not None and self._proc.is_alive():
            self._send(("stop",))
        self._end_process(5.0)
        if self._ch is not None:
            self._ch.close()
            self._ch = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        atexit.unregister(self.close)

    def probe(self, timeout_s: float = 30.0) -> dict:
        """The engine process's bookkeeping (EngineCore.probe); from any thread but the loop's."""
        return asyncio.run_coroutine_threadsafe(self._probe(), self._loop).result(timeout_s)

    async def _probe(self) -> dict:
        token = next(self._tokens)
        fut = self._probes[token] = self._loop.create_future()
        self._send(("probe", token))
        return await fut

    # -- messages ----------------------------------------------------------------------------------
    def _send(self, msg) -> None:
        ch = self._ch
        if ch is None or ch.closed:
            return
        data = pickle.dumps(msg, protocol=5)
        if not self._watching:          # before the loop runs, or once it stopped reading: wait for the socket
            try:
                ch.send(data, timeout_s=5.0)
            except (OSError, TimeoutError) as e:
                log.warning("the engine process took no %r message (%s)", msg[0], e)
            return
        if not ch.send_nowait(data) and not self._writing:
            self._writing = True
            self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        if self._ch is None or self._ch.flush():
            self._writing = False
            self._loop.remove_writer(self._fd)

    def _keep_awake(self) -> None:
        """Activity on the loop: the spin window restarts, and the loop spins if it did not (a request went out,
        or the engine answered; the next message, or the next request's bytes, are near)."""
        spin = self.spin
        if not spin.window_s:
            return
        spin.touch()
        if not self._spinning and self._loop is not None and not (self._dead or self._stopping):
            self._spinning = True
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        """One turn of the spin: read what came, then run again on the loop's next turn while the window is
        open. A callback always ready keeps the loop's poll at zero timeout, so the HTTP sockets are polled
        too and every other task runs between two turns; once the window closes the loop sleeps in its poll
        again and the socket's descriptor wakes it (add_reader)."""
        self._on_readable()
        if self.spin.open() and not (self._dead or self._stopping) and self._ch is not None:
            self.spin.pause()
            self._loop.call_soon(self._spin)
        else:
            self._spinning = False

    def _on_readable(self) -> None:
        ch = self._ch
        if ch is None:
            return
        ch.fill()           # one read: what the socket holds now (more later makes it readable again)
        while (data := ch.take()) is not None:
            msg = pickle.loads(data)
            self._keep_awake()
            try:
                self._dispatch(msg)
            except Exception:       # a bug, but the messages behind it must still be read
                log.exception("handling the engine's %r message failed", msg[0])
        if ch.closed and self._watching:    # a closed socket is readable for ever: the process sentinel follows
            self._loop.remove_reader(self._fd)

    def _dispatch(self, msg) -> None:
        kind = msg[0]
        if kind == "step":
            _, records, failed, rejected, num_preempted, num_aborted, num_drained, stats = msg
            self._stats, self._num_drained_adds = stats, num_drained
            if self._table is None:
                return
            if failed:
                self._table.fail(failed, "error")
            if rejected:
                self._table.fail(rejected, "rejected")
            self._table.on_step(records, num_preempted)
            if num_aborted:
                self.metrics.aborted.inc(num_aborted)
        elif kind == "probe":
            fut = self._probes.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
        elif kind == "fatal":
            self._fail(msg[1])

    def _on_exit(self) -> None:
        """The process ended while serving: what it sent first is read, then everything left fails."""
        self._on_readable()
        self._unwatch()
        self._proc.join(1.0)        # its descriptor closes a moment before it can be reaped (exitcode)
        if not self._stopping:
            self._fail(f"the engine process exited with code {self._proc.exitcode}")

    def _fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
            log.error("the engine failed (%s); the server stops serving", error)
        self._dead = True
        if self._table is not None:
            self._table.end_all("error", self.error)
        for fut in self._probes.values():
            if not fut.done():
                fut.set_exception(RuntimeError(self.error))
        self._probes.clear()

    def _unwatch(self) -> None:
        self._watching = False
        if self._loop is not None and not self._loop.is_closed():
            for fd in (self._fd, self._proc.sentinel):
                try:
                    self._loop.remove_reader(fd)
                except (ValueError, OSError, TypeError):
                    pass
            if self._writing:       # what is left goes out with the next (blocking) send
                self._writing = False
                try:
                    self._loop.remove_writer(self._fd)
                except (ValueError, OSError):
                    pass

    def _end_process(self, timeout_s: float) -> None:
        proc = self._proc
        if proc is None or proc.pid is None:
            return
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout_s)
