"""The simulator with overlap scheduling (Replica(overlap_scheduling=True), docs/overlap.md): timelines
worked out by hand, a step's host preparation hidden behind the step before's device time (not its own),
and sim/overlap_timeline.py pricing the simulator's own rows as the simulator timed them."""
import numpy as np
import pytest

from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from policies.registry import SCHEDULING_POLICIES
from sim.cost_model import CalibratedCostModel, ConstantCostModel
from sim.overlap_timeline import overlapped_row_s, restarts
from sim.simulator import Replica, Simulator
from tests.sim.test_simulator import event_log, req


def overlapped(cost_model, blocks=256, **cfg):
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_model_len=4096,
                                      max_num_batched_tokens=4096, **cfg))
    return Replica(sched, cost_model, Recorder(), overlap_scheduling=True)


def test_arrival_is_seen_one_step_later_and_finishes_hold_one_step():
    # As test_simulator's boundary case (A: 10 tokens, 5 out, at 0; B: 10 tokens, 2 out, at 2.0; 1 s steps),
    # but each step is scheduled when the one before starts: [0,1] prefill A and [1,2] decode A are both
    # scheduled at 0; the step scheduled at 2.0 (when [2,3] starts) sees B and runs at [3,4].
    #   [0,1] prefill A  [1,2] decode A  [2,3] decode A  [3,4] prefill B  [4,5] decode A,B (B's last token)
    #   [5,6] decode A (its last token; scheduled at 4, without B, whose last token was in flight)
    a, b = req(0, 10, 5, 0.0), req(1, 10, 2, 2.0)
    res = Simulator(overlapped(ConstantCostModel(step_s=1.0))).run([a, b])
    assert event_log(res) == [
        (0.0, "step", (10, 0)),
        (1.0, "first_token", 0), (1.0, "step", (0, 1)),
        (2.0, "step", (0, 1)),
        (3.0, "step", (10, 0)),
        (4.0, "first_token", 1), (4.0, "step", (0, 2)),
        (5.0, "finish", 1), (5.0, "step", (0, 1)),
        (6.0, "finish", 0),
    ]
    assert a.output_token_ids == [-1] * 5 and b.output_token_ids == [-2] * 2    # sim.arrivals' dummy tokens
    assert res.num_fast_steps == 0 and res.replicas[0].scheduler.num_in_flight == 0


def test_idle_gap_restarts_the_pipeline():
    # A (1 out) alone at 0: [0,1] prefill; nothing else to schedule. B at 5: [5,6] prefill, [6,7] decode.
    a, b = req(0, 10, 1, 0.0), req(1, 10, 2, 5.0)
    res = Simulator(overlapped(ConstantCostModel(step_s=1.0))).run([a, b])
    assert event_log(res) == [
        (0.0, "step", (10, 0)), (1.0, "finish", 0), (1.0, "first_token", 0),
        (5.0, "step", (10, 0)), (6.0, "first_token", 1), (6.0, "step", (0, 1)), (7.0, "finish", 1),
    ]


# device: step 1.0 s (+2.0 s with prefill); host: loop_step after a step's tokens (+1.0 s before a prefill's launch)
def calibrated(loop_step, **extra):
    return CalibratedCostModel(coefficients=dict(step=1.0, eager_step=2.0, loop_step=loop_step,
                                                 loop_prefill_step=1.0, **extra))


