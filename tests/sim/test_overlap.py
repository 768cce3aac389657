"""The simulator with overlap scheduling (Replica(overlap_scheduling=True), docs/overlap.md): timelines
worked out by hand, and a step priced as max(device, host) where the cost model has a host term."""
import pytest

from engine.core.recorder import Recorder
from engine.core.scheduler import Scheduler, SchedulerConfig
from sim.cost_model import CalibratedCostModel, ConstantCostModel
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


# device: step 1.0 s (+2.0 s with prefill); host: loop_step (+1.0 s with prefill)
def calibrated(loop_step):
    return CalibratedCostModel(coefficients=dict(step=1.0, eager_step=2.0, loop_step=loop_step,
                                                 loop_prefill_step=1.0))


@pytest.mark.parametrize("loop_step, durations", [
    (0.5, [3.0, 1.0, 1.0]),     # device-bound: prefill max(4.5 - 1.5, 1.5), decodes max(1.5 - 0.5, 0.5)
    (2.0, [3.0, 2.0, 2.0]),     # host-bound decodes: max(3.0 - 2.0, 2.0); prefill max(6.0 - 3.0, 3.0)
])
def test_step_priced_as_max_of_device_and_host(loop_step, durations):
    cm = calibrated(loop_step)
    a = req(0, 4, 3)
    rep = overlapped(cm)
    res = Simulator(rep).run([a])
    steps = res.steps
    assert steps["duration_s"].tolist() == durations
    assert steps["start_time_s"].tolist() == [0.0, durations[0], durations[0] + durations[1]]
    assert a.finish_time_s == sum(durations) == res.end_time_s
    # the synchronous loop pays both
    sync = Simulator(Replica(Scheduler(rep.scheduler.config), cm)).run([req(0, 4, 3)])
    assert sync.steps["duration_s"].tolist() == [4.0 + loop_step, 1.0 + loop_step, 1.0 + loop_step]


def test_models_without_a_host_term_price_the_step_unchanged():
    cm = ConstantCostModel(step_s=0.25, per_decode_seq_s=0.125)
    a, b = req(0, 10, 4), req(1, 6, 4)
    res = Simulator(overlapped(cm)).run([a, b])
    assert res.steps["duration_s"].tolist() == [0.25, 0.5, 0.5, 0.5]
    assert res.busy_s == [1.75]
