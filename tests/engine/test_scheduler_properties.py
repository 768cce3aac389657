"""Scheduler properties under memory pressure (hypothesis): every request ends
FINISHED or REJECTED, output lengths are exact, no block leaks, no livelock."""
import hypothesis.strategies as st
from hypothesis import given, settings

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SequenceStatus
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.vllm import VLLMPolicy
from tests.helpers import make_seq, run_timeline

requests = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=24),   # prompt (shared prefixes likely)
              st.integers(1, 12),                                     # max_tokens
              st.integers(0, 6)),                                     # arrival step
    min_size=1, max_size=14)


@settings(max_examples=120, deadline=None)
@given(reqs=requests, num_blocks=st.integers(3, 24), chunked=st.booleans(), prefix=st.booleans(),
       policy=st.sampled_from(["fcfs", "vllm", "vllm_swap"]), max_num_seqs=st.integers(1, 6))
def test_every_request_finishes_or_is_rejected(reqs, num_blocks, chunked, prefix, policy, max_num_seqs):
    cfg = SchedulerConfig(num_kvcache_blocks=num_blocks, block_size=2, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=8 if chunked else 40, max_model_len=40,
                          enable_chunked_prefill=chunked, enable_prefix_caching=prefix,
                          num_cpu_blocks=6 if policy == "vllm_swap" else 0)
    pol = FCFSPolicy() if policy == "fcfs" else VLLMPolicy()
    if policy == "vllm_swap":
        pol.preemption_mode = "swap"
    sched = Scheduler(cfg, pol)
    seqs = [make_seq(i, list(p), m, arrival_time_s=a) for i, (p, m, a) in enumerate(reqs)]
    run_timeline(sched, seqs, max_steps=5_000)
    for s in seqs:
        assert s.status in (SequenceStatus.FINISHED, SequenceStatus.REJECTED)
        if s.status is SequenceStatus.FINISHED:
            assert s.num_output_tokens == s.max_output_tokens
            assert s.first_token_time_s <= s.finish_time_s
        else:
            assert s.reject_reason
            fits = -(-(s.num_prompt_tokens + s.max_output_tokens) // 2) <= num_blocks
            assert not fits or s.num_prompt_tokens + s.max_output_tokens > 40
        if policy == "fcfs":
            assert s.num_preemptions == 0
    bm = sched.block_manager
    assert bm.num_used_blocks == 0 and all(rc == 0 for rc in bm.ref_counts)
    assert bm.num_cpu_free_blocks == bm.num_cpu_blocks
    bm.check_invariants([])
