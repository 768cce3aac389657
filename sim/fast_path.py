"""The simulator's exact decode fast path: many pure-decode steps of one replica in one call.

Before scheduling, the replica asks its scheduler's fast path (sim.fast_forward.DecodeFastForward,
`Replica.fast`) for `k = decode_horizon(limit)`: the number of upcoming steps that are certain to be
pure decode steps of exactly the current running set if no request arrives
(sequences may finish in the last of them; advance_decodes finishes them).
Their durations come from `cost_model.decode_step_times_s` (the same numbers
step_time_s gives those batches), their end times are accumulated from `now`
in the same order the step-by-step path adds them, and k is cut so that no
arrival could have changed them:
  * routers that ignore replica state (round_robin, or one replica): requests
    are routed ahead of time and every step in the horizon must START strictly
    before the replica's own next arrival;
  * routers that read replica state: every step must END strictly before the
    next arrival anywhere, so each routing decision sees every replica exactly
    as stepping one at a time would (mid-step, with the straddling step
    scheduled by the ordinary path).
The k steps are then applied at once (`advance_decodes`), recorded in bulk
(`Recorder.on_decode_steps`) and waited for with a single event. A call does not
stop where sequences finish if the scheduler grants more steps before the next
arrival: with nothing waiting, policies that serve in admission order take the
steps of the shrinking running set as one sim.fast_forward.DecodeChain
(`Recorder.on_decode_runs`; with a prefix cache while the running sequences'
private blocks are unpublished, and only when the chain reaches at least as far as
the exact horizon); the others take one exact horizon after another.

With overlap scheduling (docs/overlap.md) the loop always has one step in flight; `_overlap_fast` takes
the pure decodes after it the same way, timed by the overlap loop's recursion (its docstring says why the
tables stay the same).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate

from engine.core.sequence import SequenceStatus
from sim.fast_forward import DecodeChain
from sim.replica import Replica

INF = math.inf
RUNNING = SequenceStatus.RUNNING
# The in-flight step of the overlap loop whose effects the overlap fast path already applied: collected for
# its time only (Simulator._overlap_loop).
APPLIED = object()


def _block_counts(bm) -> tuple[int, int, int]:
    """(blocks in use, plain free blocks, cached-free blocks): allocation takes plain free blocks first, then
    evicts cached-free ones (none without a prefix cache)."""
    if bm.enable_prefix_caching:
        return bm.num_used_blocks, len(bm.free_ids) - bm.num_dead_free, bm.num_cached_free_blocks
    return bm.num_used_blocks, bm.num_kvcache_blocks, 0


def _cached_per_step(used: list, used0: int, free0: int, cached0: int):
    """The cached-free blocks after each step's allocation (an int while none is evicted)."""
    if used[-1] - used0 > free0:
        return [cached0 - max(0, u - used0 - free0) for u in used]
    return cached0