@pytest.mark.parametrize("loop_step, durations, finish", [
    # prefill: launched at 1 (its preparation, nothing to hide behind), device [1, 4]; D1 scheduled at 1, runs
    # [4, 5]; P's tokens at 4, its loop to 4.5, D2 scheduled then, runs [5, 6]; rows [0,4] [4,5] [5,6]
    (0.5, [4.0, 1.0, 1.0], 6.0),
    # host-bound decodes: P's tokens at 4, loop to 6: D2 scheduled at 6 runs [6, 7]; D1's tokens are collected
    # at 6 (after D2's launch), its loop to 8; D2's tokens at 8: rows [0,4] [4,6] [6,8]
    (2.0, [4.0, 2.0, 2.0], 8.0),
])
def test_step_timed_by_the_pipeline_of_host_and_device(loop_step, durations, finish):
    cm = calibrated(loop_step)
    a = req(0, 4, 3)
    rep = overlapped(cm)
    res = Simulator(rep).run([a])
    steps = res.steps
    assert steps["duration_s"].tolist() == durations
    assert steps["start_time_s"].tolist() == [0.0, durations[0], durations[0] + durations[1]]
    assert a.first_token_time_s == 4.0 and a.finish_time_s == finish == sum(durations)
    assert res.busy_s == [sum(durations)]
    # the synchronous loop pays both
    sync = Simulator(Replica(Scheduler(rep.scheduler.config), cm)).run([req(0, 4, 3)])
    assert sync.steps["duration_s"].tolist() == [4.0 + loop_step, 1.0 + loop_step, 1.0 + loop_step]


def test_a_prefills_preparation_hides_only_behind_the_step_before():
    # loop_prefill_tokens 0.25 s a prefill token before its launch: B's 8-token prefill prepares for 3 s
    # (1 + 8 * 0.25) while the step before it on the device (a 1 s decode of A) lasts 1 s: the device idles 2 s.
    #   t=0    schedule P(A): launched at 2 (1 + 4 * 0.25), device [2, 5]; schedule D(A) at 2: device [5, 6]
    #   t=5    P(A)'s tokens (A's first); its loop (0.5 s) to 5.5
    #   t=5.5  schedule P(B) (B arrived at 5.2; a prefill step runs alone, chunked prefill off): launched at
    #          8.5, device [8.5, 11.5]; D(A)'s tokens are collected after that launch, at 8.5
    #   t=11.5 P(B)'s tokens (B's first and last); then A's last decode
    cm = calibrated(0.5, loop_prefill_tokens=0.25)
    a, b = req(0, 4, 3), req(1, 8, 1, arrival=5.2)
    res = Simulator(overlapped(cm)).run([a, b])
    steps = res.steps
    assert steps["num_prefill_tokens"].tolist()[:3] == [4, 0, 8]
    assert steps["start_time_s"].tolist()[:3] == [0.0, 5.0, 8.5]
    # row P(A) [0, 5]; row D1(A) [5, 8.5]: its tokens wait for P(B)'s launch; row P(B) [8.5, 11.5]
    assert steps["duration_s"].tolist()[:3] == [5.0, 3.5, 3.0]
    assert b.first_token_time_s == 11.5
    # max(device, host) of each step alone would have given P(B) 3 s from D1's end at 6
    assert res.requests.set_index("request_id").loc[1, "ttft_s"] == pytest.approx(11.5 - 5.2)


@pytest.mark.parametrize("policy, blocks, gap_s, max_out, after_share",
                         [("vllm", 48, 3.0, 30, 0.0), ("vllm_swap", 40, 1.0, 60, 0.0), ("vllm", 48, 3.0, 30, 0.6)])
