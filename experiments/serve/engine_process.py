"""The engine core in its own process: steps the LLM, talks to the HTTP server over one Unix socket.

    engine_main(factory, path, parent_pid, log_level, spin_window_s)   # multiprocessing spawn target

The server (experiments/serve/engine_client.py) listens on the socket at `path`; this process connects
(experiments/serve/channel.py: whole messages both ways, read by the thread that waits for them, no I/O
thread in between), builds its LLM with `factory()` (a picklable callable, e.g. the CLI's config), and then
owns it alone: the
server's process does tokenization, detokenization and HTTP, so the engine's host work never waits
for that interpreter's GIL (vLLM's EngineCoreProc layout).

Messages are pickled tuples. In (server -> engine), drained between steps:
    ("add", [to_wire(Sequence), ...])   queue these (checked by the server; a refused one comes back in `failed`):
                                    plain tuples, not pickled Sequences (a third of the bytes, a quarter of the time)
    ("abort", [(request_id, count_as_aborted), ...])
    ("probe", token)                the engine's state, for tests and debugging (answered at once, behind a
                                    "step" message with whatever this turn has not reported yet)
    ("stop",)                       abort everything left, answer ("stopped",), exit 0
Out (engine -> server), one message per loop turn that changed anything, never one per token:
    ("ready", EngineInfo)  |  ("start_failed", is_user_error, message)
    ("step", records, failed, rejected, num_preempted, num_aborted, num_adds_drained, stats)
        records: experiments/serve/delivery.py's, for every sequence of the step with news; failed and
        rejected: (request_id, why); num_aborted: aborts of this turn that count as aborted; num_adds_drained:
        adds taken since start (the server's waiting count adds those still in flight); stats: (waiting,
        running, swapped, KV blocks used / total) after the turn, what /metrics' gauges show
    ("probe", token, {...})  |  ("fatal", message): a step raised; the process exits 1
Waiting for work (no request unfinished), the loop polls the socket with zero timeout for spin_window_s after
its last message or step (serve.spin_window_ms, experiments/serve/spin.py), then blocks on it.
SIGINT and SIGTERM are ignored (a terminal's Ctrl-C reaches the whole process group: the server decides
when its engine stops); the process exits by itself within a second once its parent is gone (on Linux the
kernel also kills it when the thread that started it ends, _die_with_parent).
"""
from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import time
from collections import deque

from engine.core.in_flight import settled_tokens
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from experiments.serve.spin import SpinWindow

log = logging.getLogger("servelab.serve")
FINISHED = SequenceStatus.FINISHED
PARENT_CHECK_S = 1.0            # how often a busy or idle engine looks for its parent
HELD_BACK_WAIT_MS = 5           # the policy held everything back: wait this long for an arrival or abort


def engine_main(factory, path: str, parent_pid: int, log_level: str = "info", spin_window_s: float = 0.0) -> None:
    import socket

    from experiments.serve.channel import Channel

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(level=log_level.upper() if log_level != "trace" else "DEBUG",
                        format="%(levelname)s %(name)s: %(message)s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    ch = Channel(sock)      # both ways; what is sent before the process exits is in the kernel's hands already
    try:
        llm = factory()
    except BaseException as e:      # noqa: BLE001 (whatever stops the engine is the server's start error)
        from experiments.user_errors import is_user_error, one_line
        user = is_user_error(e)
        if not user:
            log.exception("the engine failed to start")
        ch.send(pickle.dumps(("start_failed", user, one_line(e)), protocol=5))
        ch.close()
        os._exit(1)
    code = 0
    try:
        from experiments.serve.engine_info import EngineInfo
        freeze_startup_heap()
        ch.send(pickle.dumps(("ready", EngineInfo.of(llm)), protocol=5))
        log.info("engine process running (pid %d)", os.getpid())
        code = EngineCore(llm, ch, ch, parent_pid, SpinWindow(spin_window_s)).run()
    finally:
        llm.close()
        ch.close()
    os._exit(code)


def freeze_startup_heap() -> None:
    """Moves every object alive now (the model, the tokenizer, the imports: ~10^5 objects) out of the cyclic
    garbage collector's reach: its collections then scan only what requests allocate, not the whole heap (a
    full collection of it is tens of ms, a step or a first token delayed by that). vLLM freezes its heap after
    warm-up the same way (freeze_gc_heap)."""
    gc.collect()
    gc.freeze()


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the thread that started it ends (the server killed while
    the LLM is still loading, before the parent checks run). Elsewhere only the parent checks apply."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def to_wire(seq) -> tuple:
    """What the engine needs of a new Sequence (from the server's make_sequence), as plain values."""
    p = seq.sampling_params
    return (seq.request_id, seq.token_ids, seq.arrival_time_s, seq.priority, seq.eos_token_id,
            p.temperature, p.top_k, p.top_p, p.max_tokens, p.ignore_eos, p.seed)


def from_wire(fields: tuple):
    """The Sequence to_wire described."""
    rid, token_ids, arrival_s, priority, eos, temperature, top_k, top_p, max_tokens, ignore_eos, seed = fields
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens,
                            ignore_eos=ignore_eos, seed=seed)
    return Sequence(rid, token_ids, params, arrival_time_s=arrival_s, priority=priority, eos_token_id=eos)


