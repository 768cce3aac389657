"""The engine stepping in its own thread while the asyncio loop serves HTTP.

    engine = AsyncEngine(llm, metrics); engine.start(asyncio.get_running_loop())
    choices = engine.submit([(0, seq)], queue)   # on the loop; queue: an asyncio.Queue of this HTTP request
    item = await queue.get()                     # (index, new_token_ids, finish_reason, error)
    engine.abort(choices)                        # client gone: the sequence is dropped, its KV blocks freed
    engine.stop()                                # aborts whatever is left, joins the thread

The thread owns the LLM: requests and aborts reach it through an inbox it drains between steps
(the scheduler core is never touched mid-step), so adding a request never waits for a step to end.
The thread does nothing per sequence beyond the step itself: after each step one
`call_soon_threadsafe` hands the step's sequences to the loop, which reads their new tokens
(outputs only ever grow, also across a preemption, so a late read just finds more) and does the
per-token work (metrics, text, the response) while the next step runs; the GIL is free while the
engine waits for the device. Items a queue receives, per sequence that got tokens: (its index in
the HTTP request, the new token ids, the finish reason or None, None). finish_reason: "length" |
"eos" (from the engine), "abort" (stopped by the server), "rejected" (the scheduling policy gave up
on the waiting sequence, e.g. edf_reject once its deadline cannot be met; the fourth item is the
reject reason) or "error" (the engine failed; the fourth item says why).
"""
from __future__ import annotations

import logging
import threading
from collections import deque

from engine.core.in_flight import settled_tokens
from engine.core.sequence import SequenceStatus
from experiments.serve.delivery import Choice, Deliveries
from experiments.serve.engine_info import EngineInfo
from experiments.serve.errors import APIError

log = logging.getLogger("servelab.serve")
FINISHED = SequenceStatus.FINISHED


class AsyncEngine:
    def __init__(self, llm, metrics):
        self.llm = llm
        self.metrics = metrics
        self.error: str | None = None   # why the engine thread died, when it did
        self._inbox: deque = deque()    # ("add", Sequence) | ("abort", request_id, count_as_aborted)
        self._wake = threading.Event()
        self._live: set = set()         # request ids the engine holds (engine thread only)
        self._table = Deliveries(metrics)
        self._choices = self._table.choices     # request_id -> Choice (loop only)
        self.info = EngineInfo.of(llm)
        self.tokenizer = llm.tokenizer
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
        self._table.track(choices)
        self._inbox.extend(("add", c.seq) for c in choices)
        self._wake.set()
        return choices

    def abort(self, choices, count_as_aborted: bool = True) -> None:
        """Drops these choices' sequences (those not finished) and frees their KV blocks, between steps.
        count_as_aborted False: the server ended them on purpose (a stop string), not a client leaving."""
        for c in choices:
            rid = c.seq.request_id
            if self._choices.pop(rid, None) is not None:
                self._inbox.append(("abort", rid, count_as_aborted))
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Aborts every request left (each gets finish_reason "abort") and joins the engine thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def make_sequence(self, token_ids, params, request_id, arrival_time_s: float):
        return self.llm.make_sequence(token_ids, params, request_id=request_id, arrival_time_s=arrival_time_s)

    def _on_step(self, seqs, num_preempted: int) -> None:
        """The loop's share of a step: new tokens of `seqs` to their queues, metrics. The engine may have
        run further steps since: a sequence then has more tokens, or finished, and later reads find less."""
        choices, records = self._choices, []
        for seq in seqs:
            choice = choices.get(seq.request_id)
            if choice is None:
                continue            # finished or aborted already
            # status first: a FINISHED sequence has all its tokens, so none is left behind
            done = seq.status is FINISHED
            records.append((seq.request_id, settled_tokens(seq.token_ids, seq.num_prompt_tokens + choice.num_sent),
                            seq.finish_reason if done else None, seq.first_token_time_s, seq.last_token_time_s,
                            seq.finish_time_s, seq.num_prompt_tokens, seq.num_cached_tokens))
        self._table.on_step(records, num_preempted)

    def _on_end(self, reason: str, error: str | None, failed, failed_as: str = "error") -> None:
        """Ends every request left (shutdown or engine failure); `failed`: (request_id, why) of requests
        the engine refused (failed_as "error") or the scheduling policy rejected ("rejected")."""
        self._table.fail(failed, failed_as)
        if reason is not None:
            self._table.end_all(reason, error)

    # -- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        llm = self.llm
        log.info("engine thread running (native thread id %d)", threading.get_native_id())
        try:
            while True:
                self._wake.clear()
                self._drain()
                if self._stopping:
                    break
                if not llm.has_unfinished():
                    self._wake.wait()
                    continue
                batch, finished, rejected = llm.step_batch()
                if rejected:            # the policy gave up on them: their clients get an error response
                    for seq in rejected:
                        self._live.discard(seq.request_id)
                    self._post(self._on_end, None, None,
                               [(seq.request_id, seq.reject_reason) for seq in rejected], "rejected")
                if batch is None:       # the policy holds everything back: only an arrival or abort helps
                    self._wake.wait(0.005)
                    continue
                for seq in finished:
                    self._live.discard(seq.request_id)
                self._post(self._on_step, batch.seqs, len(batch.preempted) + len(batch.swapped_out))
        except Exception as e:          # the engine failed: every request gets the error, /health goes 503
            self.error = f"{type(e).__name__}: {e}"
            log.exception("engine step failed; the server stops serving")
            self._stopping = True
            self._post(self._on_end, "error", self.error, ())
            return
        self._drain()
        for rid in list(self._live):
            llm.abort_request(rid)
        self._live.clear()
        self._post(self._on_end, "abort", None, ())

    def _drain(self) -> None:
        llm, live, inbox = self.llm, self._live, self._inbox
        failed = []
        while inbox:
            item = inbox.popleft()
            if item[0] == "add":
                seq = item[1]
                try:
                    llm.submit(seq)
                except ValueError as e:
                    failed.append((seq.request_id, str(e)))
                    continue
                live.add(seq.request_id)
            elif item[1] in live:
                live.discard(item[1])
                if llm.abort_request(item[1]) and item[2]:
                    self.metrics.aborted.inc()
        if failed:
            self._post(self._on_end, None, None, failed)

    def _post(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:            # the loop is closed: nobody is left to tell
            pass
