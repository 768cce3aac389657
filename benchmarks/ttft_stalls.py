"""How much of a cell's TTFT error sits with the requests whose prefill met a host launch stall
(experiments/launch_stalls.py; experiments.generalize scores every cell's TTFT p50 without them).

    python benchmarks/ttft_stalls.py --real-root real --profile profile.json --cell prefill_heavy:vllm [--cell ...]

For each WORKLOAD:POLICY kept by benchmarks/gpu_generalize.sh (an overlapped run with its decisions recorded), the
run is simulated again with the fit (experiments.generalize.simulate_saved) and its requests split in two: those
whose prefill step, or the step after it that returns their first token, is near a launch stall
(experiments.launch_stalls.near_launch_stalls: the host's seconds before a launch well beyond the fit's), and the
rest. A stall is the host's (a pause of the engine's process), not a step price, so the fit cannot follow it: a
TTFT bias among the first group and none among the second puts the cell's TTFT miss on the host. Prints, per
group, the real and simulated TTFT p50, their relative error and the median per-request signed error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real-root", required=True, type=Path, help="gpu_generalize.sh's real/ folder")
    ap.add_argument("--profile", required=True, help="the calibrated fit (experiments.calibrate JSON)")
    ap.add_argument("--cell", action="append", required=True, metavar="WORKLOAD:POLICY")
    ap.add_argument("--traces-dir", default="../shared/traces", help="where the run's traces are here")
    args = ap.parse_args(argv)
    from experiments.generalize import saved_argv, simulate_saved
    from experiments.launch_stalls import run_ttft_by_stall
    from sim.cost_model.calibrated import CalibratedCostModel

    cm = CalibratedCostModel.load(args.profile)
    for cell in args.cell:
        wl, _, policy = cell.partition(":")
        wl_dir = args.real_root / wl
        _, saved, sim = simulate_saved(wl_dir, wl, policy, saved_argv(wl_dir, wl, args.traces_dir), cm)
        decisions = pd.read_parquet(wl_dir / f"{wl}_{policy}_decisions.parquet")
        table, near, total = run_ttft_by_stall(saved.run(policy), sim, cm, decisions)
        print(f"{cell}: {near} of {total} steps near a launch stall")
        for r in table.itertuples():
            print(f"  {r.group:17s} {r.requests:4d} requests  TTFT p50 real {r.real_ttft_p50_s * 1e3:7.2f} ms, "
                  f"sim {r.sim_ttft_p50_s * 1e3:7.2f} ms ({r.p50_rel_err:+.1%}); per request, signed median "
                  f"{r.per_request_signed_median:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
