"""The engine against itself on two machines: the same suite's real runs, each cell on machine A beside machine B.

    python benchmarks/cross_machine_floor.py --a real_A --b real_B [--out cross_machine.md]

--a and --b are two benchmarks/gpu_generalize.sh real/ folders (each with its repeat1/) of the same workloads
and policies, scored by experiments.real_vs_real (each pair as a simulated run against a real one). Per cell: each
machine's own floor (per-request E2E |relative difference| median between its two runs, as experiments.generalize
reports it), the cross-machine floor (the median of that figure over the four A-run x B-run pairs), the E2E and TTFT
p50 differences of the first runs (B / A - 1) and the ratio of their busy seconds (B / A). A simulator fitted on
one machine cannot be expected closer than the cross-machine floor on the other.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.real_vs_real import real_vs_real  # noqa: E402


def cross_machine_table(a_root: Path, b_root: Path) -> pd.DataFrame:
    """One row per workload and policy both folders hold: experiments.real_vs_real over the four runs (A, A's
    repeat1, B, B's repeat1), its pairs split into each machine's own and the four across."""
    rows = []
    for meta in sorted(a_root.glob("*/*_real.json")):
        wl = meta.parent.name
        if meta.name != f"{wl}_real.json" or not (b_root / wl).is_dir():
            continue
        a_dirs = [str(a_root / wl), str(a_root / wl / "repeat1")]
        b_dirs = [str(b_root / wl), str(b_root / wl / "repeat1")]
        try:
            pairs = real_vs_real(a_dirs + b_dirs, wl)["pairs"]
        except ValueError as e:
            raise SystemExit(f"{wl}: {e}") from None
        for policy in dict.fromkeys(p["policy"] for p in pairs):
            mine = [p for p in pairs if p["policy"] == policy]
            own = lambda dirs: [p for p in mine if p["a"] in dirs and p["b"] in dirs]   # noqa: E731
            cross = [p for p in mine if p["a"] in a_dirs and p["b"] in b_dirs]
            if len(cross) != 4:
                continue
            first = next(p for p in cross if p["a"] == a_dirs[0] and p["b"] == b_dirs[0])
            rows.append(dict(
                workload=wl, policy=policy, floor_a=own(a_dirs)[0]["e2e_s"]["median_rel_err"],
                floor_b=own(b_dirs)[0]["e2e_s"]["median_rel_err"],
                cross_machine=float(np.median([p["e2e_s"]["median_rel_err"] for p in cross])),
                e2e_p50_b_over_a=first["e2e_s"]["quantile_rel_err"]["p50"],
                ttft_p50_b_over_a=first["ttft_s"]["quantile_rel_err"]["p50"],
                step_sum_b_over_a=first["steps"]["busy_s_sim"] / first["steps"]["busy_s_real"]))
    if not rows:
        raise SystemExit(f"no workload with a *_real.json and a repeat1/ in both {a_root} and {b_root}")
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, type=Path, help="machine A's real/ folder")
    ap.add_argument("--b", required=True, type=Path, help="machine B's real/ folder")
    ap.add_argument("--out", type=Path, default=None, help="write the table as markdown here")
    args = ap.parse_args(argv)
    t = cross_machine_table(args.a, args.b)
    pct = {c: (lambda v: f"{100 * v:+.1f}%") for c in ("e2e_p50_b_over_a", "ttft_p50_b_over_a")}
    pct.update({c: (lambda v: f"{100 * v:.1f}%") for c in ("floor_a", "floor_b", "cross_machine")})
    shown = t.assign(**{c: t[c].map(f) for c, f in pct.items()},
                     step_sum_b_over_a=t["step_sum_b_over_a"].map(lambda v: f"{v:.3f}"))
    md = shown.to_markdown(index=False)
    summary = (f"{len(t)} cells: cross-machine floor median {100 * t.cross_machine.median():.1f}%, max "
               f"{100 * t.cross_machine.max():.1f}%; own floors median {100 * t.floor_a.median():.1f}% (A), "
               f"{100 * t.floor_b.median():.1f}% (B); step sums B / A {t.step_sum_b_over_a.min():.3f}-"
               f"{t.step_sum_b_over_a.max():.3f}")
    print(md + "\n\n" + summary)
    if args.out:
        args.out.write_text(md + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
