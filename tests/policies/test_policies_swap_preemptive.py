"""Preemptive policies with swap preemption (FastServe swaps KV to host memory).

Phase 0 swaps a worse-ranked running sequence out to make room for a better-ranked
waiting one. The scheduler must neither swap that victim straight back in during
the same step, nor hold the better-ranked request back because something is
swapped: it is admitted ahead of swapped sequences it outranks.
"""
from __future__ import annotations

from policies.scheduling.mlfq import MLFQPolicy
from policies.scheduling.priority import PriorityPolicy
from tests.helpers import Req, drive


class SwapPriority(PriorityPolicy):
    preemption_mode = "swap"


class SwapMLFQ(MLFQPolicy):     # FastServe itself preempts by swapping KV to host memory
    preemption_mode = "swap"


def _thrash_steps(run):
    return [t for t, (out, back) in enumerate(zip(run.swap_out, run.swap_in))
            if {c for _, c in out} & {c for c, _ in back}]


def test_priority_swap_admits_high_priority_request():
    # 4 blocks: L (priority 5) holds 3, H (priority 0) needs 2 at t1.
    reqs = [Req("L", 12, 4, arrival=0, priority=5), Req("H", 8, 2, arrival=1, priority=0)]
    run = drive(SwapPriority(), reqs, num_kvcache_blocks=4, num_cpu_blocks=8)
    # Wanted: t1 L swapped out, H prefills; t2 H decodes and finishes; t3.. L swapped in, decodes.
    # Today: L is swapped out and in at t1..t3 and H runs only after L finishes (t4, t5).
    assert not _thrash_steps(run)
    assert run.timeline[:3] == [[("L", 12)], [("H", 8)], [("H", 1)]]
    assert run.finish_step("H") == 2


def test_mlfq_swap_lets_new_short_request_in():
    # Same as the recompute MLFQ timeline test, with swap: B (level 0) should displace A (level 1).
    reqs = [Req("A", 4, 8, arrival=0), Req("B", 4, 2, arrival=2)]
    mlfq = SwapMLFQ(base_quantum=2, num_levels=4, prompt_token_weight=0.0, starvation_s=None)
    run = drive(mlfq, reqs, num_kvcache_blocks=16, max_num_seqs=1, num_cpu_blocks=8)
    assert not _thrash_steps(run)
    assert run.finish_step("B") == 3
