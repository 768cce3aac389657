"""The engine against itself on two machines: the same suite's real runs, each cell on machine A beside machine B.

    python benchmarks/cross_machine_floor.py --a real_A --b real_B [--out cross_machine.md]

--a and --b are two benchmarks/gpu_generalize.sh real/ folders (each with its repeat1/) of the same workloads
and policies. Per cell: each machine's own floor (per-request E2E |relative difference| median between its two
runs, as experiments.generalize reports it), the cross-machine floor (the median of that figure over the four
A-run x B-run pairs), the E2E and TTFT p50 differences of the first runs (A / B - 1) and the ratio of their step
sums. A simulator fitted on one machine cannot be expected closer than the cross-machine floor on the other.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.saved_runs import SavedReplays  # noqa: E402


def _finished(run) -> pd.DataFrame:
    r = run.requests
    return r[r["status"] == "finished"].set_index("request_id")


def per_request_diff(x: pd.DataFrame, y: pd.DataFrame, column: str = "e2e_s") -> float:
    """Median over the requests both runs finished of |x / y - 1| in column."""
    both = x.index.intersection(y.index)
    if not len(both):
        return float("nan")
    return float(np.median(np.abs(x.loc[both, column] / y.loc[both, column] - 1)))


def cross_machine_table(a_root: Path, b_root: Path) -> pd.DataFrame:
    rows = []
    for meta in sorted(a_root.glob("*/*_real.json")):
        wl = meta.parent.name
        if meta.name != f"{wl}_real.json" or not (b_root / wl).is_dir():
            continue
        a0, a1 = SavedReplays(a_root / wl, wl), SavedReplays(a_root / wl / "repeat1", wl)
        b0, b1 = SavedReplays(b_root / wl, wl), SavedReplays(b_root / wl / "repeat1", wl)
        for policy in a0.saved_policies:
            if policy not in b0.saved_policies:
                continue
            ra, rb = a0.run(policy), b0.run(policy)
            fa, fb = _finished(ra), _finished(rb)
            fa1, fb1 = _finished(a1.run(policy)), _finished(b1.run(policy))
            common = fa.index.intersection(fb.index)
            if not (fa.loc[common, "num_prompt_tokens"] == fb.loc[common, "num_prompt_tokens"]).all():
                raise SystemExit(f"{wl}/{policy}: the two machines ran different requests (num_prompt_tokens "
                                 f"differ); compare runs of the same suite")
            rows.append(dict(
                workload=wl, policy=policy, floor_a=per_request_diff(fa1, fa), floor_b=per_request_diff(fb1, fb),
                cross_machine=float(np.median([per_request_diff(x, y) for x in (fa, fa1) for y in (fb, fb1)])),
                e2e_p50_a_over_b=float(fa["e2e_s"].median() / fb["e2e_s"].median() - 1),
                ttft_p50_a_over_b=float(fa["ttft_s"].median() / fb["ttft_s"].median() - 1),
                step_sum_a_over_b=float(ra.steps["duration_s"].sum() / rb.steps["duration_s"].sum())))
    if not rows:
        raise SystemExit(f"no workload with a *_real.json in both {a_root} and {b_root}")
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, type=Path, help="machine A's real/ folder")
    ap.add_argument("--b", required=True, type=Path, help="machine B's real/ folder")
    ap.add_argument("--out", type=Path, default=None, help="write the table as markdown here")
    args = ap.parse_args(argv)
    t = cross_machine_table(args.a, args.b)
    pct = {c: (lambda v: f"{100 * v:+.1f}%") for c in ("e2e_p50_a_over_b", "ttft_p50_a_over_b")}
    pct.update({c: (lambda v: f"{100 * v:.1f}%") for c in ("floor_a", "floor_b", "cross_machine")})
    shown = t.assign(**{c: t[c].map(f) for c, f in pct.items()},
                     step_sum_a_over_b=t["step_sum_a_over_b"].map(lambda v: f"{v:.3f}"))
    md = shown.to_markdown(index=False)
    summary = (f"{len(t)} cells: cross-machine floor median {100 * t.cross_machine.median():.1f}%, max "
               f"{100 * t.cross_machine.max():.1f}%; own floors median {100 * t.floor_a.median():.1f}% (A), "
               f"{100 * t.floor_b.median():.1f}% (B); step sums A / B {t.step_sum_a_over_b.min():.3f}-"
               f"{t.step_sum_a_over_b.max():.3f}")
    print(md + "\n\n" + summary)
    if args.out:
        args.out.write_text(md + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
