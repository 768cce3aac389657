"""The engine against itself: how far apart two real replays of one workload are (the floor of any validation).

    python -m experiments.real_vs_real benchmarks/results/real benchmarks/results/repeats/b/real \\
        benchmarks/results/repeats/c/real --name azure_conv [--out real_vs_real_azure_conv.json]

Each argument is a `--real-dir` a validation kept (experiments.saved_runs). For every pair of them and
every policy both hold, the second run is scored against the first exactly as a simulated run is scored
against the real one (experiments.validate.compare): per-request median / p90 of |B - A| / A for TTFT,
TPOT and E2E, the distributions' percentile errors, throughput and preemptions. A simulator whose error
against one real run is at this level is as close as a second run of the same engine would be.

`spread` gives, per policy that every run holds, each summary metric across the runs (min, max and
(max - min) / mean): a difference between two policies smaller than that spread is one the real engine
does not reproduce from run to run.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import shlex
import sys

import pandas as pd

from experiments.results import write_json
from experiments.saved_runs import SavedReplays
from experiments.validate import compare, run_summary
from experiments.validation_table import error_row


def real_vs_real(real_dirs, name: str, policies=None) -> dict:
    """{"pairs": [{"a", "b", "policy", <compare() of b against a>}]} over every pair of real_dirs."""
    if len(real_dirs) < 2:
        raise ValueError(f"give at least two real-run directories to compare, got {len(real_dirs)}")
    saved = [SavedReplays(d, name) for d in real_dirs]
    pairs = []
    for a, b in itertools.combinations(saved, 2):
        common = [p for p in a.policies if p in b.policies and (policies is None or p in policies)]
        if not common:
            raise ValueError(f"{a.real_dir} and {b.real_dir} share no policy run named {name!r}"
                             + (f" among {sorted(policies)}" if policies else ""))
        for policy in common:
            ra, rb = a.run(policy), b.run(policy)
            if set(ra.requests["request_id"]) != set(rb.requests["request_id"]):
                raise ValueError(f"{policy}: {a.real_dir} and {b.real_dir} replayed different requests; "
                                 f"compare runs of the same workload")
            entry = compare(ra, rb)
            entry.pop("summary_sim", None)
            pairs.append({"a": str(a.real_dir), "b": str(b.real_dir), "policy": policy, **entry})
    return {"format": "servelab.real_vs_real/v1", "name": name, "pairs": pairs,
            "spread": metric_spread(saved, policies)}


SPREAD_METRICS = ("output_throughput_tps", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_p50", "tpot_s_p90",
                  "e2e_s_p50", "e2e_s_p90", "e2e_s_p99", "num_preemptions")


def metric_spread(saved: list[SavedReplays], policies=None) -> dict:
    """{policy: {metric: {"min", "max", "rel_range"}}} over the runs that all hold the policy."""
    out = {}
    for policy in saved[0].policies:
        if (policies is not None and policy not in policies) or not all(policy in s.policies for s in saved):
            continue
        summaries = [run_summary(s.run(policy)) for s in saved]
        out[policy] = {}
        for m in SPREAD_METRICS:
            vals = [x[m] for x in summaries]
            if any(v is None for v in vals):
                continue
            mean = sum(vals) / len(vals)
            out[policy][m] = {"min": min(vals), "max": max(vals),
                              "rel_range": (max(vals) - min(vals)) / mean if mean else 0.0}
    return out


def table(result: dict) -> pd.DataFrame:
    """One row per pair and policy; `*_real` columns are run a's, `*_sim` run b's (validation_table.error_row)."""
    return pd.DataFrame([dict(policy=p["policy"], a=p["a"], b=p["b"], **error_row(p)) for p in result["pairs"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.real_vs_real", description=__doc__.split("\n\n")[0])
    ap.add_argument("real_dirs", nargs="+", help="directories a validation's --real-dir kept")
    ap.add_argument("--name", required=True, help="the validation's --name (e.g. azure_conv)")
    ap.add_argument("--policies", default=None, help="comma-separated (default: every policy both runs hold)")
    ap.add_argument("--out", default=None, help="write the full comparison as JSON")
    args = ap.parse_args(argv)
    result = real_vs_real(args.real_dirs, args.name, args.policies.split(",") if args.policies else None)
    args_text = " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    result.update(command=f"python -m experiments.real_vs_real {args_text}",
                  date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.precision", 4):
        print(table(result))
        print(f"spread of each summary metric over the {len(args.real_dirs)} runs ((max - min) / mean):")
        print(pd.DataFrame({p: {m: v["rel_range"] for m, v in ms.items()} for p, ms in result["spread"].items()}))
    if args.out:
        write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from experiments.user_errors import run_main
    sys.exit(run_main(main))
