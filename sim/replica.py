"""One serving replica inside the simulator: the engine's scheduler, a cost model, a recorder."""
from __future__ import annotations

from collections import deque

from engine.core.scheduler import Scheduler
from sim.cost_model.base import CostModel
from sim.fast_forward import DecodeFastForward


class Replica:
    """A scheduler (with its KV cache), the cost model that prices its steps, and an optional
    engine.core.recorder.Recorder (the Simulator creates one when record=True and none is given);
    `fast` drives the scheduler's decode fast path (sim.fast_forward).

    overlap_scheduling: schedule each step while the previous one runs, as the engine does with
    EngineConfig.overlap_scheduling (sim.simulator.Simulator._overlap_loop, docs/overlap.md): the same
    scheduling decisions, steps timed by cost_model.overlap_parts_s (its decode fast path: sim/fast_path.py)."""

    def __init__(self, scheduler: Scheduler, cost_model: CostModel, recorder=None, index: int = 0,
                 overlap_scheduling: bool = False):
        cm_len = getattr(cost_model, "max_model_len", None)
        if cm_len is not None and scheduler.config.max_model_len > cm_len:
            raise ValueError(f"SchedulerConfig.max_model_len ({scheduler.config.max_model_len}) exceeds the cost "
                             f"model's max_model_len ({cm_len}); lower the scheduler's or raise the cost model's, so "
                             "that a request too long for the model is rejected at arrival")
        self.scheduler = scheduler
        self.fast = DecodeFastForward(scheduler)
        self.cost_model = cost_model
        self.recorder = recorder
        self.index = index
        self.overlap_scheduling = bool(overlap_scheduling)
        self.inbox: deque = deque()          # routed Sequences a step has not pulled yet (arrival order)
        self.outstanding_tokens = 0          # see sim.router.base.ReplicaView.outstanding_tokens
        self.wakeup = None                   # SimPy event while idle, triggered by a routed arrival
        self.num_steps = 0
        self.num_fast_steps = 0              # of num_steps, taken by the decode fast path
        self.num_fast_calls = 0
        self.busy_s = 0.0                    # simulated seconds spent executing steps
        self.last_decode_s = 0.0             # duration of the latest pure-decode step (fast-path heuristic)
        self.horizon_spent = False           # the latest fast segment used a horizon that free blocks cut short
        self.overlap_fast_ok = True          # the cost model prices the overlap fast path's steps
        self.segment_whole = False           # the latest fast segment took its whole decode horizon

    def notify(self) -> None:
        w = self.wakeup
        if w is not None and not w.triggered:
            w.succeed()
