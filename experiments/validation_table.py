"""Validation reports side by side: one row per (report, policy, cost model), the errors that matter.

    python -m experiments.validation_table benchmarks/results/validation_azure_conv.json \\
        benchmarks/results/repeats/*/validation_azure_conv.json [--model calibrated] [--markdown]
    df = validation_table(["a/validation_azure_conv.json", "b/validation_azure_conv.json"])

Reads the JSON reports `python -m experiments.validate` writes (format servelab.validation/v1). Errors
are fractions: throughput, the mean signed E2E error and the percentile errors (`ttft_p50_err`: the
simulated distribution's p50 against the real one's) are signed (sim - real) / real, the others are
median / p90 of per-request |relative error| (NaN where a report predates a field). Repeated runs of one
workload show how far the real engine itself moves between runs (experiments.real_vs_real), which bounds
how close any simulator can get.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from experiments.validate import FORMAT

COLUMNS = ("report", "workload", "policy", "cost_model", "throughput_err", "e2e_median_err", "e2e_p90_err",
           "e2e_mean_signed_err", "ttft_median_err", "tpot_median_err", "step_time_median_err",
           "ttft_p50_err", "ttft_p99_err", "e2e_p50_err", "e2e_p99_err",
           "preemptions_real", "preemptions_sim", "output_tps_real")


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return float("nan")
        d = d[k]
    return d


def read_report(path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"validation report not found: {p} (python -m experiments.validate writes "
                                f"validation_<name>.json into --out-dir)")
    data = json.loads(p.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{p}: format is {data.get('format')!r}, expected {FORMAT!r} "
                         f"(a report of python -m experiments.validate)")
    return data


def error_row(s: dict) -> dict:
    """The table's error columns of one comparison (a report's `sims.<cost model>` entry, or a pair of
    experiments.real_vs_real, where "sim" is the second run)."""
    return dict(
        throughput_err=_get(s, "throughput", "rel_err"),
        e2e_median_err=_get(s, "e2e_s", "median_rel_err"), e2e_p90_err=_get(s, "e2e_s", "p90_rel_err"),
        e2e_mean_signed_err=_get(s, "e2e_s", "mean_signed_rel_err"),
        ttft_median_err=_get(s, "ttft_s", "median_rel_err"), tpot_median_err=_get(s, "tpot_s", "median_rel_err"),
        step_time_median_err=_get(s, "step_time", "median_rel_err"),
        ttft_p50_err=_get(s, "ttft_s", "quantile_rel_err", "p50"),
        ttft_p99_err=_get(s, "ttft_s", "quantile_rel_err", "p99"),
        e2e_p50_err=_get(s, "e2e_s", "quantile_rel_err", "p50"),
        e2e_p99_err=_get(s, "e2e_s", "quantile_rel_err", "p99"),
        preemptions_real=_get(s, "preemptions", "real"), preemptions_sim=_get(s, "preemptions", "sim"),
        output_tps_real=_get(s, "throughput", "output_tps_real"))


def validation_table(paths, cost_models=None) -> pd.DataFrame:
    """One row per (report, policy, cost model) of the given reports; cost_models: keep only these names."""
    rows = []
    for path in paths:
        rep = read_report(path)
        for policy, entry in rep["policies"].items():
            for model, s in entry.get("sims", {}).items():
                if not cost_models or model in cost_models:
                    rows.append(dict(report=str(path), workload=rep.get("name"), policy=policy, cost_model=model,
                                     **error_row(s)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def to_markdown(df: pd.DataFrame) -> str:
    """A markdown table, errors in percent (signed ones with a sign)."""
    head = ["report", "policy", "cost model", "throughput", "E2E median / p90 (signed mean)", "TTFT median",
            "TPOT median", "step time median", "TTFT p50 / p99 of the distribution", "preemptions real / sim"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in df.itertuples(index=False):
        e2e = f"{100 * r.e2e_median_err:.1f}% / {100 * r.e2e_p90_err:.1f}% ({100 * r.e2e_mean_signed_err:+.1f}%)"
        ttft_q = f"{100 * r.ttft_p50_err:+.1f}% / {100 * r.ttft_p99_err:+.1f}%"
        lines.append(f"| {r.report} | {r.policy} | {r.cost_model} | {100 * r.throughput_err:+.1f}% | {e2e} | "
                     f"{100 * r.ttft_median_err:.1f}% | {100 * r.tpot_median_err:.1f}% | "
                     f"{100 * r.step_time_median_err:.1f}% | {ttft_q} | "
                     f"{r.preemptions_real:g} / {r.preemptions_sim:g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.validation_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="validation_<name>.json files")
    ap.add_argument("--model", action="append", default=None, metavar="NAME",
                    help="keep only this cost model (repeatable; default: all)")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table instead of the DataFrame")
    args = ap.parse_args(argv)
    df = validation_table(args.reports, args.model)
    if args.markdown:
        print(to_markdown(df))
    else:
        with pd.option_context("display.width", 200, "display.max_columns", None, "display.precision", 4):
            print(df.drop(columns=["report"]).assign(report=[Path(p).parent.name for p in df["report"]]))
    return 0


if __name__ == "__main__":
    from experiments.user_errors import run_main
    sys.exit(run_main(main))
