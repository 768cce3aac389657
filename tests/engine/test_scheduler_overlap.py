"""The scheduler core with overlap scheduling (mark_in_flight / postprocess_in_flight): placeholders,
the sequence whose last token is in flight, finishes by EOS of sequences the next step already
scheduled, preempted or swapped, and no block leaks (engine/core/in_flight.py)."""
from __future__ import annotations

from engine.core.in_flight import PLACEHOLDER_BASE, is_placeholder
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from policies.scheduling.vllm_swap import VLLMSwapPolicy

EOS = 9


def seq(rid, prompt_len, max_tokens, ignore_eos=True):
    return Sequence(rid, [100 * (rid + 1) + i for i in range(prompt_len)],
                    SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos), eos_token_id=EOS)


def scheduler(num_blocks, policy=None, **kw):
    return Scheduler(SchedulerConfig(num_kvcache_blocks=num_blocks, block_size=4, max_model_len=32,
                                     max_num_batched_tokens=64, **kw), policy=policy)


def launch(sched, t):
    batch = sched.schedule(float(t))
    sched.mark_in_flight(batch)
    return batch


def run_out(sched, pending, token, t):
    """The overlapped loop from a launched step `pending` until nothing is left, every token `token`."""
    while pending is not None:
        batch = sched.schedule(float(t)) if sched.has_unfinished() else None
        if batch is not None and batch.is_empty:
            batch = None
        if batch is not None:
            sched.mark_in_flight(batch)
        sched.postprocess_in_flight(pending, [token] * len(pending.seqs), float(t))
        pending, t = batch, t + 1


def check_empty(sched):
    bm = sched.block_manager
    bm.check_invariants(sched.running)
    assert not sched.has_unfinished() and sched.num_in_flight == 0
    assert bm.num_used_blocks == 0 and bm.num_cpu_free_blocks == bm.num_cpu_blocks


def test_placeholders_and_their_rows():
    sched = scheduler(16)
    a, b = seq(0, 5, 3), seq(1, 3, 3)
    sched.add(a), sched.add(b)
    batch = launch(sched, 0)
    assert [s.token_ids[-1] for s in batch.seqs] == [PLACEHOLDER_BASE, PLACEHOLDER_BASE + 1]
    assert (a.num_computed_tokens, b.num_computed_tokens) == (5, 3)
    nxt = sched.schedule(1.0)           # decodes of both, their inputs the in-flight placeholders
    assert nxt.seqs == [a, b] and nxt.num_new_tokens == [1, 1]
    sched.mark_in_flight(nxt)
    assert sched.postprocess_in_flight(batch, [11, 12], 1.0) == []
    assert a.token_ids[5] == 11 and b.token_ids[3] == 12 and is_placeholder(a.token_ids[6])
    assert a.first_token_time_s == 1.0


def test_last_token_in_flight_holds_its_blocks_but_is_not_scheduled():
    sched = scheduler(16)
    a, b = seq(0, 4, 2), seq(1, 4, 5)
    sched.add(a), sched.add(b)
    first = launch(sched, 0)                 # prefill: token 1 of both
    second = launch(sched, 1)                # decode: token 2 of both, a's last
    sched.postprocess_in_flight(first, [1, 1], 1.0)
    third = sched.schedule(2.0)
    assert third.seqs == [b]                  # a's last token is in flight
    assert a.status is SequenceStatus.RUNNING and a.block_table    # released only when postprocessed
    sched.mark_in_flight(third)
    assert sched.postprocess_in_flight(second, [2, 2], 2.0) == [a]
    assert a.output_token_ids == [1, 2] and a.finish_reason == "length" and not a.block_table
    run_out(sched, third, 3, 3)
    assert b.output_token_ids == [1, 2, 3, 3, 3]
    check_empty(sched)


def test_eos_of_a_sequence_already_scheduled_again():
    sched = scheduler(16)
    a = seq(0, 4, 10, ignore_eos=False)
    sched.add(a)
    first = launch(sched, 0)
    second = launch(sched, 1)                 # a decodes its in-flight token
    assert sched.postprocess_in_flight(first, [EOS], 1.0) == [a]
    assert a.output_token_ids == [EOS] and a.finish_reason == "eos" and a.finish_time_s == 1.0
    assert sched.postprocess_in_flight(second, [5], 2.0) == []      # the extra token, discarded
    assert a.output_token_ids == [EOS]
    check_empty(sched)


def test_finish_of_a_sequence_preempted_meanwhile():
    # 3 blocks of 4 tokens: two 4-token prompts fill two; their first decodes need a block each
    sched = scheduler(3)
    a, b = seq(0, 4, 5, ignore_eos=False), seq(1, 4, 5, ignore_eos=False)
    sched.add(a), sched.add(b)
    first = launch(sched, 0)
    second = launch(sched, 1)
    assert second.seqs == [a] and second.preempted == [b] and b.status is SequenceStatus.PREEMPTED
    assert sched.postprocess_in_flight(first, [1, EOS], 1.0) == [b]
    assert b.status is SequenceStatus.FINISHED and b not in sched.waiting and b.output_token_ids == [EOS]
    sched.postprocess_in_flight(second, [EOS], 2.0)
    check_empty(sched)


def test_finish_of_a_sequence_swapped_meanwhile():
    sched = scheduler(3, policy=VLLMSwapPolicy(), num_cpu_blocks=8)
    a, b = seq(0, 4, 5, ignore_eos=False), seq(1, 4, 5, ignore_eos=False)
    sched.add(a), sched.add(b)
    first = launch(sched, 0)
    second = launch(sched, 1)
    assert second.swapped_out == [b] and b.status is SequenceStatus.SWAPPED
    assert sched.postprocess_in_flight(first, [1, EOS], 1.0) == [b]
    assert b.status is SequenceStatus.FINISHED and b not in sched.swapped
    sched.postprocess_in_flight(second, [EOS], 2.0)
    check_empty(sched)


def test_a_waiting_sequence_with_a_token_in_flight_is_not_admitted():
    sched = scheduler(16)
    a = seq(0, 4, 5)
    sched.add(a)
    first = launch(sched, 0)
    # as a preemption inside the next schedule would leave it (phase 0 of a preemptive policy)
    sched.running.remove(a)
    sched.block_manager.free(a)
    a.num_computed_tokens = 0
    a.set_status(SequenceStatus.PREEMPTED)
    sched.waiting.appendleft(a)
    assert sched.schedule(1.0).seqs == []     # its prompt includes a token not known yet
    sched.postprocess_in_flight(first, [3], 1.0)
    assert sched.schedule(2.0).seqs == [a]
