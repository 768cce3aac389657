"""Scheduling policy contract.

The scheduler (engine/core/scheduler.py) owns the queues and the block manager and
builds one batch per step. A policy decides *order* and *permission*; the
scheduler applies those decisions through the block manager and refuses any
that do not fit (memory, `max_num_seqs`, `max_num_batched_tokens`).

What a policy sees: a `SchedulerView` (now_s, free/total blocks, block size,
the running / waiting / swapped sequences, and `blocks_needed`), plus the
sequences themselves, read-only (request_id, arrival_time_s, priority,
num_prompt_tokens, num_computed_tokens, num_output_tokens, max_output_tokens,
block_table, ...). A policy must never mutate a Sequence or the view; it keeps
any state of its own (keyed by request_id) and updates it in `on_step`.

What a policy returns, per call:
  order_waiting(waiting, view) -> the waiting sequences (new and preempted) in
      admission order. The scheduler admits in that order and stops at the first
      one that does not fit (head-of-line blocking, as in vLLM).
  order_running(running, view) -> the running sequences in service order; when
      the token budget runs out, the tail waits a step.
  key(seq, view) -> a sortable rank, lower = more important. Preemptive
      policies compare waiting and running sequences with it; with
      `ranked = True` the default orders above sort by it.
  admits(seq, view) -> bool: an extra admission gate (fcfs reserves the whole
      footprint; most policies return True).
  on_step(batch, view) -> None: bookkeeping after each scheduled batch.
  on_finish(seq) -> None: the sequence left (finished, or rejected by the policy):
      drop its per-request state.
  reject_reason(seq, view) -> str | None: read only when `may_reject`; called at
      the start of each step for every waiting sequence. A reason rejects it (status
      REJECTED, reject_reason "policy <name>: <reason>"); the batch lists it in
      `rejected` so that the backend records it.

Attributes the scheduler reads:
  preemptive: a waiting (or swapped) sequence may preempt running sequences of a
      worse key when memory or the sequence cap is the obstacle.
  preemption_mode: "recompute" (free the blocks, re-prefill later) or "swap"
      (copy the blocks to the CPU swap space; swapped sequences come back, in
      key order, before any new admission).
  chunked_prefill: None to follow SchedulerConfig.enable_chunked_prefill, or
      True/False to force the step shape (sarathi forces True).
  token_budget: None, or a per-step token cap applied on top of
      SchedulerConfig.max_num_batched_tokens (the smaller wins).
  may_reject: True if the policy may reject waiting sequences (reject_reason).
  fast_forward_ok: True if, while the waiting queue is empty (or, without
      chunked prefill, its head stays blocked), the policy's decisions cannot
      change during pure decode steps and on_step keeps no state. The simulator
      then advances several decode steps at once (sim.fast_forward.DecodeFastForward).
  victim: a VictimPolicy choosing which running sequence is preempted, among
      the candidates the scheduler offers (those it may legally preempt).

What the scheduler guarantees: a sequence is scheduled only when its blocks
are allocated; every running sequence that cannot grow is preempted rather
than stalling the batch; nothing is admitted past `max_num_seqs` or the token
budget; a request that could never fit was rejected at arrival.
"""
from __future__ import annotations

from policies.victim.base import VictimPolicy
from policies.victim.newest import NewestVictim


class SchedulingPolicy:
    name = "base"
    preemptive = False
    preemption_mode = "recompute"
    chunked_prefill: bool | None = None
    token_budget: int | None = None
    fast_forward_ok = False
    may_reject = False
    ranked = False          # True: waiting and running are served in key order (the default orders below)

    def __init__(self, victim: VictimPolicy | None = None):
        self.victim = victim if victim is not None else NewestVictim()

    def key(self, seq, view):
        return (seq.arrival_time_s, seq.admit_order)

    def order_waiting(self, waiting, view):
        return sorted(waiting, key=lambda s: self.key(s, view)) if self.ranked else waiting

    def order_running(self, running, view):
        return sorted(running, key=lambda s: self.key(s, view)) if self.ranked else running

    def admits(self, seq, view) -> bool:
        return True

    def on_step(self, batch, view) -> None:
        pass

    def on_finish(self, seq) -> None:
        pass

    def reject_reason(self, seq, view) -> str | None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(victim={self.victim.name})"
