"""Decode chains: the simulator's fast path through sequence finishes, in one pass (torch-free).

`Scheduler.decode_horizon` stops at the first step in which a sequence finishes,
because the step after it may differ (the freed room may admit a waiting
request). With nothing waiting or swapped it cannot: a finish only removes that
sequence, and the next steps are pure decodes of the smaller set. A DecodeChain
plans those steps from the per-sequence facts decode_horizon gathered (tokens
left, slots left in the last block, context length) as segments of equal batch
size, and applies any prefix of them at once: each sequence gets its tokens and
blocks in one go, the finished ones leave at their own step, in the order that
step serves them, exactly as postprocess would finish them.

Only for policies that serve the running set in admission order and without a
prefix cache (block ids then never reach a table; the fast path elsewhere keeps
step order where they do). The blocks all chain steps take come from the plain
free list as it was at the start: a chain never relies on blocks its own
finishes free (it stops before the step that would need them; the next
decode_horizon call sees them).
"""
from __future__ import annotations

from itertools import accumulate

from engine.sequence import SequenceStatus

RUNNING = SequenceStatus.RUNNING


def chain_ok(sched) -> bool:
    """Whether decode steps past finishes can be planned in one pass for this scheduler now."""
    return (not sched.waiting and not sched.swapped and not sched.block_manager.enable_prefix_caching
            and not sched._policy_orders_running())


class DecodeChain:
    """Pure-decode steps of the running set past finishes. Build it right after
    `decode_horizon(max_steps)` returned k > 0 with `chain_ok(sched)`.

    num_steps: the steps planned (all sequences finish within them, or max_steps, or the
    free blocks end them). segments() yields (n, first_context_sum, num_steps) per run of
    steps with the same running set, in order; step i of a run attends first_context_sum
    + i * n keys.
    """

    def __init__(self, sched, max_steps: int):
        _, _, _, _, slack, lefts, lens = sched._horizon_memo
        bm = sched.block_manager
        self.sched = sched
        self.slack, self.lefts, self.lens = slack, lefts, lens
        bs = bm.block_size
        horizon = min(max_steps, max(lefts))
        free = len(bm.free_ids)
        # blocks the chain takes, at most one per sequence and bs steps, plus one
        if len(slack) * (horizon // bs + 1) > free and _blocks_taken(horizon, slack, lefts, bs) > free:
            lo, hi = 0, horizon      # taken(lo) <= free < taken(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _blocks_taken(mid, slack, lefts, bs) <= free:
                    lo = mid
                else:
                    hi = mid
            horizon = lo
        self.num_steps = horizon

    def segments(self):
        horizon = self.num_steps
        ends = sorted(zip(self.lefts, self.lens))      # (finishing step, context in step 1)
        n, context = len(ends), self.sched.horizon_context_sum
        a, i = 1, 0                  # first step of the run (1-based); next sequence to finish
        while a <= horizon:
            b = ends[i][0] if i < len(ends) and ends[i][0] < horizon else horizon
            yield n, context + (a - 1) * n, b - a + 1
            while i < len(ends) and ends[i][0] == b:
                n -= 1               # finishes in step b
                context -= ends[i][1]
                i += 1
            a = b + 1

    def apply(self, k: int, step_end_times_s: list, token_of, finished: list) -> list[int]:
        """Take the first k planned steps (step_end_times_s: their k end times). Finished
        sequences are appended to `finished` in finishing order. Returns the KV blocks in use
        after each step's allocation (length k)."""
        sched = self.sched
        bm = sched.block_manager
        bs = bm.block_size
        bs1 = bs - 1
        running = sched.running
        inc = [0] * (k + 2)          # inc[j]: blocks taken in step j; a finish in step j frees in j + 1
        needs = []
        done = []
        total = 0
        for seq, s, left in zip(running, self.slack, self.lefts):
            j = left if left < k else k
            need = 0
            if s < j:
                need = (j - s + bs1) // bs
                total += need
                for step in range(s + 1, j + 1, bs):
                    inc[step] += 1
            needs.append(need)
            seq.token_ids += [token_of(seq)] * j
            seq.num_computed_tokens += j
            seq.last_token_time_s = step_end_times_s[j - 1]
            if seq.token_times_s is not None:
                seq.token_times_s.extend(step_end_times_s[:j])
            if left <= k:
                inc[left + 1] -= len(seq.block_table) + need
                done.append((left, seq))
        inc[0] = bm.num_used_blocks
        used = list(accumulate(inc[:k + 1]))
        del used[0]
        if total:
            new = bm.free_ids.take(total)
            rc = bm.ref_counts
            for block_id in new:
                rc[block_id] = 1
            o = 0
            for seq, need in zip(running, needs):
                if need:
                    seq.block_table += new[o:o + need]
                    o += need
            bm.num_used_blocks += total
        if done:
            done.sort(key=_first)    # stable: one step finishes its sequences in serve order
            policy = sched.policy
            for left, seq in done:
                seq.finish_reason = "length"
                seq.set_status(SequenceStatus.FINISHED)
                seq.finish_time_s = step_end_times_s[left - 1]
                bm.free(seq)
                policy.on_finish(seq)
                finished.append(seq)
            sched.running = [s for s in running if s.status is RUNNING]
        sched.num_steps += k
        sched._horizon_memo = None
        return used


def _first(pair):
    return pair[0]


def _blocks_taken(k: int, slack: list[int], lefts: list[int], bs: int) -> int:
    """Blocks the running set takes in the first k chain steps (a sequence stops at its last step)."""
    total = 0
    for s, left in zip(slack, lefts):
        j = left if left < k else k
        if s < j:
            total += (j - s + bs - 1) // bs
    return total