def test_table_pricing_reproduces_the_simulated_rows(policy, blocks, gap_s, max_out, after_share):
    # sim/overlap_timeline.py on the simulator's own recorded rows gives their durations: one recursion, with
    # preemption by recompute and by swap (a step with copies waits for the device before it prepares)
    swaps = dict(decode_context_sum=1e-3, swap_step=0.5, swap_out_blocks=0.01, swap_in_blocks=0.01)
    # a device model: 0.3 s of every step's 1 s fixed cost is host work before the launch
    device = CalibratedCostModel(coefficients=dict(step=0.7, eager_step=2.0, **swaps))
    cm = CalibratedCostModel(coefficients=dict(step=1.0, eager_step=2.0, loop_step=0.25, loop_prefill_step=1.0,
                                               loop_prefill_tokens=0.01, loop_seqs=0.05, **swaps), device=device)
    # after_share: that share of the host's 0.01 s a prefill token runs after the step's tokens, in both forms
    cm = cm.with_prefill_host_after_share(after_share)
    rng = np.random.default_rng(0)
    seqs = [req(i, int(rng.integers(4, 200)), int(rng.integers(1, max_out)), arrival=float(rng.exponential(gap_s)) * i)
            for i in range(40)]
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_model_len=4096,
                                      max_num_batched_tokens=4096, num_cpu_blocks=200), SCHEDULING_POLICIES[policy]())
    res = Simulator(Replica(sched, cm, Recorder(), overlap_scheduling=True)).run(seqs)
    steps = res.steps
    assert len(steps) > 100 and (steps["num_prefill_seqs"] > 0).sum() > 20
    assert (steps["num_swap_blocks"] > 0).sum() > (20 if policy == "vllm_swap" else -1)
    table = steps.assign(serving_loop=1)
    pred = cm.predict_table(table, overlapped=True)
    np.testing.assert_allclose(pred, steps["duration_s"].to_numpy(), rtol=1e-9, atol=1e-9)
    # the rows with a gap before them restarted the pipeline; the others did not (a recursion, not a per-row price)
    restart = restarts(steps["start_time_s"], steps["duration_s"])
    assert (restart.sum() > 1 if policy == "vllm" else restart.sum() == 1) and restart.sum() < len(steps) - 50
    if policy == "vllm_swap":       # without the wait before a copying step's preparation the rows differ
        assert not np.allclose(overlapped_row_s(*_parts(cm, table), restart), pred)
    if after_share:                 # the prompt's host work after its tokens: another timeline, the same sums
        before = cm.with_prefill_host_after_share(0.0)
        assert not np.allclose(before.predict_table(table, overlapped=True), pred)
        np.testing.assert_allclose(before.predict_table(table), cm.predict_table(table))


def _parts(cm, table):
    """(prepare, device, loop) per row as predict_table splits them: host = step - device, loop its loop terms."""
    total, device = cm.predict_table(table), cm.device_model.predict_table(table)
    c = cm.coefficients
    seqs = table.num_prefill_seqs + table.num_decode_seqs
    loop = np.minimum(c["loop_step"] + c["loop_seqs"] * seqs, total - device)
    return total - device - loop, device, loop


def test_models_without_a_host_term_price_the_step_unchanged():
    cm = ConstantCostModel(step_s=0.25, per_decode_seq_s=0.125)
    a, b = req(0, 10, 4), req(1, 6, 4)
    res = Simulator(overlapped(cm)).run([a, b])
    assert res.steps["duration_s"].tolist() == [0.25, 0.5, 0.5, 0.5]
    assert res.busy_s == [1.75]


class _ColdStart(ConstantCostModel):
    """1 s steps; the first step after 2 s or more of waiting pays 0.5 s of cold start."""
    def cold_start_s(self, idle_s):
        return 0.5 if idle_s >= 2.0 else 0.0


@pytest.mark.parametrize("overlap", [False, True])
def test_a_step_after_a_long_idle_wait_pays_the_cold_start(overlap):
    # A at 0 (no wait before it): [0,1]. B at 2.5, 1.5 s after the replica went idle: [2.5,3.5].
    # C at 10, 6.5 s idle: 0.5 s cold start before its step, tokens at 11.5 (its row [10,11.5]).
    a, b, c = req(0, 10, 1, 0.0), req(1, 10, 1, 2.5), req(2, 10, 1, 10.0)
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=256, block_size=16, max_model_len=4096,
                                      max_num_batched_tokens=4096))
    res = Simulator(Replica(sched, _ColdStart(step_s=1.0), Recorder(), overlap_scheduling=overlap)).run([a, b, c])
    firsts = {e[2]: e[0] for e in event_log(res) if e[1] == "first_token"}
    assert firsts == {0: 1.0, 1: 3.5, 2: 11.5}
    steps = res.steps
    assert steps["start_time_s"].tolist() == [0.0, 2.5, 10.0] and steps["duration_s"].tolist() == [1.0, 1.0, 1.5]
