"""Launch stalls: pauses of the engine's host that no step price holds, and the requests they delay.

An overlapped run records, per step, the host's seconds from scheduling the step to launching it
(`launch_host_s`); the cost model prices the usual host work. A step whose launch took well beyond that is a
stall (a pause of the engine's process or its host). The device idles through it, so the steps next to it run
long against any fit, and a request whose prefill meets one gets its first token late.

- `near_launch_stalls(steps, expected_s)`: which steps are a stall or the step just before one.
- `first_prefill_steps(decisions)`: each request's first prefill step, from a run's recorded decisions.
- `ttft_by_stall(real, sim, first, stall_steps)`: TTFT error over all requests, those whose prefill step or first
  token step is near a stall, and the rest.
- `run_ttft_by_stall(run, sim, cost_model, decisions)`: the same for a kept overlapped run.

experiments.generalize counts steps by stall in `step_kinds` and scores TTFT away from stalls per cell.
benchmarks/ttft_stalls.py prints the split for chosen cells.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

STALL_MARGIN_S = 1e-3  # a launch stall: host seconds before a launch this much beyond the fit's (near_launch_stalls)


def near_launch_stalls(steps: pd.DataFrame, expected_s, margin_s: float = STALL_MARGIN_S) -> np.ndarray:
    """[rows] bool, an overlapped run's steps in order: a launch stall and the step before it, whose row waits for
    that launch while the device idles (sim/overlap_timeline.py). A stall: the host's seconds from the step's
    schedule to its launch (launch_host_s) exceed expected_s, the cost model's host seconds before that launch
    ([rows] or a scalar), by more than the run's median excess plus margin_s (the median takes out a constant:
    launch_host_s also counts the launch call, on an H100 ~0.45 ms more than the model's share; a step without it
    is no stall). The cost model prices the host's usual work, a long prefill's or a prefix hit's included; a
    stall (a pause of the engine's process or of its host) is not in it, so step_kinds shows the steps by a stall
    apart: a bias there is the host's, elsewhere the fit's."""
    excess = steps["launch_host_s"].to_numpy(dtype=np.float64) - expected_s
    if not np.isfinite(excess).any():
        return np.zeros(len(excess), bool)
    stall = np.nan_to_num(excess - np.nanmedian(excess), nan=0.0) > margin_s
    return stall | np.r_[stall[1:], False]


def first_prefill_steps(decisions: pd.DataFrame) -> dict[str, int]:
    """request id -> the step that first scheduled its prefill (decisions: one row a step, prefill_ids a
    space-separated list, as experiments.validate --record-decisions writes it)."""
    first: dict[str, int] = {}
    for step, ids in zip(decisions["step"], decisions["prefill_ids"]):
        for rid in str(ids).split():
            first.setdefault(rid, int(step))
    return first


def ttft_by_stall(real: pd.DataFrame, sim: pd.DataFrame, first: dict[str, int], stall_steps) -> pd.DataFrame:
    """One row per group (all / near a stall / away from stalls): requests, real and simulated TTFT p50 (s), the
    p50's relative error and the median per-request signed relative error. real, sim: request tables
    (request_id, ttft_s); a request is near when its prefill step or the next one is in stall_steps."""
    stalls = np.array(sorted({int(s) for s in stall_steps}), dtype=np.int64)
    j = pd.DataFrame({"real": real.set_index(real["request_id"].astype(str))["ttft_s"]})
    j["sim"] = sim.set_index(sim["request_id"].astype(str))["ttft_s"].reindex(j.index)
    j = j.dropna()
    step = np.array([first.get(rid, -10) for rid in j.index], dtype=np.int64)
    near = np.isin(step, stalls) | np.isin(step + 1, stalls)
    rows = []
    for group, mask in (("all", np.ones(len(j), bool)), ("near a stall", near), ("away from stalls", ~near)):
        x = j[mask]
        if len(x):
            rows.append(dict(group=group, requests=len(x), real_ttft_p50_s=float(x["real"].median()),
                             sim_ttft_p50_s=float(x["sim"].median()),
                             p50_rel_err=float(x["sim"].median() / x["real"].median() - 1),
                             per_request_signed_median=float((x["sim"] / x["real"] - 1).median())))
    return pd.DataFrame(rows)


def run_ttft_by_stall(run, sim, cost_model, decisions: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """(ttft_by_stall's table, steps near a stall, steps) of a kept overlapped real run (saved_runs' run: steps
    and requests) against its simulated run, the stalls found with cost_model's host seconds."""
    from experiments.step_tables import priced_steps
    st, _ = priced_steps(run.steps, cost_model, True)
    near = near_launch_stalls(st, cost_model.overlap_parts_table(st)[0])
    table = ttft_by_stall(run.requests, sim.requests, first_prefill_steps(decisions), st.loc[near, "step"])
    return table, int(near.sum()), len(st)
