"""Discrete-event simulation of serving replicas: the engine's scheduler, a cost model's clock.

Each replica is one SimPy process that loops

    pull the requests that have arrived by now (arrival_time_s <= now) into the scheduler
    batch = scheduler.schedule(now)             # the engine's own scheduler and block manager
    wait cost_model.step_time_s(batch) seconds
    scheduler.postprocess(batch, dummy tokens, now)

so a request arriving at time t is seen by the first step that starts at a time
>= t (a step starting exactly at t sees it). Tokens are emitted at the end of the
step that produced them, as in the engine; every request runs to its max_tokens
with the per-request dummy token of sim.arrivals. An idle replica sleeps until
its next arrival; it never polls. The first step it runs after waiting (for an arrival, or a
policy holding its work back) pays cost_model.cold_start_s(seconds waited) on top: host time
before that step (0 for every model but a calibrated one with cold_step).

Decode fast path (exact): before scheduling, a replica with running sequences asks the
scheduler how many upcoming steps are certain to be pure decodes and takes them at once;
sim/fast_path.py says how, and why the tables stay the same as step by step.

Routing happens at the arrival time; at equal times all arrivals are routed
before any replica ends or starts a step (arrival events have SimPy's URGENT
priority). Events are scheduled at absolute times, the replica's own sums of
step durations, so both paths produce bit-identical clocks. When replicas cannot
interact (one replica, or a router blind to replica state) and no `until` is
given, a plain time-ordered loop drives the replica processes instead of SimPy
(they yield the absolute time they wait for); the order of events is the same.
"""
from __future__ import annotations

import math
import time
from heapq import heapify, heappop, heappush

import simpy
from simpy.events import NORMAL, URGENT, Event

from engine.core.in_flight import is_placeholder
from engine.core.recorder import RECORD_STEPS, Recorder
from sim.arrivals import Arrivals, dummy_token_id, negative_id_token, private_blocks_exact, token_of
from sim.fast_path import APPLIED, FastPathMixin
from sim.replica import Replica
from sim.result import SimResult
from sim.router import ReplicaView, RoundRobinRouter, Router, get_router

INF = math.inf
PROMPT_IDS = ("auto", "hashed", "private", "zeros")


class _At(Event):
    """An event at an absolute simulated time (a Timeout adds a delay to `now`, which can round
    differently from the replica's own running sum of step durations)."""

    def __init__(self, env: simpy.Environment, at_s: float, priority=NORMAL):
        if at_s < env._now:
            raise RuntimeError(f"event at t={at_s!r} is in the past (now {env._now!r})")
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        heappush(env._queue, (at_s, priority, next(env._eid), self))


