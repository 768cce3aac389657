"""Discrete-event simulation of serving replicas: the engine's scheduler, a cost model's clock.

One SimPy process hands requests (engine.sequence.Sequence) to a replica's
scheduler at their arrival times; one process per replica loops

    batch = scheduler.schedule(now)           # the engine's own scheduler and block manager
    yield env.timeout(cost_model.step_time_s(batch))
    scheduler.postprocess(batch, dummy tokens, now)

Tokens are emitted at the end of the step that produced them, as in the engine.
Every request runs to its `max_tokens` (the sampled ids are a dummy token, so
requests must set `ignore_eos=True` or have no eos id). An idle replica waits on
an event the arrival process triggers; it never polls. Work per step is the
scheduler's plus one cost-model call and one SimPy event.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence as Seq

import simpy

from engine.scheduler import Scheduler
from engine.sequence import Sequence
from sim.cost_model.base import CostModel

DUMMY_TOKEN_ID = 0


class Replica:
    """One serving instance: a scheduler (with its KV cache), a cost model and an optional recorder."""

    def __init__(self, scheduler: Scheduler, cost_model: CostModel, recorder=None, index: int = 0):
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.recorder = recorder            # engine.recorder.Recorder or None
        self.index = index
        self.wakeup: simpy.Event | None = None   # set while idle; triggered by the next arrival
        self.num_steps = 0
        self.busy_s = 0.0                   # simulated seconds spent executing steps

    def notify(self) -> None:
        w = self.wakeup
        if w is not None and not w.triggered:
            w.succeed()


def round_robin() -> Callable[[Sequence, list[Replica]], int]:
    """Default router: replicas in turn (state lives in the closure, one per simulation)."""
    state = {"next": -1}

    def route(seq: Sequence, replicas: list[Replica]) -> int:
        state["next"] = (state["next"] + 1) % len(replicas)
        return state["next"]
    return route


class Simulator:
    def __init__(self, replicas: Replica | list[Replica],
                 router: Callable[[Sequence, list[Replica]], int] | None = None):
        self.replicas = [replicas] if isinstance(replicas, Replica) else list(replicas)
        if not self.replicas:
            raise ValueError("Simulator needs at least one Replica")
        for i, r in enumerate(self.replicas):
            r.index = i
        self.router = router or round_robin()
        self.env = simpy.Environment()
        self.finished: list[Sequence] = []
        self.rejected: list[Sequence] = []
        self._arrivals_done = False
        self._started = False

    # -- processes -------------------------------------------------------------------
    def _arrivals(self, seqs: Seq[Sequence]):
        env, replicas, route = self.env, self.replicas, self.router
        timeout = env.timeout
        for seq in seqs:
            delay = seq.arrival_time_s - env.now
            if delay > 0:
                yield timeout(delay)
            r = replicas[route(seq, replicas)] if len(replicas) > 1 else replicas[0]
            if r.scheduler.add(seq):
                r.notify()
            else:
                self.rejected.append(seq)
                if r.recorder is not None:
                    r.recorder.on_finish(seq)
        self._arrivals_done = True
        for r in replicas:
            r.notify()          # let idle replicas see that no more work comes

    def _replica_loop(self, r: Replica):
        env, sched, cm, rec = self.env, r.scheduler, r.cost_model, r.recorder
        bm = sched.block_manager
        finished = self.finished
        while True:
            if not sched.has_unfinished():
                if self._arrivals_done:
                    return
                r.wakeup = env.event()
                yield r.wakeup
                r.wakeup = None
                continue
            start = env.now
            batch = sched.schedule(start)
            if batch.is_empty:
                # Unfinished work but nothing runnable now (a policy holding requests back): only an
                # arrival can change that.
                if self._arrivals_done:
                    raise RuntimeError(f"replica {r.index} stalled at t={start:.6f}s: {sched.num_unfinished} "
                                       f"unfinished requests, nothing schedulable, no arrivals left")
                r.wakeup = env.event()
                yield r.wakeup
                r.wakeup = None
                continue
            duration = cm.step_time_s(batch)
            yield env.timeout(duration)
            end = env.now
            done = sched.postprocess(batch, [DUMMY_TOKEN_ID] * len(batch.seqs), end)
            r.num_steps += 1
            r.busy_s += duration
            if rec is not None:
                rec.on_step(start, duration, batch, bm.num_used_blocks, bm.num_free_blocks,
                            bm.num_cached_free_blocks)
                for seq in done:
                    rec.on_finish(seq)
            if done:
                finished.extend(done)

    # -- entry point -------------------------------------------------------------------
    def run(self, requests: Iterable[Sequence], until: float | None = None) -> float:
        """Simulate `requests` (any order; sorted by arrival here); returns the simulated end time in s."""
        if self._started:
            raise RuntimeError("a Simulator runs once; build a new one (with fresh schedulers) for another run")
        self._started = True
        seqs = sorted(requests, key=lambda s: s.arrival_time_s)
        for seq in seqs:
            if not seq.sampling_params.ignore_eos and seq.eos_token_id == DUMMY_TOKEN_ID:
                raise ValueError(f"request {seq.request_id!r}: the simulator samples token {DUMMY_TOKEN_ID}, which is "
                                 f"its eos_token_id; set SamplingParams(ignore_eos=True)")
            if seq.arrival_time_s < 0:
                raise ValueError(f"request {seq.request_id!r}: arrival_time_s must be >= 0, got {seq.arrival_time_s}")
        env = self.env
        env.process(self._arrivals(seqs))
        for r in self.replicas:
            env.process(self._replica_loop(r))
        env.run(until=until)
        return env.now
