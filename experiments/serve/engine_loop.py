"""The engine stepping in its own thread while the asyncio loop serves HTTP.

    engine = AsyncEngine(llm, metrics); engine.start(asyncio.get_running_loop())
    choices = engine.submit([(0, seq)], queue)   # queue: an asyncio.Queue of this HTTP request
    item = await queue.get()                     # (index, new_token_ids, finish_reason, error)
    engine.abort(choices)                        # client gone: the sequence is dropped, its KV blocks freed
    engine.stop()                                # aborts whatever is left, joins the thread

The thread owns the LLM: requests and aborts reach it through an inbox it drains between steps
(the scheduler core is never touched mid-step), so adding a request never waits for a step to end
and a step never waits for the HTTP side. After each step one `call_soon_threadsafe` hands the
step's new tokens to the loop: per sequence that got tokens, (its index in the HTTP request, the
new token ids, the finish reason or None, None). finish_reason: "length" | "eos" (from the engine),
"abort" (stopped by the server) or "error" (the engine failed; the fourth item says why).
"""
from __future__ import annotations

import logging
import threading
from collections import deque

from experiments.serve.errors import APIError

log = logging.getLogger("servelab.serve")


class Choice:
    """One sequence of an HTTP request, as the engine thread follows it."""
    __slots__ = ("index", "seq", "queue", "num_sent", "last_token_s", "admitted")

    def __init__(self, index: int, seq, queue):
        self.index = index
        self.seq = seq
        self.queue = queue
        self.num_sent = 0               # output tokens handed to the loop
        self.last_token_s = 0.0         # engine-clock time of the last one
        self.admitted = False

    @property
    def request_id(self):
        return self.seq.request_id


class AsyncEngine:
    def __init__(self, llm, metrics):
        self.llm = llm
        self.metrics = metrics
        self.error: str | None = None   # why the engine thread died, when it did
        self._inbox: deque = deque()    # ("add", Choice) | ("abort", Choice, count_as_aborted)
        self._wake = threading.Event()
        self._live: dict = {}           # request_id -> Choice (engine thread only)
        self._loop = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- the loop's side ------------------------------------------------------------------
    def start(self, loop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="servelab-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def num_waiting(self) -> int:
        """Requests not yet running: queued in the scheduler (preempted ones too) or still in the inbox."""
        return len(self.llm.scheduler.waiting) + sum(1 for item in tuple(self._inbox) if item[0] == "add")

    def submit(self, entries, queue) -> list[Choice]:
        """Queues (index, Sequence) pairs whose tokens go to `queue`; APIError(503) once the engine stopped."""
        if not self.alive:
            raise APIError(503, f"the engine is not running ({self.error or 'shutting down'}); retry later")
        choices = [Choice(i, seq, queue) for i, seq in entries]
        self._inbox.extend(("add", c) for c in choices)
        self._wake.set()
        return choices

    def abort(self, choices, count_as_aborted: bool = True) -> None:
        """Drops these choices' sequences (those not finished) and frees their KV blocks, between steps.
        count_as_aborted False: the server ended them on purpose (a stop string), not a client leaving."""
        self._inbox.extend(("abort", c, count_as_aborted) for c in choices)
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Aborts every request left (each gets finish_reason "abort") and joins the engine thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        llm = self.llm
        try:
            while True:
                self._wake.clear()
                self._drain()
                if self._stopping:
                    break
                if not llm.has_unfinished():
                    self._wake.wait()
                    continue
                batch, finished = llm.step_batch()
                if batch is None:       # the policy holds everything back: only an arrival or abort helps
                    self._wake.wait(0.005)
                    continue
                self._report(batch, finished)
        except Exception as e:          # the engine failed: every request gets the error, /health goes 503
            self.error = f"{type(e).__name__}: {e}"
            log.exception("engine step failed; the server stops serving")
            self._stopping = True
            self._end_all("error", self.error)
            return
        self._drain()
        self._end_all("abort", None)

    def _drain(self) -> None:
        llm, live, inbox = self.llm, self._live, self._inbox
        while inbox:
            item = inbox.popleft()
            choice = item[1]
            rid = choice.request_id
            if item[0] == "add":
                try:
                    llm.submit(choice.seq)
                except ValueError as e:
                    self._post([(choice.queue, (choice.index, [], "error", str(e)))])
                    continue
                live[rid] = choice
            elif live.pop(rid, None) is not None and llm.abort_request(rid) and item[2]:
                self.metrics.aborted.inc()

    def _end_all(self, reason: str, error: str | None) -> None:
        """Ends every live request (shutdown or engine failure); their KV blocks are freed."""
        updates = []
        for rid, choice in list(self._live.items()):
            if reason == "abort":
                self.llm.abort_request(rid)
                self.metrics.aborted.inc()
            updates.append((choice.queue, (choice.index, [], reason, error)))
        self._live.clear()
        self._post(updates)
        self._gauges()

    def _report(self, batch, finished) -> None:
        m, live = self.metrics, self._live
        now = self.llm.clock()
        updates = []
        num_new = 0
        for seq in batch.seqs:
            choice = live.get(seq.request_id)
            if choice is None:
                continue
            if not choice.admitted and seq.admit_order >= 0:
                choice.admitted = True
                m.admitted(seq.num_prompt_tokens, seq.num_cached_tokens)
            n = seq.num_output_tokens
            if n <= choice.num_sent:
                continue        # an intermediate prefill chunk
            new = seq.token_ids[seq.num_prompt_tokens + choice.num_sent:]
            if choice.num_sent == 0:
                m.ttft.observe(seq.first_token_time_s - seq.arrival_time_s)
            else:
                m.itl.observe(now - choice.last_token_s)
            num_new += len(new)
            choice.num_sent = n
            choice.last_token_s = now
            reason = seq.finish_reason if seq.is_finished else None
            updates.append((choice.queue, (choice.index, new, reason, None)))
        for seq in finished:
            if live.pop(seq.request_id, None) is not None:
                m.finished("stop" if seq.finish_reason == "eos" else seq.finish_reason)
                m.e2e.observe(seq.finish_time_s - seq.arrival_time_s)
        m.generation_tokens.inc(num_new)
        num_preempted = len(batch.preempted) + len(batch.swapped_out)
        if num_preempted:
            m.preemptions.inc(num_preempted)
        self._post(updates)
        self._gauges()

    def _gauges(self) -> None:
        s, m = self.llm.scheduler, self.metrics
        bm = s.block_manager
        m.waiting.set(len(s.waiting))
        m.running.set(len(s.running))
        m.swapped.set(len(s.swapped))
        m.kv_usage.set(bm.num_used_blocks / bm.num_blocks)

    def _post(self, updates) -> None:
        if updates:
            self._loop.call_soon_threadsafe(_deliver, updates)


def _deliver(updates) -> None:
    for queue, item in updates:
        queue.put_nowait(item)
