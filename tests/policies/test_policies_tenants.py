"""Exact timelines of the tenant- and SLO-aware policies (edf, qoe, vtc) against vllm, and VTC's fairness bound.

Fake clock t = step index, null executor, block_size 4 (tests/helpers.py). Each expected
timeline is worked out in the comments: a request of prompt 4 and 2 outputs takes a prefill step (4 tokens,
first output) and one decode step.
"""
from __future__ import annotations

import pytest

from engine.core.sequence import SequenceStatus
from policies.registry import make_scheduling_policy
from policies.scheduling.edf import EDFPolicy
from policies.scheduling.qoe import QoEPolicy
from policies.scheduling.vllm import VLLMPolicy
from policies.scheduling.vtc import VTCPolicy
from tests.helpers import Req, drive, worst_backlogged_difference


def two_steps(rid):
    return [[(rid, 4)], [(rid, 1)]]


def L_then(*rids):
    # L (prompt 4, 6 outputs) holds the single slot t0..t5; then each rid in turn, two steps each
    out = [[("L", 4)]] + [[("L", 1)]] * 5
    for rid in rids:
        out += two_steps(rid)
    return out


def test_edf_serves_the_earliest_deadline_first():
    # One slot, held by L (no target) until t5. B (TTFT target 20 s) arrives at t1 before C (8 s).
    reqs = [Req("L", 4, 6), Req("B", 4, 2, arrival=1, ttft_slo_s=20.0), Req("C", 4, 2, arrival=1, ttft_slo_s=8.0)]
    assert drive(VLLMPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1).timeline == L_then("B", "C")
    # t6: deadlines B 21, C 9; C's slack 9 - 6 = 3 s is not negative, so C is on time and goes first.
    run = drive(EDFPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert run.timeline == L_then("C", "B")
    assert run.seqs["C"].first_token_time_s == 6 and run.seqs["B"].first_token_time_s == 8


def test_edf_late_requests_deprioritized_or_rejected():
    # C (target 3 s, deadline 4) arrives at t1, B (target 20 s, deadline 22) at t2; L holds the slot to t5.
    reqs = [Req("L", 4, 6), Req("C", 4, 2, arrival=1, ttft_slo_s=3.0), Req("B", 4, 2, arrival=2, ttft_slo_s=20.0)]
    assert drive(VLLMPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1).timeline == L_then("C", "B")
    # deprioritize: at t6 C's slack is 4 - 6 < 0 (late), so on-time B goes first, C after.
    late = drive(EDFPolicy(on_late="deprioritize"), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert late.timeline == L_then("B", "C")
    # reject: C's slack turns negative at t5 (4 - 5), while it waits: rejected at that step, never run.
    rej = drive(EDFPolicy(on_late="reject"), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert rej.timeline == L_then("B")
    c = rej.seqs["C"]
    assert c.status is SequenceStatus.REJECTED and c.first_scheduled_time_s is None
    assert c.reject_reason.startswith("policy edf: TTFT target 3 s can no longer be met")
    assert [[s.request_id for s in b.rejected] for b in rej.batches][4:6] == [[], ["C"]]
    # with a prefill estimate of 2 tokens/s C's 4 prompt tokens need 2 s: slack 4 - t - 2 < 0 from t3.
    est = drive(EDFPolicy(on_late="reject", prefill_tokens_per_s=2.0), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert [b.rejected for b in est.batches].index([est.seqs["C"]]) == 3


def test_edf_after_the_first_token_ranks_by_the_tpot_deadline():
    pol = EDFPolicy()
    run = drive(pol, [Req("A", 4, 3, tpot_slo_s=2.0)], num_kvcache_blocks=16)
    a = run.seqs["A"]          # first token at t0, 3 outputs: the next token would be due at 0 + 3 * 2 = 6 s
    assert a.first_token_time_s == 0 and pol.deadline_s(a) == 6.0
    assert EDFPolicy.deadline_s(drive(EDFPolicy(), [Req("N", 4, 2)], num_kvcache_blocks=16).seqs["N"]) == float("inf")


def test_edf_bad_knobs_fail_naming_the_field():
    with pytest.raises(ValueError, match="edf.on_late must be one of"):
        EDFPolicy(on_late="drop")
    with pytest.raises(ValueError, match="edf.prefill_tokens_per_s must be a finite number > 0"):
        EDFPolicy(prefill_tokens_per_s=0)


HEAVY_LIGHT = [Req(f"H{i}", 4, 2, tenant="heavy") for i in range(4)] + \
              [Req(f"L{i}", 4, 2, tenant="light") for i in range(2)]


def test_vtc_serves_the_least_served_tenant():
    # One slot. A request costs 4 * 1 (prompt) + 2 * 2 (outputs) = 8 on its tenant's counter.
    fcfs = drive(VLLMPolicy(), HEAVY_LIGHT, num_kvcache_blocks=16, max_num_seqs=1)
    assert fcfs.timeline == sum((two_steps(r) for r in ["H0", "H1", "H2", "H3", "L0", "L1"]), [])
    # t0: both counters 0, tie -> the tenant named first (heavy) with H0; heavy 8. t2: light (0) L0 -> 8.
    # t4: tie again -> H1 (16); t6: L1 (16); then light has nothing waiting: H2, H3.
    pol = VTCPolicy()
    run = drive(pol, HEAVY_LIGHT, num_kvcache_blocks=16, max_num_seqs=1)
    assert run.timeline == sum((two_steps(r) for r in ["H0", "L0", "H1", "L1", "H2", "H3"]), [])
    assert pol.counters == {"heavy": 32.0, "light": 16.0}
    assert not pol._seen and not pol._prompt_done and not pol._outputs


def test_vtc_weights_scale_the_service():
    # light of weight 2: its requests cost 8 / 2 = 4. t2: L0 (light 4); t4: 4 < 8, L1 (light 8); then ties: heavy.
    run = drive(VTCPolicy(tenant_weights={"light": 2}), HEAVY_LIGHT, num_kvcache_blocks=16, max_num_seqs=1)
    assert run.timeline == sum((two_steps(r) for r in ["H0", "L0", "L1", "H1", "H2", "H3"]), [])
    with pytest.raises(ValueError, match=r"vtc.tenant_weights\['light'\] must be a finite number > 0, got 0"):
        VTCPolicy(tenant_weights={"light": 0})
    with pytest.raises(ValueError, match=r"vtc.tenant_weights\['x'\] must be a finite number > 0, got nan"):
        make_scheduling_policy("vtc", tenant_weights={"x": float("nan")})


def test_vtc_lifts_the_counter_of_a_newly_backlogged_tenant():
    # heavy H0..H5 at t0; light's L0, L1 arrive at t5 while H2 decodes. Heavy's counter then is 8 + 8 + 6 = 22
    # (H2's prefill charged), so light starts at max(0, 22) = 22 instead of 0 and cannot take the next two slots:
    # t6 L0 (light 30 > heavy 24), t8 H3 (32), t10 L1, then H4, H5.
    reqs = [Req(f"H{i}", 4, 2, tenant="heavy") for i in range(6)] + \
           [Req(f"L{i}", 4, 2, arrival=5, tenant="light") for i in range(2)]
    counters = {}

    def observe(t, sched, batch):
        counters[t] = dict(sched.policy.counters)

    run = drive(VTCPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1, observe=observe)
    assert counters[5] == {"heavy": 24.0, "light": 22.0}
    assert run.timeline == sum((two_steps(r) for r in ["H0", "H1", "H2", "L0", "H3", "L1", "H4", "H5"]), [])


def _service_by_step(run, tenants: dict, wp: float = 1.0, wq: float = 2.0) -> dict[str, list[float]]:
    """Per tenant, the weighted service of each step (prompt tokens of prefill entries, one output each)."""
    out = {t: [0.0] * len(run.timeline) for t in set(tenants.values())}
    for i, step in enumerate(run.timeline):
        for rid, n in step:
            out[tenants[rid]][i] += (wp * n + wq) if n > 1 else wq
    return out


def _max_backlogged_difference(policy, reqs, **setup) -> tuple[float, float]:
    """(largest |W_f - W_g| over intervals in which both tenants had waiting requests, the paper's 2U)."""
    backlog = []

    def observe(t, sched, batch):
        backlog.append({s.tenant for s in sched.waiting})

    run = drive(policy, reqs, observe=observe, **setup)
    tenants = {r.rid: r.tenant for r in reqs}
    serv = _service_by_step(run, tenants)
    f, g = sorted(serv)
    # step i is backlogged when both had waiting requests before it was scheduled (after step i - 1)
    both = [i > 0 and {f, g} <= backlog[i - 1] for i in range(len(run.timeline))]
    worst = worst_backlogged_difference([a - b for a, b in zip(serv[f], serv[g])], both)
    longest_prompt = max(r.prompt_len for r in reqs)
    capacity_tokens = setup["num_kvcache_blocks"] * setup["block_size"]        # M: the most tokens a batch can hold
    return worst, 2 * max(1.0 * longest_prompt, 2.0 * capacity_tokens)


def test_vtc_meets_the_papers_bound_on_backlogged_service_difference():
    # heavy's 60 requests all come first; light's 30 right after; both stay backlogged for a long stretch.
    reqs = [Req(f"h{i}", 4 + i % 5, 3 + i % 4, tenant="heavy") for i in range(60)] + \
           [Req(f"l{i}", 4 + i % 3, 2 + i % 5, tenant="light") for i in range(30)]
    setup = dict(num_kvcache_blocks=12, block_size=4, max_num_seqs=3, max_model_len=32, max_num_batched_tokens=32)
    vtc, bound = _max_backlogged_difference(VTCPolicy(), reqs, **setup)
    fcfs, _ = _max_backlogged_difference(VLLMPolicy(), reqs, **setup)
    assert bound == 2 * 2.0 * 48
    assert vtc <= bound
    assert fcfs > bound          # the check can fail: FCFS serves heavy alone while light waits


def test_qoe_pauses_a_request_ahead_of_its_readers_timeline():
    # One slot. A reader takes a token every 3 s (tpot target 3) after a first token within 1 s.
    # A (6 outputs) starts at t0; B arrives at t2.
    reqs = [Req("A", 4, 6, ttft_slo_s=1.0, tpot_slo_s=3.0), Req("B", 4, 2, arrival=2, ttft_slo_s=1.0, tpot_slo_s=3.0)]
    assert drive(VLLMPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1).timeline == \
        [[("A", 4)]] + [[("A", 1)]] * 5 + two_steps("B")
    # t2: A has 2 tokens out, the next due at 0 + 2 * 3 = 6: buffer 4 s, less the hysteresis 1 s = 3 > B's
    # buffer 2 + 1 - 2 = 1, so B preempts A. t3: A waits with buffer 6 - 3 = 3, B runs with 2 + 3 - 3 - 1 = 1:
    # B keeps the slot and finishes. t4: A recomputes its 2 outputs (the prompt block is cached), then decodes.
    # (urgent_buffer_s=1: B, its buffer 1 s at t2, is urgent on arrival)
    run = drive(QoEPolicy(pause_hysteresis_s=1.0, urgent_buffer_s=1.0), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert run.timeline == [[("A", 4)], [("A", 1)], [("B", 4)], [("B", 1)], [("A", 2)]] + [[("A", 1)]] * 3
    assert run.preempted[2] == ["A"]
    # a hysteresis above A's lead over B (2k - (3 - k) = 3k - 3 s at step k, 12 s at most) keeps A running
    calm = drive(QoEPolicy(pause_hysteresis_s=20.0, urgent_buffer_s=1.0), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert calm.timeline == [[("A", 4)]] + [[("A", 1)]] * 5 + two_steps("B")
    with pytest.raises(ValueError, match="qoe.pause_hysteresis_s must be a finite number > 0"):
        QoEPolicy(pause_hysteresis_s=-1)


def test_qoe_pauses_only_for_an_urgent_request_so_readers_ahead_do_not_trade_every_step():
    # One slot, a reader's pace far below the GPU's (a token per 10 s against one per step): A at t0, B at t1,
    # C at t2, 8 outputs each, first token due 2 s after arrival. A running request gains 9 s of buffer a step,
    # a waiting one loses 1 s, so a rule that pauses whenever the waiting one is further behind trades the slot
    # every step (each trade a recompute).
    reqs = [Req("A", 4, 8, ttft_slo_s=2.0, tpot_slo_s=10.0), Req("B", 4, 8, arrival=1, ttft_slo_s=2.0, tpot_slo_s=10.0),
            Req("C", 4, 8, arrival=2, ttft_slo_s=2.0, tpot_slo_s=10.0)]
    setup = dict(num_kvcache_blocks=16, max_num_seqs=1)
    eager = drive(QoEPolicy(pause_hysteresis_s=1.0, urgent_buffer_s=1e9), reqs, **setup)
    assert [i for i, p in enumerate(eager.preempted) if p] == list(range(1, 22))
    # urgent_buffer_s 0.25: B waits while its buffer lasts (2 s at t1, 1 s at t2); at t3 it is 0: B pauses A
    # (first token t1, 3 outputs: due 31, buffer 28 - 1 s hysteresis). At t4 C is due (buffer 0) and pauses B
    # (due 14, buffer 10 - 1). C then runs out (t4..t11); B, due at 14, is admitted into the free slot at t12
    # before it is urgent (recomputing its one output: the prompt block is cached), then A at t19.
    run = drive(QoEPolicy(pause_hysteresis_s=1.0, urgent_buffer_s=0.25), reqs, **setup)
    assert run.timeline == [[("A", 4)], [("A", 1)], [("A", 1)], [("B", 4)], [("C", 4)]] + [[("C", 1)]] * 7 + \
        [[("B", 1)]] * 7 + [[("A", 3)]] + [[("A", 1)]] * 4
    assert {i: p for i, p in enumerate(run.preempted) if p} == {3: ["A"], 4: ["B"]}
    with pytest.raises(ValueError, match="qoe.urgent_buffer_s must be a finite number"):
        QoEPolicy(urgent_buffer_s=float("nan"))
