"""The simulator's exact decode fast path, scheduler side: many pure-decode steps in one call.

`DecodeFastForward(scheduler)` drives one engine.core.scheduler.Scheduler through its public
interface: it answers how many upcoming steps are certain to be pure decode steps of exactly the
current running set (`decode_horizon`) and applies them at once (`advance_decodes`), leaving every
sequence and the block manager as step-by-step scheduling would. Its time side (which steps the
next arrival leaves, their durations, the recorder) is sim/fast_path.py.

decode_horizon stops at the first step in which a sequence finishes, because the
step after it may differ (the freed room may admit a waiting request). With
nothing waiting or swapped it cannot: a finish only removes that sequence, and the
next steps are pure decodes of the smaller set. A `DecodeChain` plans those steps
from the per-sequence facts decode_horizon gathered (tokens left, slots left in
the last block, context length) as runs of equal batch size, and applies any
prefix of them at once: each sequence gets its tokens and blocks in one go, the
finished ones leave at their own step, in the order that step serves them, as
postprocess would finish them. Only for policies that serve the running set in
admission order, and where no block of those steps reaches the prefix cache's
table: no prefix cache, or only running sequences whose private blocks are
registered implicitly (engine.core.block_manager; block ids then never reach a table,
so handing each sequence its blocks in one slice changes nothing; advance_decodes
keeps step order where they do). The blocks a chain takes come from the free list
as it was at the start, never from the eviction policy: a chain never relies on
blocks its own finishes free (it stops before the step that would need them; the
next decode_horizon call sees them). With a prefix cache it replays the counts
step by step (`_cached_per_step`): which of the blocks taken were plain and which
dead cached-free ones, and what each finish returned where.

A chain leaves the facts of the surviving sequences behind (the carry); the next
decode_horizon reads them instead of every sequence as long as nothing but admissions
(appended at the end of the running list, prefill-only steps) happened since: serving,
preempting or swapping in running sequences advances the scheduler's
`num_running_changes`, which drops the carry.
"""
from __future__ import annotations

from itertools import accumulate

from engine.core.sequence import SequenceStatus
from policies.scheduling.base import SchedulingPolicy
from sim.arrivals import negative_id_token

RUNNING = SequenceStatus.RUNNING


def orders_running(policy) -> bool:
    """Whether the policy serves running sequences in an order other than admission order."""
    return policy.ranked or type(policy).order_running is not SchedulingPolicy.order_running