class Simulator(FastPathMixin):
    """Runs replicas behind a router over a workload, once.

    replicas: a Replica or a list of them. router: a sim.router.Router, a router name, or None
    (round_robin). fast_path=False forces one scheduler step per event (the reference the fast
    path is tested against). record: give each replica without a recorder an engine Recorder.
    vocab_size, prompt_seed: for prompt ids of RequestSpecs (experiments.workloads.prompt_token_ids).
    keep_finished: keep finished/rejected Sequences in .finished/.rejected (default: only when
    every request came as a prebuilt Sequence; a million-request run should not).
    prompt_ids: how RequestSpecs get prompt token ids (sim.arrivals): "hashed" (every token from
    experiments.workloads.prompt_token_ids, every block hashed by content), "private" (only the tokens
    of prefix-hash blocks; the rest of each prompt and its outputs are keyed per request, not hashed:
    the same tables, see sim.arrivals), "zeros" (every prompt token 0), or "auto" (default: private if
    any replica caches prefixes and the vocabulary is large enough, hashed if it is not, else zeros;
    without a prefix cache nothing in the scheduler, block manager, routers or cost model reads token
    values, so the tables are the same either way).
    record_steps: per-step rows of the recorders the Simulator creates: "all" or "none"
    (engine.core.recorder.Recorder; "none" keeps only the request table, for very long runs).
    """

    def __init__(self, replicas: Replica | list[Replica], router: Router | str | None = None, *,
                 fast_path: bool = True, record: bool = True, vocab_size: int = 151936, prompt_seed: int = 0,
                 max_fast_steps: int = 1 << 16, keep_finished: bool | None = None, prompt_ids: str = "auto",
                 record_steps: str = "all"):
        self.replicas = [replicas] if isinstance(replicas, Replica) else list(replicas)
        if not self.replicas:
            raise ValueError("Simulator needs at least one Replica")
        if len({id(r.scheduler) for r in self.replicas}) != len(self.replicas):
            raise ValueError("each Replica needs its own Scheduler (and KV cache)")
        if router is None:
            router = RoundRobinRouter()
        elif isinstance(router, str):
            router = get_router(router)
        elif not isinstance(router, Router):
            raise TypeError(f"router must be a sim.router.Router or a router name, got {type(router).__name__}")
        if max_fast_steps < 1:
            raise ValueError(f"max_fast_steps must be >= 1, got {max_fast_steps}")
        if record_steps not in RECORD_STEPS:
            raise ValueError(f"record_steps must be one of {RECORD_STEPS}, got {record_steps!r}")
        if prompt_ids not in PROMPT_IDS:
            raise ValueError(f"prompt_ids must be one of {PROMPT_IDS}, got {prompt_ids!r}")
        if prompt_ids == "auto":
            caching = [r.scheduler.block_manager for r in self.replicas
                       if r.scheduler.block_manager.enable_prefix_caching]
            if not caching:
                prompt_ids = "zeros"
            elif all(private_blocks_exact(vocab_size, bm.block_size) for bm in caching):
                prompt_ids = "private"
            else:
                prompt_ids = "hashed"
        self.prompt_ids = prompt_ids
        for i, r in enumerate(self.replicas):
            r.index = i
            if record and r.recorder is None:
                r.recorder = Recorder(replica=i, record_steps=record_steps)
        self.router = router
        self.views = [ReplicaView(r) for r in self.replicas]
        self.fast_path = fast_path
        self.vocab_size = vocab_size
        self.prompt_seed = prompt_seed
        self.max_fast_steps = int(max_fast_steps)
        self.keep_finished = keep_finished
        self.env = simpy.Environment()
        # One replica, or a router blind to replica state: route ahead, bound horizons per replica.
        self._prerouted = len(self.replicas) == 1 or not router.reads_replica_state
        self._track_load = not self._prerouted
        self._keep = False
        self._src = None                     # iterator over the run's requests (specs or Sequences)
        self._arrivals: Arrivals | None = None
        self._next_arrival_s = INF           # next arrival not routed yet (state-reading routers)
        self._arrivals_done = False
        self._int_ids = True                 # every id so far a non-negative int: inline dummy tokens
        self._started = False
        self._direct = False                 # run without SimPy events (set by run)
        self.finished: list = []
        self.rejected: list = []
        self.num_requests = 0
        self.num_finished = 0
        self.num_rejected = 0

    # -- arrivals and routing ---------------------------------------------------------
    def _materialize(self, item):
        seq = self._arrivals.materialize(item)
        rid = seq.request_id
        if type(rid) is not int or rid < 0:
            self._int_ids = False
        self.num_requests += 1
        return seq

    def _route(self, seq) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        i = self.router.route(seq, self.views)
        if type(i) is not int or not 0 <= i < len(self.replicas):
            raise ValueError(f"router {self.router.name!r} returned {i!r} for request {seq.request_id!r}; "
                             f"it must return an int in [0, {len(self.replicas)})")
        r = self.replicas[i]
        if self._track_load:
            r.outstanding_tokens += seq.num_prompt_tokens + seq.max_output_tokens
        return r

    def _fill(self, r: Replica) -> None:
        """Pre-routed mode: route requests ahead until r knows its next arrival (or none are left)."""
        src = self._src
        while not r.inbox and src is not None:
            item = next(src, None)
            if item is None:
                self._src = None
                return
            seq = self._materialize(item)
            self._route(seq).inbox.append(seq)

    def _arrival_process(self):
        env = self.env
        for item in self._src:
            t = item.arrival_time_s
            self._next_arrival_s = t
            if t > env.now:
                yield _At(env, t, URGENT)
            seq = self._materialize(item)
            r = self._route(seq)
            r.inbox.append(seq)
            r.notify()
        self._next_arrival_s = INF
        self._arrivals_done = True
        for r in self.replicas:
            r.notify()

    def _reject(self, r: Replica, seq) -> None:
        self.num_rejected += 1
        if self._keep:
            self.rejected.append(seq)
        if r.recorder is not None:
            r.recorder.on_finish(seq)
        if self._track_load:
            r.outstanding_tokens -= seq.num_prompt_tokens + seq.max_output_tokens

    def _wait_for_arrival(self, r: Replica):
        """Event for r's next arrival, or None when no more requests can reach r."""
        if self._prerouted:
            if not r.inbox:
                self._fill(r)
            if not r.inbox:
                return None
            return r.inbox[0].arrival_time_s if self._direct else _At(self.env, r.inbox[0].arrival_time_s)
        if self._arrivals_done and not r.inbox:
            return None
        r.wakeup = self.env.event()
        return r.wakeup

    # -- one replica -----------------------------------------------------------------------
    def _next_arrival(self, r: Replica, stalled_at: float | None = None):
        """Waits (yields) for r's next arrival and returns the time then; None when no request can reach r
        any more, which is a RuntimeError when r has unfinished work (stalled_at: the time)."""
        ev = self._wait_for_arrival(r)
        if ev is None:
            if stalled_at is not None:
                raise RuntimeError(f"replica {r.index} stalled at t={stalled_at:.6f}s: {r.scheduler.num_unfinished} "
                                   f"unfinished requests, nothing schedulable, no arrivals left")
            return None
        yield ev
        r.wakeup = None
        return ev if self._direct else self.env.now

    def _pull_arrivals(self, r: Replica, t: float) -> None:
        """Queue every request routed to r that has arrived by t (a step starting at t sees arrivals at t)."""
        inbox, sched, prerouted = r.inbox, r.scheduler, self._prerouted
        while True:
            if not inbox:
                if not prerouted:
                    return
                self._fill(r)
                if not inbox:
                    return
            if inbox[0].arrival_time_s > t:
                return
            seq = inbox.popleft()
            if not sched.add(seq):
                self._reject(r, seq)

    def _replica_loop(self, r: Replica):
        if r.overlap_scheduling:
            yield from self._overlap_loop(r)
            return
        env, sched, cm, rec = self.env, r.scheduler, r.cost_model, r.recorder
        bm = sched.block_manager
        inbox = r.inbox
        prerouted, track = self._prerouted, self._track_load
        fast = self.fast_path and sched.policy.fast_forward_ok
        direct = self._direct        # yield absolute times to _run_direct instead of SimPy events
        t = env.now
        idle_from = None        # when the loop began to wait for an arrival (cost_model.cold_start_s); None: busy
        while True:
            if not inbox or inbox[0].arrival_time_s <= t:       # (else nothing has arrived: skip the call)
                self._pull_arrivals(r, t)
            if not (sched.running or sched.waiting or sched.swapped):
                idle_from = t if idle_from is None else idle_from
                t = yield from self._next_arrival(r)
                if t is None:
                    return
                continue

            if fast and sched.running:
                t_next = (inbox[0].arrival_time_s if inbox else INF) if prerouted else self._next_arrival_s
                if r.horizon_spent:
                    # The last fast call took a horizon that free blocks cut short: the next step needs a
                    # block that is not free, so decode_horizon would say 0.
                    r.horizon_spent = False
                else:
                    t_end = self._fast_forward(r, t, t_next)
                    if t_end is not None:
                        yield t_end if direct else _At(env, t_end)
                        t = t_end
                        continue

            batch = sched.schedule(t)
            for seq in batch.rejected:      # given up by the policy (e.g. a target it can no longer meet)
                self._reject(r, seq)
            seqs = batch.seqs
            if not seqs and not batch.swap_in and not batch.swap_out and not batch.offload:
                if batch.rejected and not sched.has_unfinished():
                    continue        # the policy rejected all that was left: wait for arrivals as usual
                # Unfinished work but nothing runnable (a policy holding requests back): only an
                # arrival can change that.
                idle_from = t if idle_from is None else idle_from
                t = yield from self._next_arrival(r, stalled_at=t)
                continue
            dur = cm.step_time_s(batch)
            if idle_from is not None:
                dur += cm.cold_start_s(t - idle_from)
                idle_from = None
            npf = batch.num_prefill_seqs
            if rec is not None:
                rec.on_step(t, dur, batch, bm.num_used_blocks, bm.num_free_blocks, bm.num_cached_free_blocks)
            if npf == 0 and seqs:
                r.last_decode_s = dur
            r.num_steps += 1
            r.busy_s += dur
            end = t + dur
            yield end if direct else _At(env, end)
            if track:
                r.outstanding_tokens -= self._emitted_load(batch)
            if self._int_ids:
                tokens = [-1 - s.request_id for s in seqs]
            else:
                tokens = [dummy_token_id(s.request_id) for s in seqs]
            done = sched.postprocess(batch, tokens, end)
            t = end
            if done:
                self._record_finished(rec, done)

    def _overlap_loop(self, r: Replica):
        """The replica's loop with overlap scheduling (docs/overlap.md), timed as engine.llm.LLM's loop runs:

            host:    schedule step N+1 at t, prepare and launch it (cost_model.overlap_parts_s: its host seconds
                     before the launch), then wait for step N's tokens
            device:  step N+1 runs its device seconds from max(its launch, step N's end)
            host:    step N's tokens are on the host at max(step N's end, step N+1's launch) (its tokens' time);
                     its postprocess and the loop take its host seconds after the tokens; then step N+2 is
                     scheduled

        so a step's input preparation hides behind the step before's device time, not its own: a long
        prefill after a short decode step leaves the device idle for the rest of its preparation. A step
        with block copies (swaps, CPU-tier loads and offloads) first waits for the device to finish the
        step before (their pinned staging is shared: engine/model_runner.launch), prepares after that, and
        the step before's row ends there. With
        the pipeline empty, a step and the next one are scheduled back to back (the second once the first
        is launched). A recorder row runs from the previous step's tokens on the host (or its own
        schedule, after an idle device) to its own, as the engine records it; consecutive rows tile the
        busy time, and sim/overlap_timeline.py prices a recorded table the same way. A model without a
        host term runs steps back to back at step_time_s. Runs of pure decodes take the overlap fast path
        (sim/fast_path.py, _overlap_fast)."""
        env, sched, cm, rec = self.env, r.scheduler, r.cost_model, r.recorder
        bm = sched.block_manager
        track, direct = self._track_load, self._direct
        fast = self.fast_path and sched.policy.fast_forward_ok        # sim/fast_path.py, _overlap_fast
        t = env.now
        in_flight = None     # (batch, its device end, recorder row, schedule time, its loop seconds) on the device
        last_end_s = None        # where the step before's row ended; None after an idle device
        idle_from = None         # when the loop began to wait for an arrival (cost_model.cold_start_s); None: busy
        while True:
            self._pull_arrivals(r, t)
            if in_flight is None and not (sched.running or sched.waiting or sched.swapped):
                idle_from = t if idle_from is None else idle_from
                t = yield from self._next_arrival(r)
                if t is None:
                    return
                last_end_s = None
                continue
            if fast and in_flight is not None and r.overlap_fast_ok and sched.running:
                taken = self._overlap_fast(r, t, in_flight, last_end_s)
                if taken is not None:
                    t_end, in_flight, last_end_s = taken
                    if t_end > t:
                        yield t_end if direct else _At(env, t_end)
                    t = t_end
                    continue
            batch = sched.schedule(t)
            for seq in batch.rejected:
                self._reject(r, seq)
            launched = drained_s = None     # drained_s: when a launch with block copies found the device idle
            host_s = t                      # the host's clock once this iteration's launch is done
            if not batch.is_empty:
                prepare, device, loop = cm.overlap_parts_s(batch)
                if idle_from is not None:
                    prepare += cm.cold_start_s(t - idle_from)
                    idle_from = None
                if in_flight is not None and (batch.swap_out or batch.swap_in or batch.offload or batch.load):
                    drained_s = max(t, in_flight[1])
                    host_s = drained_s + prepare
                else:
                    host_s = t + prepare
                start = host_s if in_flight is None else max(host_s, in_flight[1])
                row = -1
                if rec is not None:
                    rec.on_step(t, 0.0, batch, bm.num_used_blocks, bm.num_free_blocks, bm.num_cached_free_blocks)
                    row = rec.num_steps - 1
                sched.mark_in_flight(batch)
                launched = (batch, start + device, row, t, loop)
            elif in_flight is None:
                if batch.rejected and not sched.has_unfinished():
                    continue
                idle_from = t if idle_from is None else idle_from
                t = yield from self._next_arrival(r, stalled_at=t)
                last_end_s = None
                continue
            if in_flight is None:           # the pipeline was empty: schedule the next step behind this one
                in_flight = launched
                if host_s > t:
                    yield host_s if direct else _At(env, host_s)
                t = host_s
                continue
            done_batch, device_end, row, scheduled_s, loop = in_flight
            tokens_s = max(device_end, host_s)
            yield tokens_s if direct else _At(env, tokens_s)
            begin = scheduled_s if last_end_s is None else max(scheduled_s, last_end_s)
            end_s = tokens_s if drained_s is None else max(begin, min(tokens_s, drained_s))
            if rec is not None:
                rec.set_step_time(row, begin, end_s - begin)
            r.num_steps += 1
            r.busy_s += end_s - begin
            if track and done_batch is not APPLIED:
                r.outstanding_tokens -= self._emitted_load(done_batch, in_flight=True)
            if done_batch is not APPLIED:       # (APPLIED: the overlap fast path postprocessed it)
                token = self._token_fn()
                done = sched.postprocess_in_flight(done_batch, [token(s) for s in done_batch.seqs], tokens_s)
                if done:
                    self._record_finished(rec, done)
            last_end_s, in_flight = end_s, launched
            t = tokens_s + loop
            if loop:
                yield t if direct else _At(env, t)

    def _record_finished(self, rec, done: list) -> None:
        self.num_finished += len(done)
        if rec is not None:
            for seq in done:
                rec.on_finish(seq)
        if self._keep:
            self.finished.extend(done)

    def _token_fn(self):
        """seq -> its dummy token (sim.arrivals.token_of), inlined while every id is a non-negative int."""
        return negative_id_token if self._int_ids else token_of

    @staticmethod
    def _emitted_load(batch, in_flight: bool = False) -> int:
        """Outstanding tokens a finished step retires: each emitted token, plus the prompt of each
        request that emitted its first token. Call before postprocess (in_flight: before
        postprocess_in_flight of a batch marked in flight, whose sampled entries hold a placeholder)."""
        seqs, ctx = batch.seqs, batch.context_lens
        npf = batch.num_prefill_seqs
        out = len(seqs) - npf
        for j in range(npf):
            s = seqs[j]
            if (ctx[j] < len(s.token_ids) and is_placeholder(s.token_ids[ctx[j]])) if in_flight \
                    else ctx[j] == len(s.token_ids):
                out += 1 if s.first_token_time_s is not None else 1 + s.num_prompt_tokens
        return out

    def _run_direct(self) -> None:
        """Drive the replica processes, which yield the absolute time they wait for, in time order."""
        env = self.env
        if len(self.replicas) == 1:      # one process: its own times in order, no heap
            now = env._now
            for at in self._replica_loop(self.replicas[0]):
                if at < now:
                    raise RuntimeError(f"event at t={at!r} is in the past (now {now!r})")
                env._now = now = at
            return
        queue = []
        eid = 0
        for r in self.replicas:
            queue.append((env._now, eid, self._replica_loop(r)))
            eid += 1
        heapify(queue)
        while queue:
            now, _, proc = heappop(queue)
            env._now = now               # keeps env.now meaningful (e.g. after an interrupt)
            try:
                at = next(proc)
            except StopIteration:
                continue
            if at < now:
                raise RuntimeError(f"event at t={at!r} is in the past (now {now!r})")
            heappush(queue, (at, eid, proc))
            eid += 1

    # -- entry point -------------------------------------------------------------------
    def run(self, requests, until: float | None = None) -> SimResult:
        """Simulate `requests`: a Workload, or RequestSpecs and/or Sequences in any order."""
        if self._started:
            raise RuntimeError("a Simulator runs once; build a new one (with fresh schedulers) for another run")
        self._started = True
        wall0 = time.perf_counter()
        self._arrivals = Arrivals(requests, self.vocab_size, self.prompt_seed, self.prompt_ids)
        self._keep = self._arrivals.all_sequences if self.keep_finished is None else self.keep_finished
        self._src = iter(self._arrivals)
        self.router.reset(self.views)
        env = self.env
        # Replicas behind a router blind to their state never interact: a plain time-ordered loop over
        # their processes replaces SimPy's event objects (same order: time, then creation).
        self._direct = self._prerouted and until is None
        if self._direct:
            self._run_direct()
        else:
            if not self._prerouted:
                env.process(self._arrival_process())
            for r in self.replicas:
                env.process(self._replica_loop(r))
            env.run(until=until)
        reps = self.replicas
        return SimResult(end_time_s=env.now, num_requests=self.num_requests, num_finished=self.num_finished,
                         num_rejected=self.num_rejected, num_steps=sum(r.num_steps for r in reps),
                         num_fast_steps=sum(r.num_fast_steps for r in reps), busy_s=[r.busy_s for r in reps],
                         wall_s=time.perf_counter() - wall0, replicas=reps)
