"""Where the generalization suite's step-time error sits: the fit pricing every kept real run's own steps.

    python benchmarks/generalize_breakdown.py --real-root real --profile profile.json [--out breakdown.txt]

Prints, over every run and repeat under --real-root (benchmarks/gpu_generalize.sh's real/ folder): the
step-sum ratio (predicted / real cycle time) of each run and its range across the repeats of one workload and
policy; the same decode shape's median cycle time in every run (engine speed from run to run); and sum
ratios of decode steps by batch size, swap steps by blocks moved (and, in runs that recorded copy_host_s, the
host's share of them), mixed (chunked) steps by prefill context and by decode count, prefill-only steps by
prefill tokens.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.saved_runs import SavedReplays  # noqa: E402
from experiments.step_tables import priced_steps, run_was_overlapped  # noqa: E402
from sim.cost_model.calibrated import CalibratedCostModel  # noqa: E402


def priced_run_steps(real_root: Path, cm) -> pd.DataFrame:
    rows = []
    for meta in sorted(real_root.glob("*/*_real.json")):
        wl = meta.parent.name
        if meta.name != f"{wl}_real.json":
            continue
        for d in [meta.parent] + sorted(p for p in meta.parent.glob("repeat*") if p.is_dir()):
            saved = SavedReplays(d, wl)
            for p in saved.policies:
                run = saved.run(p)
                st, pred = priced_steps(run.steps, cm, run_was_overlapped(run.info))
                rows.append(st.assign(pred=pred, workload=wl, policy=p,
                                      run="repeat0" if d == meta.parent else d.name))
    return pd.concat(rows, ignore_index=True)


def ratio_by(df: pd.DataFrame, by, extra=True) -> pd.DataFrame:
    def agg(x):
        out = dict(steps=len(x), sum_pred_over_real=x.pred.sum() / x.duration_s.sum())
        if extra:
            out.update(real_ms=1e3 * x.duration_s.median(), pred_ms=1e3 * x.pred.median())
        return pd.Series(out)
    return df.groupby(by, observed=True).apply(agg)


def report(a: pd.DataFrame) -> None:
    runs = a.groupby(["workload", "policy", "run"]).apply(lambda x: x.pred.sum() / x.duration_s.sum())
    span = runs.groupby(["workload", "policy"]).agg(lambda v: v.max() - v.min())
    print(f"step-sum ratio of {len(runs)} runs: median {runs.median():.3f}, p10 {runs.quantile(0.1):.3f}, "
          f"p90 {runs.quantile(0.9):.3f}; range across the repeats of one workload and policy: median "
          f"{span.median():.3f}, max {span.max():.3f}")
    print(runs.unstack("run").round(3).to_string(), "\n")
    dec = a[(a.num_prefill_seqs == 0) & (a.num_swap_blocks == 0)]
    same = dec[dec.num_decode_seqs.between(4, 8) & dec.decode_context_sum.between(1000, 4000)]
    g = same.groupby(["workload", "policy", "run"]).agg(n=("duration_s", "size"),
                                                         real_ms=("duration_s", lambda x: 1e3 * x.median()),
                                                         pred_ms=("pred", lambda x: 1e3 * x.median()))
    g = g[g.n >= 30]
    if g.empty:
        print("one decode shape (4-8 sequences, 1k-4k keys): in no run 30 times or more\n")
    else:
        print(f"one decode shape (4-8 sequences, 1k-4k keys) in {len(g)} runs: median real cycle {g.real_ms.min():.3f}"
              f"-{g.real_ms.max():.3f} ms (p10-p90 {g.real_ms.quantile(0.1):.3f}-{g.real_ms.quantile(0.9):.3f}), "
              f"priced {g.pred_ms.min():.3f}-{g.pred_ms.max():.3f} ms\n")
    def by_bins(df, column, bins, label):
        return ratio_by(df.assign(**{label: pd.cut(df[column], bins)}), label).round(3).to_string()

    print("decode steps by batch size:\n", by_bins(dec, "num_decode_seqs", [0, 8, 16, 32, 64, 256], "seqs"), "\n")
    sw = a[a.num_swap_blocks > 0]
    if sw.empty:
        print("swap steps: none in these runs\n")
    if not sw.empty and "num_swap_in_blocks" in sw:
        sw = sw.assign(direction=np.where(sw.num_swap_in_blocks > 0, "in", "out"))
    if not sw.empty:
        print("swap steps by blocks moved:\n", by_bins(sw, "num_swap_blocks", [0, 32, 128, 256, 512, 4096], "blocks"))
        print(ratio_by(sw, ["workload", "policy"]).round(3).to_string(), "\n")
    if not sw.empty and "num_swap_in_blocks" in sw:
        # one direction alone; us_per_block: the step's time less a decode step's (1.7 ms), a block (32 or more)
        one = sw[(sw.num_swap_in_blocks == sw.num_swap_blocks) | (sw.num_swap_out_blocks == sw.num_swap_blocks)]
        big = one[one.num_swap_blocks >= 32]
        per = (1e6 * (big.duration_s - 1.7e-3) / big.num_swap_blocks).groupby(big.direction).quantile([0.25, 0.5, 0.75])
        print("swap steps by direction (one direction alone):\n", ratio_by(one, "direction").round(3).to_string())
        print("  us a block, steps of >= 32 blocks (p25 / p50 / p75):",
              {d: [round(v) for v in per[d]] for d in per.index.get_level_values(0).unique()}, "\n")
    if "copy_host_s" in sw and sw["copy_host_s"].notna().any():
        # runs recorded since copy_host_s: how much of a swap step the host's copy work takes, a block
        sw = sw[sw["copy_host_s"].notna()]
        per = sw.groupby("direction").apply(lambda x: pd.Series(dict(
            steps=len(x), copy_host_share=x.copy_host_s.sum() / x.duration_s.sum(),
            host_us_per_block=1e6 * (x.copy_host_s / x.num_swap_blocks).median(),
            step_us_per_block=1e6 * (x.duration_s / x.num_swap_blocks).median())))
        print("swap steps, the host's copy work (copy_host_s):\n", per.round(3).to_string(), "\n")
    mx = a[(a.num_prefill_seqs > 0) & (a.num_decode_seqs > 0) & (a.num_swap_blocks == 0)]
    print("mixed steps by prefill context (keys):\n",
          by_bins(mx, "prefill_context_sum", [0, 1024, 2048, 4096, 8192, 1 << 30], "ctx"))
    print("mixed steps by longest decode context:\n",
          by_bins(mx, "max_decode_context_tokens", [0, 512, 1024, 2048, 4096, 8192], "dctx"))
    print(ratio_by(mx, ["workload", "policy"]).round(3).to_string(), "\n")
    pf = a[(a.num_prefill_seqs > 0) & (a.num_decode_seqs == 0) & (a.num_swap_blocks == 0)]
    print("prefill-only steps by prefill tokens:\n",
          by_bins(pf, "num_prefill_tokens", [0, 1024, 2048, 4096, 8192, 16384], "tokens"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real-root", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    a = priced_run_steps(Path(args.real_root), CalibratedCostModel.load(args.profile))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pd.option_context("display.width", 200):
        report(a)
    print(buf.getvalue())
    if args.out:
        Path(args.out).write_text(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
