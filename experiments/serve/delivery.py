"""What the HTTP side does with a step's output, wherever the engine steps (a thread or its own process).

    table = Deliveries(metrics)
    table.track(choices)                              # on submit
    table.on_step(records, num_preempted)             # a step's records: tokens to queues, then metrics
    table.fail([(request_id, why)], "rejected")       # refused or rejected requests
    table.end_all("abort" | "error", error)           # shutdown or engine failure: every request left

A record is (request_id, new_token_ids, finish_reason or None, first_token_time_s, last_token_time_s,
finish_time_s or None, num_prompt_tokens, num_cached_tokens): the tokens a sequence made since its last
record (empty for a prefill chunk that made none, whose record only admits it), times in seconds of
time.perf_counter (CLOCK_MONOTONIC, the same clock in every process of the host). Items a request's
queue receives: (choice index, new token ids, finish reason or None, error text or None), as
experiments/serve/engine_loop.py describes.

A choice's admission sets its prompt's PromptUsage: the response's usage.prompt_tokens_details.cached_tokens
and /metrics' prompt tokens count each prompt once, also with n > 1 choices of it (the first of them admitted
counts; its prefix hits are the ones the cache held before this request). The routes share one PromptUsage
among a prompt's choices right after submit returns, before any step record can reach them (both run on the
event loop, with no await between).
"""
from __future__ import annotations

import asyncio


class PromptUsage:
    """One prompt of an HTTP request, shared by its choices: whether one of them was admitted, with how many
    prompt tokens served by the prefix cache."""
    __slots__ = ("admitted", "num_cached_tokens")

    def __init__(self):
        self.admitted = False
        self.num_cached_tokens = 0      # prompt tokens of the first admitted choice the prefix cache served


class Choice:
    """One sequence of an HTTP request, as the loop follows it."""
    __slots__ = ("index", "seq", "queue", "num_sent", "last_token_s", "admitted", "prompt")

    def __init__(self, index: int, seq, queue):
        self.index = index
        self.seq = seq
        self.queue = queue
        self.num_sent = 0               # output tokens handed to the queue
        self.last_token_s = 0.0         # engine-clock time of the last of them
        self.admitted = False
        self.prompt = PromptUsage()     # its own until the routes share one among a prompt's choices


class Deliveries:
    """The choices in flight (request_id -> Choice; the event loop's thread only) and the metrics they feed."""

    def __init__(self, metrics):
        self.metrics = metrics
        self.choices: dict = {}

    def track(self, choices) -> None:
        for c in choices:
            self.choices[c.seq.request_id] = c

    def on_step(self, records, num_preempted: int) -> None:
        """Hands each record's tokens to its request's queue now; the metrics are taken after the requests woken
        here wrote their chunks (loop.call_soon runs after the tasks the puts woke), off a first token's path."""
        choices = self.choices
        ttft, itl, e2e, admitted, finished = [], [], [], [], []
        num_new = 0
        for rid, new, reason, first_s, last_s, finish_s, num_prompt, num_cached in records:
            choice = choices.get(rid)
            if choice is None:
                continue            # finished or aborted already
            if not choice.admitted:
                choice.admitted = True
                prompt = choice.prompt
                first = not prompt.admitted
                if first:
                    prompt.admitted, prompt.num_cached_tokens = True, num_cached
                admitted.append((num_prompt, num_cached, first))
            if new:
                k = len(new)
                if choice.num_sent == 0:
                    ttft.append(first_s - choice.seq.arrival_time_s)
                    if k > 1:       # this read fell behind the engine: the gaps' mean for each
                        itl += [(last_s - first_s) / (k - 1)] * (k - 1)
                else:
                    itl += [(last_s - choice.last_token_s) / k] * k
                choice.num_sent += k
                choice.last_token_s = last_s
                num_new += k
            elif reason is None:
                continue            # an intermediate prefill chunk
            if reason is not None:
                del choices[rid]
                finished.append("stop" if reason == "eos" else reason)
                e2e.append(finish_s - choice.seq.arrival_time_s)
            choice.queue.put_nowait((choice.index, new, reason, None))
        if not (admitted or ttft or itl or e2e or finished or num_new or num_preempted):
            return
        args = (ttft, itl, e2e, admitted, finished, num_new, num_preempted)
        try:
            asyncio.get_running_loop().call_soon(self._account, *args)
        except RuntimeError:        # no loop running (a step read while the server stops): now
            self._account(*args)

    def _account(self, ttft, itl, e2e, admitted, finished, num_new: int, num_preempted: int) -> None:
        m = self.metrics
        for num_prompt, num_cached, first in admitted:
            m.admitted(num_prompt, num_cached, first)
        for reason in finished:
            m.finished(reason)
        m.ttft.observe(ttft)
        m.itl.observe(itl)
        m.e2e.observe(e2e)
        if num_new:
            m.generation_tokens.inc(num_new)
        if num_preempted:
            m.preemptions.inc(num_preempted)

    def fail(self, failed, failed_as: str = "error") -> None:
        """`failed`: (request_id, why) of requests the engine refused (failed_as "error") or the scheduling
        policy rejected ("rejected")."""
        for rid, msg in failed:
            choice = self.choices.pop(rid, None)
            if choice is not None:
                if failed_as == "rejected":
                    self.metrics.policy_rejected.inc()
                choice.queue.put_nowait((choice.index, [], failed_as, msg))

    def end_all(self, reason: str, error: str | None) -> None:
        """Ends every request left with `reason` ("abort": shutdown, counted as aborted; "error")."""
        for choice in self.choices.values():
            if reason == "abort":
                self.metrics.aborted.inc()
            choice.queue.put_nowait((choice.index, [], reason, error))
        self.choices.clear()
