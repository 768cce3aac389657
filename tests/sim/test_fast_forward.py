"""The simulator's decode fast path on a scheduler (DecodeFastForward: decode_horizon + advance_decodes) is exact:
same per-request and per-step facts as stepping one at a time."""
import hypothesis.strategies as st
from hypothesis import given, settings

from engine.core.scheduler import Scheduler, SchedulerConfig
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.vllm import VLLMPolicy
from sim.fast_forward import DecodeChain, DecodeFastForward
from tests.helpers import make_seq


def token_of(seq):
    return 7 + (seq.request_id % 5)


def drive(reqs, cfg, policy_cls, fast, chain=False):
    sched = Scheduler(SchedulerConfig(**cfg), policy_cls())
    ff = DecodeFastForward(sched)
    seqs = [make_seq(i, list(p), m, arrival_time_s=a) for i, (p, m, a) in enumerate(reqs)]
    pending = sorted(seqs, key=lambda s: s.arrival_time_s)
    used_per_step = []
    t = 0
    fast_steps = 0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time_s <= t:
            sched.add(pending.pop(0))
        if fast:
            limit = int(pending[0].arrival_time_s) - t if pending else 10**9
            k = ff.decode_horizon(limit)
            if k > 0:
                ends = [float(t + j) for j in range(1, k + 1)]
                if chain and ff.chain_ok():
                    plan = DecodeChain(ff, limit)
                    k = plan.num_steps
                    assert k >= len(ends) and sum(s for _, _, s in plan.segments()) == k
                    used = plan.apply(k, [float(t + j) for j in range(1, k + 1)], token_of, [])
                else:
                    used = ff.advance_decodes(k, ends, token_of)
                used_per_step.extend(int(u) for u in used)
                t += k
                fast_steps += k
                sched.block_manager.check_invariants(sched.running)
                continue
        batch = sched.schedule(float(t))
        used_per_step.append(sched.block_manager.num_used_blocks)
        sched.postprocess(batch, [token_of(s) for s in batch.seqs], float(t + 1))
        t += 1
        assert t < 20_000
    facts = [(s.status, s.first_token_time_s, s.finish_time_s, s.num_preemptions, s.num_cached_tokens,
              tuple(s.token_ids)) for s in seqs]
    return facts, used_per_step, fast_steps


requests = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=20),
                              st.integers(1, 30), st.integers(0, 40)), min_size=1, max_size=10)


@settings(max_examples=80, deadline=None)
@given(reqs=requests, num_blocks=st.integers(12, 40), prefix=st.booleans(),
       policy=st.sampled_from([FCFSPolicy, VLLMPolicy]), max_num_seqs=st.integers(1, 5))
def test_fast_path_equals_step_by_step(reqs, num_blocks, prefix, policy, max_num_seqs):
    cfg = dict(num_kvcache_blocks=num_blocks, block_size=2, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=64, max_model_len=64, enable_prefix_caching=prefix)
    slow, slow_used, _ = drive(reqs, cfg, policy, fast=False)
    fast, fast_used, _ = drive(reqs, cfg, policy, fast=True)
    assert fast == slow
    assert fast_used == slow_used


@settings(max_examples=80, deadline=None)
@given(reqs=requests, num_blocks=st.integers(12, 40), policy=st.sampled_from([FCFSPolicy, VLLMPolicy]),
       max_num_seqs=st.integers(1, 5))
def test_decode_chain_equals_step_by_step(reqs, num_blocks, policy, max_num_seqs):
    """DecodeChain (no prefix cache, nothing waiting): steps past finishes in one call."""
    cfg = dict(num_kvcache_blocks=num_blocks, block_size=2, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=64, max_model_len=64, enable_prefix_caching=False)
    slow, slow_used, _ = drive(reqs, cfg, policy, fast=False)
    fast, fast_used, _ = drive(reqs, cfg, policy, fast=True, chain=True)
    assert fast == slow
    assert fast_used == slow_used


def test_fast_path_is_taken():
    reqs = [([1, 2, 3], 30, 0), ([2, 3], 25, 0)]
    cfg = dict(num_kvcache_blocks=64, block_size=2, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    _, _, fast_steps = drive(reqs, cfg, VLLMPolicy, fast=True)
    assert fast_steps >= 20


def test_the_fast_path_drives_the_scheduler_through_its_public_interface():
    """The fast path is the simulator's object, not a part of the shared scheduler, and it reads
    none of the scheduler's private attributes."""
    import re
    from pathlib import Path
    assert not hasattr(Scheduler, "decode_horizon") and not hasattr(Scheduler, "advance_decodes")
    src = (Path(__file__).resolve().parents[2] / "sim" / "fast_forward.py").read_text()
    assert re.findall(r"\bsched\._\w+", src) == []
