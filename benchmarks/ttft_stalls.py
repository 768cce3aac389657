"""How much of a cell's TTFT error sits with the requests whose prefill met a host launch stall.

    python benchmarks/ttft_stalls.py --real-root real --profile profile.json --cell prefill_heavy:vllm [--cell ...]

For each WORKLOAD:POLICY kept by benchmarks/gpu_generalize.sh (an overlapped run with its decisions recorded), the
run is simulated again with the fit (experiments.generalize.simulate_saved) and its requests split in two: those
whose prefill step, or the step after it that returns their first token, is near a launch stall
(experiments.generalize.near_launch_stalls: the host's seconds before a launch well beyond the fit's), and the
rest. A stall is the host's (a pause of the engine's process), not a step price, so the fit cannot follow it: a
TTFT bias among the first group and none among the second puts the cell's TTFT miss on the host. Prints, per
group, the real and simulated TTFT p50, their relative error and the median per-request signed error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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
    stall_steps = set(int(s) for s in stall_steps)
    j = pd.DataFrame({"real": real.set_index(real["request_id"].astype(str))["ttft_s"]})
    j["sim"] = sim.set_index(sim["request_id"].astype(str))["ttft_s"].reindex(j.index)
    j = j.dropna()
    step = np.array([first.get(rid, -10) for rid in j.index])
    near = np.isin(step, list(stall_steps)) | np.isin(step + 1, list(stall_steps))
    rows = []
    for group, mask in (("all", np.ones(len(j), bool)), ("near a stall", near), ("away from stalls", ~near)):
        x = j[mask]
        if len(x):
            rows.append(dict(group=group, requests=len(x), real_ttft_p50_s=float(x["real"].median()),
                             sim_ttft_p50_s=float(x["sim"].median()),
                             p50_rel_err=float(x["sim"].median() / x["real"].median() - 1),
                             per_request_signed_median=float((x["sim"] / x["real"] - 1).median())))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real-root", required=True, type=Path, help="gpu_generalize.sh's real/ folder")
    ap.add_argument("--profile", required=True, help="the calibrated fit (experiments.calibrate JSON)")
    ap.add_argument("--cell", action="append", required=True, metavar="WORKLOAD:POLICY")
    ap.add_argument("--traces-dir", default="../shared/traces", help="where the run's traces are here")
    args = ap.parse_args(argv)
    from experiments.generalize import near_launch_stalls, saved_argv, simulate_saved
    from experiments.step_tables import priced_steps
    from sim.cost_model.calibrated import CalibratedCostModel

    cm = CalibratedCostModel.load(args.profile)
    for cell in args.cell:
        wl, _, policy = cell.partition(":")
        wl_dir = args.real_root / wl
        _, saved, sim = simulate_saved(wl_dir, wl, policy, saved_argv(wl_dir, wl, args.traces_dir), cm)
        run = saved.run(policy)
        st, _ = priced_steps(run.steps, cm, True)
        near = near_launch_stalls(st, cm.overlap_parts_table(st)[0])
        decisions = pd.read_parquet(wl_dir / f"{wl}_{policy}_decisions.parquet")
        table = ttft_by_stall(run.requests, sim.requests, first_prefill_steps(decisions), st.loc[near, "step"])
        print(f"{cell}: {int(near.sum())} of {len(st)} steps near a launch stall")
        for r in table.itertuples():
            print(f"  {r.group:17s} {r.requests:4d} requests  TTFT p50 real {r.real_ttft_p50_s * 1e3:7.2f} ms, "
                  f"sim {r.sim_ttft_p50_s * 1e3:7.2f} ms ({r.p50_rel_err:+.1%}); per request, signed median "
                  f"{r.per_request_signed_median:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
