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
"""
from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate

from sim.fast_forward import DecodeChain
from sim.replica import Replica

INF = math.inf


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

    def _price(self, r: Replica, n: int, s0: int, k: int, t: float, t_next: float) -> tuple[list, list]:
        """Durations [j] and clock [j + 1] (t, then each step's end) of the first j <= k decode steps
        of n sequences from t (step i attends s0 + i * n keys) that the next arrival leaves."""
        cm = r.cost_model
        if t_next != INF and r.last_decode_s > 0:
            # Price only the steps the next arrival can leave (an estimate; extended below if short).
            m = min(k, int((t_next - t) / r.last_decode_s) + 2)
        else:
            m = k
        durs = cm.decode_step_times_list(n, s0, m)                # [m] seconds
        clock = list(accumulate(durs, initial=t))                 # the same additions as the step-by-step path
        if t_next == INF:
            return durs, clock
        while m < k and clock[m] < t_next:
            more = cm.decode_step_times_list(n, s0 + m * n, min(k, 2 * m) - m)
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
        durs, clock = self._price(r, n, s0, k, t, t_next)
        if not durs:
            return None
        # A horizon cut short by free blocks, taken whole: the next step needs a block that is not free.
        r.segment_whole = len(durs) == k
        r.horizon_spent = r.segment_whole and fast.horizon_blocked
        k = len(durs)
        ends = clock[1:]
        used0 = bm.num_used_blocks
        if bm.enable_prefix_caching:
            free0, cached0 = len(bm.free_ids) - bm.num_dead_free, bm.num_cached_free_blocks   # plain free
        else:                                 # no cached-free blocks ever: nothing to evict
            free0, cached0 = bm.num_kvcache_blocks, 0
        done = []
        used = fast.advance_decodes(k, ends, self._token_fn(), done, t)   # [k] blocks in use after allocation
        rec = r.recorder
        if rec is not None:
            if used[-1] - used0 > free0:      # allocation takes plain free blocks first, then evicts cached-free
                cached = [cached0 - max(0, u - used0 - free0) for u in used]
            else:
                cached = cached0
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
            d, c = self._price(r, n, s0, steps, t, t_next)
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

    def _count_fast(self, r: Replica, durs: list, done: list) -> None:
        r.num_steps += len(durs)
        r.num_fast_steps += len(durs)
        r.num_fast_calls += 1
        r.busy_s = sum(durs, r.busy_s)
        r.last_decode_s = durs[-1]
        if done:
            self._record_finished(r.recorder, done)
