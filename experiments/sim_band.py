"""The simulator's own band: how far a simulated answer moves when every step price moves by the fit's uncertainty.

A calibrated cost model prices steps to about 1% (its held-out step sums; docs/validation.md). Where requests
queue, a 1% price error can move a latency quantile by several percent, and a decision at an arrival boundary
(which request a sub-millisecond earlier step admits) can move a tail by tens of percent. So a simulation with a
fitted cost model runs twice more, with every step price `1 + price_band` and `1 - price_band` times as long
(`backend.cost_model.price_band`, default 0.01; 0 turns it off), and the run's summary.json keeps both runs'
metrics under `sim_band`:

    {"price_band": 0.01, "scales": [1.01, 0.99], "metrics": [{metric: value, ...}, {...}],
     "relative": {metric: max_i |metrics[i][m] / m - 1|}}              # m: the run's own value

Comparing two runs A and B (servelab-report's differences.csv, `differences`), metric m:

    d        = (B - A) / A                                   the simulated difference
    d_i      = (B_i - A_i) / A_i                             both simulated at the same price scale i
    sim_band = max_i |d_i - d|                               how far the prediction moves with the fit

A difference with |d| <= sim_band, or <= RESOLUTION (0.1%), is "no difference": the simulator does not rank what
its own fit's uncertainty can flip. Checked against the real engine on five workload families the fit never saw
(benchmarks/results/generalize/h100_1205c/, experiments.policy_diff): every simulated ranking with the wrong sign
fell inside this band. Cost models without a band (roofline, constant, price_band 0) give NaN: their rankings
carry no such check.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from experiments.policy_diff import RESOLUTION, metric_value, simulated_difference

# the metrics servelab-report gives a `<metric>_sim_band` column (relative; summary.json keeps every metric)
# (and the plots shade them: plots.sim_band)
BAND_METRICS = ("ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99", "e2e_s_p50", "e2e_s_p90",
                "e2e_s_p99", "normalized_latency_s_p50", "normalized_latency_s_p99", "request_throughput_rps",
                "output_throughput_tps", "goodput_rps", "slo_attainment")
# the metrics differences.csv compares, each pair of runs
DIFF_METRICS = ("ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "e2e_s_p99", "output_throughput_tps",
                "goodput_rps", "slo_attainment")
HIGHER_IS_BETTER = ("request_throughput_rps", "output_throughput_tps", "total_throughput_tps", "goodput_rps",
                    "slo_attainment", "slo_attainment_targets", "goodput_targets_rps")


def _numbers(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def band_section(price_band: float, metrics: dict, perturbed: list[tuple[float, dict]]) -> dict:
    """summary.json's `sim_band` from the run's metrics and [(price scale, that run's metrics), ...]."""
    base = _numbers(metrics)
    scaled = [_numbers(m) for _, m in perturbed]
    relative = {}
    for k, v in base.items():
        moved = [abs(s[k] / v - 1) for s in scaled if k in s and v]
        if len(moved) == len(scaled) and moved:
            relative[k] = float(max(moved))
    return {"price_band": float(price_band), "scales": [float(f) for f, _ in perturbed], "metrics": scaled,
            "relative": relative}


def format_band(section: dict) -> str:
    """One line for the printed summary: how far the main metrics move with every price +- price_band."""
    rel = section.get("relative", {})
    parts = [f"{label} {100 * rel[k]:.1f}%" for k, label in
             (("ttft_s_p50", "TTFT p50"), ("ttft_s_p99", "p99"), ("e2e_s_p50", "E2E p50"), ("e2e_s_p99", "p99"),
              ("output_throughput_tps", "throughput")) if k in rel]
    return (f"every step price +-{100 * section['price_band']:g}% moves " + ", ".join(parts)
            + " (servelab-report's differences.csv ranks two runs only where their difference moves less)")


def band_columns(section) -> dict:
    """The sweep table's `<metric>_sim_band` columns of a run ({} without a band; NaN for a metric it lacks)."""
    if not isinstance(section, dict):
        return {}
    rel = section.get("relative", {})
    return {f"{m}_sim_band": rel.get(m, float("nan")) for m in BAND_METRICS}


def pair_difference(a: dict, b: dict, metric: str, band_a: dict | None, band_b: dict | None) -> dict:
    """One (A, B, metric) row of differences.csv: the two values, d, sim_band and the verdict (module docstring); band_a
    and band_b are the runs' `sim_band` sections (None: no band; bands made at other price scales are not compared)."""
    same = bool(band_a and band_b and band_a.get("scales") == band_b.get("scales"))
    d, sim_band = simulated_difference(a, b, metric, band_a["metrics"] if same else (),
                                       band_b["metrics"] if same else ())
    if not np.isfinite(d):
        verdict, better = "n/a", ""
    elif abs(d) <= RESOLUTION or (np.isfinite(sim_band) and abs(d) <= sim_band):
        verdict, better = "no difference", ""
    else:
        higher_wins = metric in HIGHER_IS_BETTER
        verdict = "B higher" if d > 0 else "B lower"
        better = "B" if (d > 0) == higher_wins else "A"
    return dict(metric=metric, value_a=metric_value(a, metric), value_b=metric_value(b, metric), diff=d,
                sim_band=sim_band, band_known=bool(np.isfinite(sim_band)), verdict=verdict, better=better)


def differences(df: pd.DataFrame, sections: dict, by: str = "policy", x: str | None = "request_rate_rps",
                metrics=DIFF_METRICS, keys: list[str] | None = None) -> pd.DataFrame:
    """Every pair of `by` values at each `x` value (every pair of rows, when x is None or absent) x metric.
    df: the sweep table (experiments.report.collect: run_dir, by, x, the metrics); sections: run_dir -> that
    run's summary `sim_band` (or None). keys: the columns the `by` labels are made of; with two or more, only
    the pairs that differ in exactly one of them (`differs_in`), so that a scheduler x seed sweep compares the
    schedulers on each seed and each scheduler across seeds, never one scheduler on one seed against another on
    another. Rows A/B in the table's order; `better` names the winning side."""
    group_by = [x] if x and x in df else []
    groups = df.groupby(group_by, sort=True, dropna=False) if group_by else [((None,), df)]
    rows = []
    for at, grp in groups:
        grp = grp.drop_duplicates(by)
        for (_, ra), (_, rb) in itertools.combinations(grp.iterrows(), 2):
            differ = [k for k in keys or () if str(ra.get(k)) != str(rb.get(k))]
            if len(keys or ()) > 1 and len(differ) != 1:
                continue
            for m in metrics:
                if m not in df or (pd.isna(ra.get(m)) and pd.isna(rb.get(m))):
                    continue
                row = pair_difference(ra.to_dict(), rb.to_dict(), m, sections.get(ra["run_dir"]),
                                      sections.get(rb["run_dir"]))
                head = {x: at[0]} if group_by else {}
                rows.append({**head, "a": ra[by], "b": rb[by], "differs_in": differ[0] if differ else by, **row,
                             "run_dir_a": ra["run_dir"], "run_dir_b": rb["run_dir"]})
    return pd.DataFrame(rows)


def count_line(diff: pd.DataFrame) -> str:
    """'N comparisons: R ranked, S no difference (inside the simulator's band or 0.1%), U without a band'."""
    if diff.empty:
        return "no pairs to compare"
    ranked = diff["verdict"].str.startswith("B ")
    none = diff["verdict"] == "no difference"
    unknown = ranked & ~diff["band_known"]
    return (f"{len(diff)} comparisons: {int(ranked.sum())} ranked, {int(none.sum())} no difference (inside the "
            f"simulator's own band or {100 * RESOLUTION:g}%)"
            + ("" if not unknown.any() else
               ", none of them with a band (cost model without price_band)" if unknown.sum() == ranked.sum() else
               f", {int(unknown.sum())} of the ranked without a band (cost model without price_band)"))
