"""Property tests: every scheduling policy x victim/eviction choices on random tiny workloads.

Tiny KV caches (2-12 blocks), random arrivals, shared-prefix prompts (3-token
vocabulary), chunked and unchunked steps. For every run: each request ends
FINISHED with exactly max_output_tokens outputs or REJECTED at arrival; the
block manager's invariants hold after every step; no step exceeds the token
budget or the sequence cap; nothing leaks (0 used blocks, swap space empty,
per-request policy state dropped); and the run terminates within a step bound.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.sequence import SequenceStatus
from policies.registry import SCHEDULING_POLICIES, make_eviction_policy, make_scheduling_policy
from tests.helpers import Req, drive

COMBOS = [("newest", "lru"), ("most_blocks", "lfu"), ("longest_remaining", "fifo"), ("lowest_priority", "none")]
MAX_STEPS = 600


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 6))
    reqs = []
    for i in range(n):
        prompt = draw(st.lists(st.integers(0, 2), min_size=1, max_size=10))
        reqs.append(Req(f"r{i}", len(prompt), draw(st.integers(1, 6)), arrival=draw(st.integers(0, 5)),
                        priority=draw(st.integers(0, 2)), tokens=prompt, tenant=draw(st.sampled_from("abc")),
                        ttft_slo_s=draw(st.sampled_from([None, 1.0, 4.0, 20.0])),
                        tpot_slo_s=draw(st.sampled_from([None, 0.5, 2.0]))))
    return reqs


@st.composite
def setups(draw, name):
    bs = draw(st.sampled_from([1, 2, 4]))
    chunked = draw(st.booleans())
    s = dict(block_size=bs, num_kvcache_blocks=draw(st.integers(2, 12)), max_num_seqs=draw(st.integers(1, 4)),
             chunked=chunked, max_model_len=32,
             max_num_batched_tokens=draw(st.sampled_from([4, 8, 32])) if chunked else 32)
    params = {}
    if name == "vllm_swap":
        s["num_cpu_blocks"] = draw(st.integers(1, 8))
    if name == "sarathi":
        params["token_budget"] = draw(st.sampled_from([4, 8]))
    if name in ("sjf", "srpt"):
        params["predictor"] = "noisy"
        params["predictor_params"] = {"sigma": draw(st.sampled_from([0.0, 1.0])), "seed": draw(st.integers(0, 3))}
        params["prompt_token_weight"] = draw(st.sampled_from([0.0, 0.25]))
    if name == "edf":
        params.update(on_late=draw(st.sampled_from(["deprioritize", "reject"])),
                      prefill_tokens_per_s=draw(st.sampled_from([None, 4.0])))
    if name == "qoe":
        params.update(pause_hysteresis_s=draw(st.sampled_from([0.5, 2.0])),
                      urgent_buffer_s=draw(st.sampled_from([0.25, 1e9])),
                      preemption_mode=draw(st.sampled_from(["recompute", "swap"])))
        if params["preemption_mode"] == "swap":
            s["num_cpu_blocks"] = draw(st.integers(1, 8))
    if name == "vtc":
        params.update(tenant_weights=draw(st.sampled_from([{}, {"a": 2.0, "c": 0.5}])))
    if name == "mlfq":
        params.update(base_quantum=draw(st.sampled_from([1, 2])), num_levels=draw(st.integers(1, 4)),
                      prompt_token_weight=draw(st.sampled_from([0.0, 0.5])),
                      starvation_s=draw(st.sampled_from([None, 2.0, 5.0])))
    return s, params


@pytest.mark.parametrize("victim, eviction", COMBOS, ids=[f"{v}-{e}" for v, e in COMBOS])
@pytest.mark.parametrize("name", sorted(SCHEDULING_POLICIES))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_policy_terminates_exactly_without_leaks(name, victim, eviction, data):
    reqs = data.draw(workloads())
    setup, params = data.draw(setups(name))
    policy = make_scheduling_policy(name, victim=victim, **params)
    budget_ok, cap_ok = [], []

    def observe(t, sched, batch):
        budget_ok.append(batch.num_batched_tokens <= sched.token_budget)
        cap_ok.append(len(sched.running) <= sched.config.max_num_seqs)

    run = drive(policy, reqs, eviction=make_eviction_policy(eviction), max_steps=MAX_STEPS, observe=observe,
                **setup)
    sched = run.scheduler
    bs = setup["block_size"]
    for r in reqs:
        seq = run.seqs[r.rid]
        too_big = -(-(r.prompt_len + r.out_len) // bs) > setup["num_kvcache_blocks"]
        if too_big:
            assert seq.status is SequenceStatus.REJECTED and seq.reject_reason
        elif seq.status is SequenceStatus.REJECTED:        # given up by the policy while it waited
            assert policy.may_reject and seq.reject_reason.startswith(f"policy {name}: ")
            assert seq.first_scheduled_time_s is None and seq.block_table == []
        else:
            assert seq.status is SequenceStatus.FINISHED, seq
            assert seq.num_output_tokens == r.out_len and seq.finish_reason == "length"
            assert seq.output_token_ids == [0] * r.out_len
            assert seq.block_table == []
    assert all(budget_ok) and all(cap_ok)
    bm = sched.block_manager
    assert bm.num_used_blocks == 0 and not bm.cpu_tables and bm.num_cpu_free_blocks == bm.num_cpu_blocks
    bm.check_invariants([])
    assert not sched.has_unfinished()
    for attr in ("_level", "_charge", "_prompt_done", "_outputs", "_last_served_s", "_seen"):
        assert not getattr(policy, attr, {}), f"{name} kept per-request state in {attr}"
    if hasattr(policy, "predictor") and hasattr(policy.predictor, "_factor"):
        assert not policy.predictor._factor


FAST_FORWARD = sorted(n for n, cls in SCHEDULING_POLICIES.items() if cls.fast_forward_ok)


def test_fast_forward_flags():
    # mlfq charges service in on_step: batching its decode steps would skip the charges.
    assert "mlfq" not in FAST_FORWARD and {"sjf", "srpt", "priority", "sarathi", "vllm_swap"} <= set(FAST_FORWARD)


@pytest.mark.parametrize("name", FAST_FORWARD)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_forward_matches_step_by_step(name, data):
    """A policy that declares fast_forward_ok gives the same schedule when the simulator's
    fast path batches pure decode steps (per-step sets of (id, tokens), finish times)."""
    reqs = data.draw(workloads())
    setup, params = data.draw(setups(name))
    runs = [drive(make_scheduling_policy(name, **params), reqs, max_steps=MAX_STEPS, fast_forward=ff, **setup)
            for ff in (False, True)]
    slow, fast = ([sorted(step) for step in r.timeline] for r in runs)
    assert fast == slow
    finish = [{k: s.finish_time_s for k, s in run.seqs.items()} for run in runs[:2]]
    assert finish[0] == finish[1]


def test_fast_forward_publishes_equal_blocks_in_step_order():
    """r2 and r4 have the same prompt and (dummy) outputs, so their first blocks fill with equal
    content in the same step. Step by step, r2 (cheaper, served first by sjf) publishes it; when r2
    finishes its copy is later evicted, and r4's recompute after its preemption finds nothing.
    The fast path must publish in the same order, or r4 would wrongly hit the cache."""
    reqs = [Req("r0", 6, 4, 0, 0, [0] * 6), Req("r1", 10, 4, 0, 0, [0] * 10), Req("r2", 2, 3, 2, 0, [0, 2]),
            Req("r3", 4, 2, 3, 0, [0] * 4), Req("r4", 2, 4, 1, 0, [0, 2])]
    setup = dict(block_size=4, num_kvcache_blocks=10, max_num_seqs=4, chunked=False, max_model_len=32,
                 max_num_batched_tokens=32)
    runs = [drive(make_scheduling_policy("sjf", prompt_token_weight=0.0), reqs, max_steps=MAX_STEPS, fast_forward=ff,
                  **setup) for ff in (False, True)]
    slow, fast = ([sorted(step) for step in r.timeline] for r in runs)
    assert slow[7] == [("r4", 5)]          # a full recompute: no cache hit
    assert fast == slow


def test_fast_forward_evicts_before_publishing_in_step_order():
    """r0's finished prompt block stays cached; r2's first block later fills with the same content
    (so it is not published), and a new block for r1 evicts r0's copy one step later. Step by step,
    r2's recompute after its preemption then finds nothing cached; the fast path must not publish
    r2's block after the eviction it would have preceded."""
    reqs = [Req("r0", 2, 1, 0, 0, [0, 0]), Req("r1", 2, 4, 0, 0, [0, 0]), Req("r2", 1, 4, 0, 0, [0])]
    setup = dict(block_size=2, num_kvcache_blocks=4, max_num_seqs=2, chunked=False, max_model_len=32,
                 max_num_batched_tokens=32)
    runs = [drive(make_scheduling_policy("priority"), reqs, max_steps=MAX_STEPS, fast_forward=ff, **setup)
            for ff in (False, True)]
    slow, fast = ([sorted(step) for step in r.timeline] for r in runs)
    assert slow[5] == [("r2", 4)]          # a full recompute: no cache hit
    assert fast == slow