class EngineCore:
    """The stepping loop of the engine process (module docstring: the messages)."""

    def __init__(self, llm, inp, out, parent_pid: int, spin: SpinWindow | None = None):
        self.llm, self.inp, self.out, self.parent_pid = llm, inp, out, parent_pid
        self.spin = spin or SpinWindow(0.0)     # after a message or a step: poll without sleeping this long
        self._sent: dict = {}               # request_id -> output tokens sent, of every live request
        self._unreported: set = set()       # live request ids no record named yet (their admission)
        self._failed: list = []
        self._num_aborted = 0
        self._num_drained = 0
        self._last_stats = None
        self._stopping = False
        self._recent: deque = deque(maxlen=64)      # the last sequences queued, for probes
        self._parent_checked_s = time.monotonic()

    def run(self) -> int:
        llm = self.llm
        try:
            while True:
                busy = llm.has_unfinished()
                self._drain(0 if busy else int(PARENT_CHECK_S * 1000))
                if self._stopping or self._parent_gone():
                    break
                if not llm.has_unfinished():
                    self._send_step([], [], 0)
                    continue
                batch, finished, rejected = llm.step_batch()
                self.spin.touch()
                for seq in rejected:
                    self._forget(seq.request_id)
                gone = [(seq.request_id, seq.reject_reason) for seq in rejected]
                if batch is None:
                    self._send_step([], gone, 0)
                    self._drain(HELD_BACK_WAIT_MS)
                    continue
                self._send_step(self._records(batch.seqs), gone, len(batch.preempted) + len(batch.swapped_out))
        except Exception as e:      # the step failed: the server fails every request and /health
            msg = f"{type(e).__name__}: {e}"
            log.exception("engine step failed; the server stops serving")
            try:
                self.out.send(pickle.dumps(("fatal", msg), protocol=5))
            except OSError:         # the server is gone too
                pass
            return 1
        for rid in list(self._sent):
            llm.abort_request(rid)
        self._sent.clear()
        try:
            self.out.send(pickle.dumps(("stopped",), protocol=5))
        except OSError:             # the server is gone
            pass
        return 0

    def _records(self, seqs) -> list:
        sent, unreported, records = self._sent, self._unreported, []
        for seq in seqs:
            rid = seq.request_id
            k = sent.get(rid)
            if k is None:
                continue            # aborted between the step's start and now (cannot happen) or unknown
            # status first: a FINISHED sequence has all its tokens
            done = seq.status is FINISHED
            new = settled_tokens(seq.token_ids, seq.num_prompt_tokens + k)   # overlap: not the step in flight
            if not new and not done and rid not in unreported:
                continue            # an intermediate prefill chunk, admission already reported
            unreported.discard(rid)
            records.append((rid, new, seq.finish_reason if done else None, seq.first_token_time_s,
                            seq.last_token_time_s, seq.finish_time_s, seq.num_prompt_tokens, seq.num_cached_tokens))
            if done:
                del sent[rid]
            else:
                sent[rid] = k + len(new)
        return records

    def _send_step(self, records, rejected, num_preempted: int) -> None:
        s = self.llm.scheduler
        bm = s.block_manager
        stats = (len(s.waiting), len(s.running), len(s.swapped), bm.num_used_blocks / bm.num_kvcache_blocks)
        if not (records or rejected or self._failed or self._num_aborted or stats != self._last_stats):
            return
        self._last_stats = stats
        self.out.send_nowait(pickle.dumps(("step", records, self._failed, rejected, num_preempted, self._num_aborted,
                                    self._num_drained, stats), protocol=5))
        self._failed = []
        self._num_aborted = 0

    def _forget(self, rid) -> None:
        self._sent.pop(rid, None)
        self._unreported.discard(rid)

    def _drain(self, timeout_ms: int) -> None:
        """Takes every message waiting (after up to timeout_ms for the first) and applies it."""
        inp = self.inp
        if not self._wait(timeout_ms):
            return
        # what the wait read (no second read to find the socket empty: what comes meanwhile, the next poll reads)
        while (data := inp.take()) is not None:
            msg = pickle.loads(data)
            self.spin.touch()
            kind = msg[0]
            if kind == "add":
                self._add(msg[1])
            elif kind == "abort":
                for rid, counted in msg[1]:
                    if rid in self._sent:
                        self._forget(rid)
                        if self.llm.abort_request(rid) and counted:
                            self._num_aborted += 1
            elif kind == "probe":
                # what the engine did before the probe reaches the server first (aborts counted, failures)
                self._send_step([], [], 0)
                self.out.send_nowait(pickle.dumps(("probe", msg[1], self.probe()), protocol=5))
            elif kind == "stop":
                self._stopping = True

    def _wait(self, timeout_ms: int) -> bool:
        """Whether a message waits, after up to timeout_ms: inside the spin window by zero-timeout polls
        (the message is read as it lands, no wake-up), then blocked on the socket for what is left."""
        inp, spin = self.inp, self.spin
        if timeout_ms <= 0 or not spin.open():
            return bool(inp.poll(timeout_ms))
        deadline_s = spin.clock() + timeout_ms / 1000
        while not inp.poll(0):
            if not spin.open():
                left_ms = int((deadline_s - spin.clock()) * 1000)
                return left_ms > 0 and bool(inp.poll(left_ms))
            if spin.clock() >= deadline_s:
                return False
            spin.pause()
        return True

    def _add(self, wired) -> None:
        llm = self.llm
        for fields in wired:
            self._num_drained += 1
            seq = from_wire(fields)
            try:
                llm.submit(seq)
            except ValueError as e:
                self._failed.append((seq.request_id, str(e)))
                continue
            self._sent[seq.request_id] = 0
            self._unreported.add(seq.request_id)
            self._recent.append(seq)

    def _parent_gone(self) -> bool:
        now = time.monotonic()
        if now - self._parent_checked_s < PARENT_CHECK_S:
            return False
        self._parent_checked_s = now
        if os.getppid() != self.parent_pid:
            log.warning("the server process is gone; the engine process exits")
            return True
        return False

    def probe(self) -> dict:
        """The engine's bookkeeping: what tests check after requests end (nothing held, invariants)."""
        llm = self.llm
        bm = llm.scheduler.block_manager
        invariants = ""
        if not llm._live:
            try:
                bm.check_invariants([])
            except AssertionError as e:
                invariants = f"AssertionError: {e}"
        return {"live": len(llm._live), "tracked": len(self._sent), "unfinished": llm.scheduler.num_unfinished,
                "used_blocks": bm.num_used_blocks, "free_blocks": bm.num_free_blocks,
                "num_blocks": bm.num_kvcache_blocks, "cpu_free_blocks": bm.num_cpu_free_blocks,
                "cpu_blocks": bm.num_cpu_blocks, "cpu_tables": len(bm.cpu_tables),
                "generators": len(getattr(llm.runner, "generators", ())), "invariants": invariants,
                "gc_frozen": gc.get_freeze_count(),
                "recent": [(s.request_id, s.status.name, s.num_output_tokens, s.priority) for s in self._recent]}
