"""What a simulation run returns: end time, counts, the two tables, and the physical limit."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass
class SimResult:
    end_time_s: float                    # simulated time when the last replica went idle (or `until`)
    num_requests: int                    # requests that arrived
    num_finished: int
    num_rejected: int
    num_steps: int                       # scheduler steps, all replicas
    num_fast_steps: int                  # of which advanced by the decode fast path
    busy_s: list[float]                  # per replica, simulated seconds executing steps
    wall_s: float                        # wall-clock seconds of the run
    replicas: list = field(default_factory=list, repr=False)

    @property
    def fast_step_fraction(self) -> float:
        return self.num_fast_steps / self.num_steps if self.num_steps else 0.0

    @cached_property
    def requests(self):
        """Per-request table of all replicas (docs/metrics.md), in finishing order per replica."""
        import pandas as pd
        return pd.concat([r.requests_frame() for r in self._recorders()], ignore_index=True)

    @cached_property
    def steps(self):
        """Per-step table of all replicas (raises if the recorders kept no step rows)."""
        import pandas as pd
        return pd.concat([r.steps_frame() for r in self._recorders()], ignore_index=True)

    def _recorders(self):
        recs = [r.recorder for r in self.replicas]
        if any(r is None for r in recs):
            raise ValueError("this run kept no tables: build the Simulator with record=True or give every "
                             "Replica a Recorder")
        return recs

    @cached_property
    def lower_bound(self):
        """sim.lower_bound.WorkloadBound of the finished requests, or None when the cost models are not
        roofline models of one (model, hardware, tensor parallelism).

        With several replicas the bound serves all requests as one replica holding the whole cluster's
        KV cache; its time_s is replica-seconds, comparable to sum(busy_s)."""
        from sim.lower_bound import workload_lower_bound
        cms = [r.cost_model for r in self.replicas]
        keys = {(getattr(c, "model", None), getattr(c, "hardware", None), getattr(c, "tensor_parallel_size", 1))
                for c in cms}
        if len(keys) != 1 or None in next(iter(keys))[:2]:
            return None
        model, hardware, tp = next(iter(keys))
        req = self.requests
        done = req[req["status"] == "finished"]
        if done.empty:
            return None
        pairs = np.stack([done["num_prompt_tokens"].to_numpy(), done["num_output_tokens"].to_numpy()], axis=1)
        bms = [r.scheduler.block_manager for r in self.replicas]
        kv = sum(bm.num_kvcache_blocks * bm.block_size for bm in bms)
        return workload_lower_bound(pairs, model, hardware, tensor_parallel_size=tp, kv_capacity_tokens=kv)

    @property
    def fraction_of_physical_limit(self) -> float | None:
        """lower_bound.time_s / sum(busy_s): 1.0 would be a schedule as fast as the roofline allows."""
        b = self.lower_bound
        busy = sum(self.busy_s)
        return None if b is None or busy == 0 else b.time_s / busy

    def summary(self) -> str:
        s = (f"{self.num_requests} requests ({self.num_finished} finished, {self.num_rejected} rejected), "
             f"{self.num_steps} steps ({100 * self.fast_step_fraction:.1f}% fast path), simulated "
             f"{self.end_time_s:.2f} s in {self.wall_s:.2f} s wall")
        f = self.fraction_of_physical_limit
        return s + ("" if f is None else f", {100 * f:.1f}% of the roofline limit")
