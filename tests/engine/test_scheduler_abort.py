"""Scheduler.abort: a request dropped while waiting, running, preempted or swapped frees every block it held."""
from __future__ import annotations

import random

import pytest

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SequenceStatus
from policies.scheduling.mlfq import MLFQPolicy
from policies.scheduling.vllm import VLLMPolicy
from policies.scheduling.vllm_swap import VLLMSwapPolicy
from tests.helpers import make_seq


def config(num_blocks=8, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("max_model_len", 32)
    kw.setdefault("max_num_batched_tokens", 64)
    return SchedulerConfig(num_kvcache_blocks=num_blocks, **kw)


def step(sched, t):
    batch = sched.schedule(float(t))
    sched.postprocess(batch, [7] * len(batch.seqs), float(t) + 0.5)
    return batch


def run_until(sched, done, t: int = 0) -> int:
    """Steps from clock t until done(); returns the clock then."""
    while not done():
        step(sched, t)
        t += 1
    return t


def holds_nothing(sched):
    bm = sched.block_manager
    bm.check_invariants(sched.running)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == bm.num_kvcache_blocks
    assert bm.num_cpu_free_blocks == bm.num_cpu_blocks and not bm.cpu_tables
    assert not sched.has_unfinished()


def test_abort_of_a_running_sequence_frees_its_blocks():
    sched = Scheduler(config(), VLLMPolicy())
    a, b = make_seq("a", 6, 8), make_seq("b", 5, 8)
    sched.add(a), sched.add(b)
    step(sched, 0)
    assert a.status is SequenceStatus.RUNNING and len(a.block_table) == 2
    assert sched.abort(a)
    assert a.status is SequenceStatus.ABORTED and a.finish_reason == "abort" and a.is_finished
    assert a.block_table == [] and sched.running == [b]
    sched.block_manager.check_invariants(sched.running)
    while sched.has_unfinished():
        step(sched, 1)
    holds_nothing(sched)


def test_abort_of_a_waiting_sequence_and_twice():
    sched = Scheduler(config(), VLLMPolicy())
    a = make_seq("a", 6, 8)
    sched.add(a)
    assert sched.abort(a) and not sched.waiting
    assert not sched.abort(a)               # already aborted: nothing changes
    holds_nothing(sched)
    b = make_seq("b", 4, 1)
    sched.add(b)
    step(sched, 0)
    assert b.status is SequenceStatus.FINISHED and not sched.abort(b)
    c = make_seq("c", 4, 1)
    assert not sched.abort(c)               # never added


def test_abort_of_a_preempted_sequence():
    # 4 blocks of 4: a and b (prompt 4, 8 outputs) cannot both grow; vllm preempts the newest (b)
    sched = Scheduler(config(4), VLLMPolicy())
    a, b = make_seq("a", 4, 8), make_seq("b", 4, 8)
    sched.add(a), sched.add(b)
    t = run_until(sched, lambda: b.status is SequenceStatus.PREEMPTED)
    assert b in sched.waiting and not b.block_table
    assert sched.abort(b) and b not in sched.waiting
    run_until(sched, lambda: not sched.has_unfinished(), t)
    assert a.status is SequenceStatus.FINISHED
    holds_nothing(sched)


def test_abort_of_a_swapped_sequence_returns_its_cpu_blocks():
    sched = Scheduler(config(4, num_cpu_blocks=8), VLLMSwapPolicy())
    a, b = make_seq("a", 4, 8), make_seq("b", 4, 8)
    sched.add(a), sched.add(b)
    t = run_until(sched, lambda: b.status is SequenceStatus.SWAPPED)
    bm = sched.block_manager
    assert bm.num_cpu_free_blocks < bm.num_cpu_blocks
    assert sched.abort(b) and not sched.swapped
    assert bm.num_cpu_free_blocks == bm.num_cpu_blocks and b.request_id not in bm.cpu_tables
    run_until(sched, lambda: not sched.has_unfinished(), t)
    holds_nothing(sched)


def test_abort_drops_the_policys_state():
    policy = MLFQPolicy()
    sched = Scheduler(config(), policy)
    a = make_seq("a", 4, 8)
    sched.add(a)
    step(sched, 0)
    assert "a" in policy._level
    sched.abort(a)
    assert "a" not in policy._level and "a" not in policy._charge


@pytest.mark.parametrize("policy, cpu", [(VLLMPolicy, 0), (VLLMSwapPolicy, 6)])
@pytest.mark.parametrize("caching", [False, True])
def test_random_aborts_between_steps_leak_nothing(policy, cpu, caching):
    rng = random.Random(3)
    sched = Scheduler(config(10, num_cpu_blocks=cpu, enable_prefix_caching=caching,
                             enable_chunked_prefill=True, max_num_batched_tokens=16), policy())
    shared = [1, 2, 3, 4, 5, 6, 7, 8]       # a common prefix, so cached blocks are shared
    seqs = []
    for i in range(300):
        prompt = shared[:rng.randint(0, 8)] + [100 + i] * rng.randint(1, 9)
        seqs.append(make_seq(f"r{i}", prompt, rng.randint(1, 12)))
    pending, live, t = list(seqs), [], 0
    while pending or sched.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if pending:
                s = pending.pop(0)
                sched.add(s)
                live.append(s)
        for s in [s for s in live if not s.is_finished and rng.random() < 0.08]:
            assert sched.abort(s)
        step(sched, t)
        sched.block_manager.check_invariants(sched.running)
        live = [s for s in live if not s.is_finished]
        t += 1
    holds_nothing(sched)
    statuses = {s.status for s in seqs}
    assert statuses == {SequenceStatus.FINISHED, SequenceStatus.ABORTED}


def test_abort_of_a_running_sequence_counts_as_a_change_of_the_running_set():
    # the simulator's fast path keeps facts about the running list, valid while num_running_changes holds
    sched = Scheduler(config(), VLLMPolicy())
    a, b = make_seq("a", 6, 8), make_seq("b", 5, 8)
    sched.add(a), sched.add(b)
    step(sched, 0)
    before, running = sched.num_running_changes, sched.running
    assert sched.abort(a)
    assert sched.num_running_changes == before + 1 and sched.running is not running and sched.running == [b]