class FastPathMixin:
    """The fast-path calls of sim.simulator.Simulator (which holds the state they read: max_fast_steps,
    _prerouted, _track_load, _token_fn, _record_finished)."""

    def _fast_forward(self, r: Replica, t: float, t_next: float) -> float | None:
        """Fast-path calls from t, one after another, while each is taken whole (it ends where a
        sequence finishes or at max_fast_steps) and the scheduler grants another before the next
        arrival: the steps after a finish are pure decodes of the smaller set unless the freed
        room admits a waiting request (decode_horizon then says 0). With nothing waiting, a
        DecodeChain takes the steps past finishes in one call. Returns the end time of the last
        call, or None if none was taken."""
        sched, fast = r.scheduler, r.fast
        t_end = None
        while t_next - t > r.last_decode_s:
            k = fast.decode_horizon(self.max_fast_steps)
            if not k:
                break
            chain = DecodeChain(fast, self.max_fast_steps) if fast.chain_ok() else None
            if chain is not None and chain.num_steps >= k:
                end = self._fast_chain(r, t, chain, t_next)
            else:   # (a chain never evicts: with cached blocks to evict it can be shorter than k)
                end = self._fast_segment(r, t, k, t_next)
            if end is None:
                break
            t_end = t = end
            if not r.segment_whole or r.horizon_spent or not sched.running:
                break
        return t_end

    def _price(self, r: Replica, n: int, s0: int, k: int, t: float, t_next: float,
               m0: int | None = None) -> tuple[list, list]:
        """Durations [j] and clock [j + 1] (t, then each step's end) of the first j <= k decode steps
        of n sequences from t (step i attends s0 + i * n keys, its longest context m0 + i) that the next
        arrival leaves."""
        cm = r.cost_model
        if t_next != INF and r.last_decode_s > 0:
            # Price only the steps the next arrival can leave (an estimate; extended below if short).
            m = min(k, int((t_next - t) / r.last_decode_s) + 2)
        else:
            m = k
        durs = cm.decode_step_times_list(n, s0, m, m0)            # [m] seconds
        clock = list(accumulate(durs, initial=t))                 # the same additions as the step-by-step path
        if t_next == INF:
            return durs, clock
        while m < k and clock[m] < t_next:
            more = cm.decode_step_times_list(n, s0 + m * n, min(k, 2 * m) - m, None if m0 is None else m0 + m)
            durs += more
            clock += accumulate(more, initial=clock[m])
            del clock[m + 1]          # the initial value, already in clock
            m = len(durs)
        if self._prerouted:           # steps must start before the replica's next arrival
            j = bisect_left(clock, t_next, 0, m)
        else:                         # steps must end before any arrival (routing reads the state)
            j = bisect_left(clock, t_next, 1, m + 1) - 1
            if j == 0:
                r.last_decode_s = durs[0]
        if j < m:
            del durs[j:]
            del clock[j + 1:]
        return durs, clock

    def _fast_segment(self, r: Replica, t: float, k: int, t_next: float) -> float | None:
        """Apply up to k pure-decode steps starting at t (sequences may finish in the last one);
        returns the end time, or None if the next arrival leaves none to take. Sets
        r.segment_whole: all k steps were taken."""
        sched, fast = r.scheduler, r.fast
        bm = sched.block_manager
        n = len(sched.running)
        s0 = fast.horizon_context_sum                            # decode_context_sum of the first step
        durs, clock = self._price(r, n, s0, k, t, t_next, fast.horizon_context_max)
        if not durs:
            return None
        # A horizon cut short by free blocks, taken whole: the next step needs a block that is not free.
        r.segment_whole = len(durs) == k
        r.horizon_spent = r.segment_whole and fast.horizon_blocked
        k = len(durs)
        ends = clock[1:]
        used0, free0, cached0 = _block_counts(bm)
        done = []
        used = fast.advance_decodes(k, ends, self._token_fn(), done, t)   # [k] blocks in use after allocation
        rec = r.recorder
        if rec is not None:
            cached = _cached_per_step(used, used0, free0, cached0)
            del clock[-1]
            rec.on_decode_steps(clock, durs, n, s0, used, bm.num_kvcache_blocks, cached, fast.horizon_context_max)
        if self._track_load:
            r.outstanding_tokens -= k * n
        self._count_fast(r, durs, done)
        return ends[-1]

    def _fast_chain(self, r: Replica, t: float, chain: DecodeChain, t_next: float) -> float | None:
        """Apply the steps of `chain` that the next arrival leaves, from t (see _fast_segment)."""
        durs, clock, runs = [], [t], []
        for n, s0, steps, m0 in chain.segments_with_max():
            if self._prerouted and t >= t_next:
                break
            d, c = self._price(r, n, s0, steps, t, t_next, m0)
            if not d:
                break
            runs.append((len(d), n, s0, m0))
            durs += d
            del c[0]
            clock += c
            t = c[-1]
            if len(d) < steps:
                break
        k = len(durs)
        if not k:
            return None
        r.segment_whole = k == chain.num_steps
        r.horizon_spent = r.segment_whole and r.fast.horizon_blocked          # as in _fast_segment
        done = []
        ends = clock[1:]
        used = chain.apply(k, ends, self._token_fn(), done)
        cached = 0
        if type(used) is tuple:      # with a prefix cache: the cached-free blocks per step too
            used, cached = used
        if r.recorder is not None:
            del clock[-1]
            r.recorder.on_decode_runs(clock, durs, runs, used, r.scheduler.block_manager.num_kvcache_blocks, cached)
        if self._track_load:
            r.outstanding_tokens -= sum(j * n for j, n, _, _ in runs)
        self._count_fast(r, durs, done)
        return ends[-1]

    def _overlap_fast(self, r: Replica, t: float, in_flight: tuple, last_end_s: float | None):
        """The decode fast path of the overlap loop (sim.simulator.Simulator._overlap_loop), exact: at the top
        of an iteration that would schedule step j+1 at t while step j, a pure decode of the whole running
        set S, is in flight. If the next M + 1 steps are certain pure decodes of S (decode_horizon on the
        state with step j's placeholders) and the next arrival comes after the iterations that schedule
        them, it runs the loop's time recursion for those iterations on the cost model's parts
        (decode_overlap_parts_lists) and applies their effects at once: step j postprocessed at its tokens'
        time, steps j+1..j+M advanced with their tokens' times (advance_decodes), rows j..j+M-1 timed, row
        j+M opened as at its schedule. Where routing reads replica state, every step's tokens must also
        reach the host before the next arrival anywhere. It returns (the time of the iteration scheduling
        step j+M+1, the in-flight tuple of step j+M marked APPLIED, the end of row j+M-1), or None to step
        one at a time.
        The loop then schedules step j+M+1 (a decode of S, priced as predicted) and collects step j+M
        without postprocessing it.

        Why the same tables: without finishes (none happens before step j+M+1), a schedule sees the same
        decision and block counts whether the step before is in flight or applied; publishing a full block
        commutes with taking a plain free one, and where a taken block evicts a cached-free one, nothing
        these steps fill is published (every running sequence's private blocks are registered
        implicitly); the times are the loop's own float operations in its order."""
        sched, fast, cm = r.scheduler, r.fast, r.cost_model
        batch = in_flight[0]
        running = sched.running
        n = len(running)
        if (batch is APPLIED or batch.num_prefill_seqs or len(batch.seqs) != n or batch.swap_out or batch.swap_in
                or batch.offload or batch.load or any(s.status is not RUNNING for s in batch.seqs)):
            return None
        k = fast.decode_horizon(self.max_fast_steps)
        if k < 2:
            return None
        bm = sched.block_manager
        # a block would be evicted from the cached-free ones while blocks of these steps get published: the
        # overlap loop takes step s+1's blocks before it publishes step s's, so the order matters (checked for
        # the fewest steps here, before pricing, and for the steps taken below)
        guard = bm.enable_prefix_caching and not all(map(bm.registers_lazily, running))
        if guard and fast._blocks_for_decodes(2, fast.memo[4]) > _block_counts(bm)[1]:
            return None
        prerouted = self._prerouted
        # routed ahead of time: the replica's own next arrival; else the next one anywhere, which each step's
        # effects (its tokens' time) must precede, so that routing sees this replica as stepping would
        t_next = (r.inbox[0].arrival_time_s if r.inbox else INF) if prerouted else self._next_arrival_s
        m = k if t_next == INF or r.last_decode_s <= 0 else min(k, int((t_next - t) / r.last_decode_s) + 2)
        if m < 2:
            return None
        parts = cm.decode_overlap_parts_lists(n, fast.horizon_context_sum, m, fast.horizon_context_max)
        if parts is None:
            r.overlap_fast_ok = False
            return None
        prep, dev, post = parts
        # the loop's recursion; iteration i schedules step j+1+i at scheds[i] and collects step j+i at tokens[i]
        dev_end, sched_prev, post_prev = in_flight[1], in_flight[3], in_flight[4]
        last = last_end_s
        scheds, begins, tokens, dev_ends = [], [], [], []
        for i in range(m):
            if t >= t_next:
                break               # this iteration's schedule would see the arrival
            host_s = t + prep[i]
            tokens_s = max(dev_end, host_s)       # step j+i's tokens, and when step j+1+i starts on the device
            scheds.append(t)
            begins.append(sched_prev if last is None else max(sched_prev, last))
            tokens.append(tokens_s)
            dev_end = tokens_s + dev[i]
            dev_ends.append(dev_end)
            last, sched_prev = tokens_s, t
            t = tokens_s + post_prev
            post_prev = post[i]
        M = len(tokens) - 1         # steps j+1..j+M applied; iteration M (step j+M+1) is the loop's
        if not prerouted:
            while M >= 0 and tokens[M] >= t_next:
                M -= 1
        if M < 1:
            return None
        if guard and fast._blocks_for_decodes(M + 1, fast.memo[4]) > _block_counts(bm)[1]:
            return None
        token = self._token_fn()
        done = sched.postprocess_in_flight(batch, [token(s) for s in batch.seqs], tokens[0])
        assert not done, "overlap fast path: a sequence finished in step j"
        rec = r.recorder
        used0, free0, cached0 = _block_counts(bm)
        used = fast.advance_decodes(M, tokens[1:], token, done, scheds[0])
        assert not done, "overlap fast path: a sequence finished before step j+M+1"
        durs = [tok - b for tok, b in zip(tokens, begins)]
        row = -1
        if rec is not None:
            rec.set_step_time(in_flight[2], begins[0], durs[0])
            rec.on_decode_steps(begins[1:M] + [scheds[M - 1]], durs[1:M] + [0.0], n, fast.horizon_context_sum, used,
                                bm.num_kvcache_blocks, _cached_per_step(used, used0, free0, cached0),
                                fast.horizon_context_max)
            row = rec.num_steps - 1
        del durs[M:]
        if self._track_load:
            r.outstanding_tokens -= n * (M + 1)     # steps j..j+M (the loop collects step j+M for its time only)
        r.num_steps += M
        r.num_fast_steps += M
        r.num_fast_calls += 1
        r.busy_s = sum(durs, r.busy_s)
        r.last_decode_s = durs[-1]
        return scheds[M], (APPLIED, dev_ends[M - 1], row, scheds[M - 1], post[M - 1]), tokens[M - 1]

    def _count_fast(self, r: Replica, durs: list, done: list) -> None:
        r.num_steps += len(durs)
        r.num_fast_steps += len(durs)
        r.num_fast_calls += 1
        r.busy_s = sum(durs, r.busy_s)
        r.last_decode_s = durs[-1]
        if done:
            self._record_finished(r.recorder, done)