class DecodeFastForward:
    """The fast path of one scheduler. It reads the scheduler's public state (running, waiting,
    swapped, policy, block_manager, config, token_budget, chunked, num_steps, num_running_changes)
    and changes it only through the block manager and the scheduler's public methods
    (head_admissible, order_running, finish, remove_finished, add_steps).

    After decode_horizon: `horizon_blocked` (the free blocks set the horizon), and when it
    returned k > 0, `horizon_context_sum` / `horizon_context_max` (the first step's decode
    context sum and longest decode context)."""

    def __init__(self, scheduler):
        self.sched = scheduler
        self.horizon_blocked = False
        self.horizon_context_sum = 0
        self.horizon_context_max = 0
        self.memo = None            # facts of the running set for the next fast call (see decode_horizon)
        self._carry = None          # the same facts, carried over from the last chain

    def decode_horizon(self, max_steps: int) -> int:
        """How many upcoming steps (<= max_steps) are certain to be pure decode steps of
        exactly the current running set, with no scheduling decision to make, provided
        no request arrives meanwhile. 0 means: take the step-by-step path.

        Such steps admit nobody (queues empty, or the waiting head blocked in a way
        that pure decoding cannot lift) and preempt nobody (the blocks they need are
        free). Sequences finish at most in the last of them: the step in which a
        sequence emits its last token is still a pure decode step of the same running
        set; only the step after it differs. Afterwards `horizon_blocked` says whether
        the free blocks (rather than max_steps or a finishing sequence) set the horizon,
        in which case the step after it cannot be fast-forwarded either; when the result
        is > 0, `horizon_context_sum` is the first step's decode context sum (tokens of
        the running set) and `horizon_context_max` its longest decode context.
        """
        sched = self.sched
        self.horizon_blocked = False
        running = sched.running
        if (max_steps < 1 or not running or sched.swapped or not sched.policy.fast_forward_ok
                or len(running) > sched.token_budget):
            return 0
        if sched.waiting and (sched.chunked or sched.policy.preemptive or sched.head_admissible()):
            return 0
        bs = sched.block_manager.block_size
        carry = self._carry
        if carry is not None and carry[0] is running and carry[1] == sched.num_running_changes:
            # the first m sequences are as the last chain left them (only appends since)
            _, _, m, slack, lefts, lens = carry
            del slack[m:], lefts[m:], lens[m:]
        else:
            m = 0
            slack = []               # token slots left in each sequence's allocated blocks
            lefts = []               # output tokens each sequence still has to emit
            lens = []                # tokens of each sequence (its context in the first step)
        for i in range(m, len(running)):
            seq = running[i]
            n = len(seq.token_ids)
            computed = seq.num_computed_tokens
            if n - computed != 1 or n == seq.num_prompt_tokens:
                return 0    # not in plain decode
            if seq.eos_token_id is not None and not seq.sampling_params.ignore_eos:
                return 0    # an EOS could end it at any step
            slack.append(len(seq.block_table) * bs - computed)
            lefts.append(seq.max_output_tokens - n + seq.num_prompt_tokens)     # tokens still to emit
            lens.append(n)
        horizon = min(max_steps, min(lefts))
        if horizon < 1:
            return 0
        self.horizon_context_sum = sum(lens)
        self.horizon_context_max = max(lens)
        # for advance_decodes and DecodeChain, while nothing has changed (same running list and length,
        # step count, blocks)
        self.memo = (running, len(running), sched.num_steps, sched.block_manager.num_used_blocks,
                     slack, lefts, lens)
        # Only steps that evict nothing: with a CPU tier an eviction offloads (a copy the step must pay for).
        free = sched.block_manager.num_free_blocks_without_copy
        if self._blocks_for_decodes(horizon, slack) <= free:
            return horizon
        self.horizon_blocked = True
        lo, hi = 0, horizon          # need(lo) <= free < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._blocks_for_decodes(mid, slack) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _blocks_for_decodes(self, k: int, slack: list[int]) -> int:
        """New blocks the running set needs for k more decode steps (step j writes slot slack_i + j)."""
        bs1 = self.sched.block_manager.block_size - 1
        bs = bs1 + 1
        return sum([(k - s + bs1) // bs for s in slack if s < k])

    def advance_decodes(self, k: int, step_end_times_s, token_of, finished: list | None = None,
                        start_time_s: float | None = None) -> list[int]:
        """Apply k pure decode steps at once (k from decode_horizon, or fewer).

        step_end_times_s: the k step end times (seconds); token_of(seq) -> the token id
        each step appends to seq. Sequences that emit their last token in step k finish
        as postprocess would finish them (status, finish time, blocks freed,
        policy.on_finish), in the order that step would have served them; they are
        appended to `finished` when a list is given. start_time_s: when the first step
        starts (the view's clock if the policy orders the running set; optional).
        Returns the KV blocks in use after each step's allocation (length k), what
        step-by-step scheduling would have recorded.
        """
        sched = self.sched
        bm = sched.block_manager
        bs = bm.block_size
        running = sched.running
        memo = self.memo
        self.memo = None
        self._carry = None
        if (memo is not None and memo[0] is running and memo[1] == len(running) and memo[2] == sched.num_steps
                and memo[3] == bm.num_used_blocks):
            slacks, lefts = memo[4], memo[5]
        else:
            slacks = [len(seq.block_table) * bs - seq.num_computed_tokens for seq in running]
            lefts = [seq.max_output_tokens - len(seq.token_ids) + seq.num_prompt_tokens for seq in running]
        inc = [0] * (k + 1)          # inc[j]: blocks taken in step j (1-based)
        for slack in slacks:
            # the sequence takes a new block in steps slack + 1, slack + 1 + bs, ...
            if slack < k:
                for j in range(slack + 1, k + 1, bs):
                    inc[j] += 1
        done = [seq for seq, left in zip(running, lefts) if left == k] if k in lefts else []
        inc[0] = bm.num_used_blocks
        used = list(accumulate(inc))
        del used[0]
        if done and orders_running(sched.policy):
            # The finishing step serves (and finishes) in the policy's order, taken on the state
            # after k - 1 steps: apply those first.
            if k > 1:
                self._advance_all(running, k - 1, step_end_times_s[:k - 1], token_of)
            order = sched.order_running(step_end_times_s[k - 2] if k > 1 else start_time_s)
            self._advance_all(running, 1, step_end_times_s[k - 1:], token_of)
            done_ids = set(map(id, done))
            done = [s for s in order if id(s) in done_ids]
        else:
            self._advance_all(running, k, step_end_times_s, token_of)
        if done:
            last = float(step_end_times_s[-1])
            for seq in done:
                sched.finish(seq, "length", last)
            sched.remove_finished()
            if finished is not None:
                finished.extend(done)
        sched.add_steps(k)
        return used

    def _advance_all(self, running, k: int, step_end_times_s, token_of) -> None:
        """k decode tokens for every running sequence: tokens, blocks, computed counts, times."""
        bm = self.sched.block_manager
        bs = bm.block_size
        last = float(step_end_times_s[-1])
        events = []
        if bm.enable_prefix_caching and not all(map(bm.registers_lazily, running)):
            # Replay the prefix-cache side effects in step-by-step order: in step j, first every
            # sequence's new block (in serve order; a taken block may evict a cached one, dropping
            # its hash), then every block that step fills is published (in serve order: of two
            # blocks with equal content, the first published keeps the hash).
            order = self.sched.order_running() if orders_running(self.sched.policy) else running
            need = 0
            for rank, seq in enumerate(order):
                c0 = seq.num_computed_tokens
                for j in range(len(seq.block_table) * bs - c0 + 1, k + 1, bs):
                    events.append((j, 0, rank, seq, 0))
                    need += 1
                for j in range(bs - c0 % bs, k + 1, bs):
                    events.append((j, 1, rank, seq, c0 + j))
            if need <= len(bm.free_ids):       # no eviction: blocks can be taken up front
                bm.allocate_each(running, k)
                events = [e for e in events if e[1] == 1]
        else:
            # No prefix cache, or only private blocks registered implicitly: no block of these steps
            # reaches the hash table, so which sequence gets which (evicted) block changes nothing.
            bm.allocate_each(running, k)
        for seq in running:
            seq.token_ids += [token_of(seq)] * k
            seq.num_computed_tokens += k
            seq.last_token_time_s = last
            if seq.token_times_s is not None:
                seq.token_times_s.extend(float(t) for t in step_end_times_s)
        if events:
            events.sort(key=lambda e: (e[0], e[1], e[2]))
            for _, kind, _, seq, upto in events:
                if kind == 0:
                    seq.block_table.append(bm.take_block())
                else:
                    bm.register_computed_blocks(seq, upto)

    def chain_ok(self) -> bool:
        """Whether decode steps past finishes can be planned in one pass now: nothing waits, the
        policy serves in admission order, and no block of these steps reaches the prefix cache's
        table (no cache, or every running sequence's private blocks are registered implicitly)."""
        sched = self.sched
        if sched.waiting or sched.swapped or orders_running(sched.policy):
            return False
        bm = sched.block_manager
        return not bm.enable_prefix_caching or all(map(bm.registers_lazily, sched.running))


class DecodeChain:
    """Pure-decode steps of the running set past finishes. Build it right after
    `fast.decode_horizon(max_steps)` returned k > 0 with `fast.chain_ok()` (fast: the scheduler's
    DecodeFastForward).

    num_steps: the steps planned (all sequences finish within them, or max_steps, or the
    free blocks end them). segments() yields (n, first_context_sum, num_steps) per run of
    steps with the same running set, in order; step i of a run attends first_context_sum
    + i * n keys.
    """

    def __init__(self, fast: DecodeFastForward, max_steps: int):
        _, _, _, _, slack, lefts, lens = fast.memo
        sched = fast.sched
        bm = sched.block_manager
        self.fast, self.sched = fast, sched
        self.slack, self.lefts, self.lens = slack, lefts, lens
        bs = bm.block_size
        horizon = min(max_steps, max(lefts))
        free = len(bm.free_ids)
        # an upper bound of the blocks the chain takes (each sequence one per bs steps, plus one)
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
        """(n, first_context_sum, num_steps) per run of steps with the same running set."""
        for n, s0, steps, _ in self.segments_with_max():
            yield n, s0, steps

    def segments_with_max(self):
        """(n, first_context_sum, num_steps, first_context_max) per run of steps with the same running
        set; the run's longest context is first_context_max in its first step, + 1 a step."""
        horizon = self.num_steps
        ends = sorted(zip(self.lefts, self.lens))      # (finishing step, context in step 1)
        longest = max(self.lens)     # the longest context in step 1 of the sequences ends[i:]
        n, context = len(ends), self.fast.horizon_context_sum
        a, i = 1, 0                  # first step of the run (1-based); next sequence to finish
        while a <= horizon:
            b = ends[i][0] if i < len(ends) and ends[i][0] < horizon else horizon
            yield n, context + (a - 1) * n, b - a + 1, longest + a - 1
            stale = False
            while i < len(ends) and ends[i][0] == b:
                n -= 1               # finishes in step b
                c = ends[i][1]
                context -= c
                stale = stale or c == longest
                i += 1
            if stale and i < len(ends):
                # a longest one finished (rare: most chains yield a few runs, so this beats a suffix max
                # over every sequence up front)
                longest = max([c for _, c in ends[i:]])
            a = b + 1

    def apply(self, k: int, step_end_times_s: list, token_of, finished: list) -> list[int]:
        """Take the first k planned steps (step_end_times_s: their k end times). Finished
        sequences are appended to `finished` in finishing order. Returns the KV blocks in use
        after each step's allocation (length k); with a prefix cache, the tuple (those, the
        cached-free blocks after each step's allocation)."""
        sched = self.sched
        bm = sched.block_manager
        bs = bm.block_size
        bs1 = bs - 1
        running = sched.running
        inc = [0] * (k + 2)          # inc[j]: blocks taken in step j; a finish in step j frees in j + 1
        needs = []                   # blocks each sequence takes
        done = []
        slack2, lefts2, lens2 = [], [], []      # the survivors' facts after k steps
        total = 0
        negative_id = token_of is negative_id_token      # the token computed here, without a call per sequence
        for seq, s, left, n in zip(running, self.slack, self.lefts, self.lens):
            j = left if left < k else k         # tokens it emits
            if s < j:                # it takes blocks in steps s + 1, s + 1 + bs, ...
                need = (j - s + bs1) // bs
                total += need
                if need == 1:
                    inc[s + 1] += 1
                else:
                    for step in range(s + 1, j + 1, bs):
                        inc[step] += 1
            else:
                need = 0
            needs.append(need)
            seq.token_ids += [-1 - seq.request_id if negative_id else token_of(seq)] * j
            seq.num_computed_tokens += j
            seq.last_token_time_s = step_end_times_s[j - 1]
            if seq.token_times_s is not None:
                seq.token_times_s.extend(step_end_times_s[:j])
            if left > k:
                slack2.append(s + need * bs - k)
                lefts2.append(left - k)
                lens2.append(n + k)
            else:
                inc[left + 1] -= len(seq.block_table) + need     # its blocks, freed after step left
                done.append((left, seq))
        caching = bm.enable_prefix_caching
        if caching:
            pools0 = (len(bm.free_ids), bm.num_dead_free, len(bm.eviction))
            freed = {}               # step -> (blocks, free-list, dead, policy deltas) of the finishes after it
        inc[0] = bm.num_used_blocks
        if total:
            bm.hand_out(running, needs, total)
        if done:
            done.sort(key=_first)    # stable: one step finishes its sequences in serve order
            for left, seq in done:
                if caching:
                    # blocks shared with other sequences stay in use
                    n, u = len(seq.block_table), bm.num_used_blocks
                    f, d, p = len(bm.free_ids), bm.num_dead_free, len(bm.eviction)
                    sched.finish(seq, "length", step_end_times_s[left - 1])
                    u -= bm.num_used_blocks
                    inc[left + 1] += n - u
                    o = freed.get(left, (0, 0, 0, 0))
                    freed[left] = (o[0] + u, o[1] + len(bm.free_ids) - f, o[2] + bm.num_dead_free - d,
                                   o[3] + len(bm.eviction) - p)
                else:
                    sched.finish(seq, "length", step_end_times_s[left - 1])
                finished.append(seq)
            sched.remove_finished()
        sched.add_steps(k)
        fast = self.fast
        fast.memo = None
        fast._carry = (sched.running, sched.num_running_changes, len(lens2), slack2, lefts2, lens2)
        used = list(accumulate(inc[:k + 1]))
        del used[0]
        if not caching:
            return used
        return used, _cached_per_step(bm, k, inc, freed, pools0)


def _first(pair):
    return pair[0]


def _cached_per_step(bm, k: int, inc: list, freed: dict, pools0: tuple) -> list[int]:
    """The cached-free blocks after each of a chain's k allocations, as step-by-step scheduling
    leaves them; sets bm.num_dead_free to its value after the chain. Step j takes inc[j] + (blocks
    freed after step j - 1) blocks from the free list, plain ones before dead ones; the finishes
    after step j return blocks to the free list (some dead) or the eviction policy. pools0: the
    free-list length, dead count and policy size before the chain; freed[j]: the blocks the
    finishes after step j freed, and the three pools' growth."""
    n, dead, policy = pools0
    out = []
    a, back = 1, 0               # first step of the stretch between finishes; blocks freed before it
    stops = sorted(freed)        # steps after which sequences finish (<= k), then k
    if not stops or stops[-1] < k:
        stops.append(k)
    for b in stops:
        taken = list(accumulate(inc[a:b + 1]))       # blocks taken in steps a..b, cumulative
        if back:
            taken = [x + back for x in taken]
        plain = n - dead
        if taken[-1] <= plain:
            out += [policy + dead] * (b - a + 1)
        else:                    # past the plain ones, each block taken is a dead one
            top = policy + dead + plain
            out += [top - x if x > plain else policy + dead for x in taken]
            dead = n - taken[-1]
        n -= taken[-1]
        back = 0
        f = freed.get(b)
        if f is not None:
            back = f[0]
            n += f[1]
            dead += f[2]
            policy += f[3]
        a = b + 1
    assert n == len(bm.free_ids) and len(out) == k, "chain block accounting drifted"
    bm.num_dead_free = dead
    return out


def _blocks_taken(k: int, slack: list[int], lefts: list[int], bs: int) -> int:
    """Blocks the running set takes in the first k chain steps (a sequence stops at its last step)."""
    total = 0
    for s, left in zip(slack, lefts):
        j = left if left < k else k
        if s < j:
            total += (j - s + bs - 1) // bs
    return total
