"""Policy-difference fidelity: does the simulator rank two policies as the real engine does, and by as much?

    rows = policy_differences({"fcfs": [real_summary_r0, real_summary_r1], "vllm": [...]},
                              {"fcfs": sim_summary, "vllm": sim_summary})

For a pair (A, B) and a summary metric m (experiments.validate.run_summary keys):

    real difference   d     = (mean_r B_r - mean_r A_r) / mean_r A_r        over the real repeats r
    noise band        band  = max over repeat pairs (r, s) of |(B_s - A_r) / A_r - d|
                              (how far one real comparison of one run each lands from the mean one)
    simulated         d_sim = (B_sim - A_sim) / A_sim
    simulator's band  sim_band = max over perturbed simulations i of |d_sim_i - d_sim|
                              (each i simulates both policies again with every step price scaled by
                              the same factor, e.g. 1 +- the fit's 1% uncertainty: how far the
                              prediction moves with the fit; NaN without perturbed simulations)

Verdicts: the real difference is `significant` when |d| > 2 band (and > RESOLUTION, 0.1%). A simulated
difference with |d_sim| <= band (or <= RESOLUTION), or |d_sim| <= sim_band, is reported as "no
difference": the simulator does not rank what the engine does not reproduce, nor what its own fit's
uncertainty can flip (a decision at an arrival boundary that a sub-millisecond drift turns: the real
engine repeats its own timing, so the real band cannot show that; `sim_within_own_band` says which of the
two applied); otherwise its sign is right when it has d's sign, and its size when |d_sim - d| <= |d| / 3.
`verdict` is one of: "agree" (sign and size), "sign only", "wrong sign", "sim: no difference", and, where
the real difference is not significant, "real: no difference" (then a simulated "no difference" is the
right answer: `ok` is True for it). With a single real run the band is 0 (unknown); `band_known` says so.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

DIFF_METRICS = ("ttft_s_p50", "ttft_s_p90", "e2e_s_p50", "e2e_s_p90", "output_throughput_tps")
SIZE_TOLERANCE = 1 / 3
# Relative differences at or below this are no ranking on either side, whatever the bands: two real runs can give
# the very same throughput (its makespan ends at the last arrival's tail), a band of 0 that would make a 0.001%
# difference "significant".
RESOLUTION = 1e-3


def metric_value(summary: dict, metric: str) -> float:
    """summary[metric] as a float; NaN where it is missing or None."""
    v = summary.get(metric)
    return float("nan") if v is None else float(v)


def _rel_diff(a: dict | None, b: dict | None, metric: str) -> float:
    if a is None or b is None:
        return float("nan")
    va, vb = metric_value(a, metric), metric_value(b, metric)
    return (vb - va) / va if va else float("nan")


def simulated_difference(sim_a: dict | None, sim_b: dict | None, metric: str, perturbed_a=(),
                         perturbed_b=()) -> tuple[float, float]:
    """(d_sim, sim_band) of the module docstring: the simulated relative difference of metric, and how far it moves
    when both sides are simulated with the same perturbed cost model (perturbed_a[i], perturbed_b[i]; NaN without
    them). experiments/sim_band.py ranks a sweep's runs with it too."""
    d_sim = _rel_diff(sim_a, sim_b, metric)
    moved = [abs(_rel_diff(pa, pb, metric) - d_sim) for pa, pb in zip(perturbed_a, perturbed_b)]
    return d_sim, (float(max(moved)) if moved and np.isfinite(moved).all() else float("nan"))


def pair_difference(real_a: list[dict], real_b: list[dict], sim_a: dict | None, sim_b: dict | None,
                    metric: str, perturbed_a: list[dict] = (), perturbed_b: list[dict] = ()) -> dict:
    """One (A, B, metric) row; see the module docstring. perturbed_a[i] and perturbed_b[i]: the two policies
    simulated with the same perturbed cost model (sim_band)."""
    a = np.array([metric_value(s, metric) for s in real_a])
    b = np.array([metric_value(s, metric) for s in real_b])
    mean_a, mean_b = float(np.nanmean(a)), float(np.nanmean(b))
    d = (mean_b - mean_a) / mean_a if mean_a else float("nan")
    cross = [(bs - ar) / ar for ar, bs in itertools.product(a, b) if ar]
    band = float(max(abs(x - d) for x in cross)) if cross else float("nan")
    d_sim, sim_band = simulated_difference(sim_a, sim_b, metric, perturbed_a, perturbed_b)
    significant = bool(abs(d) > max(2 * band, RESOLUTION)) if np.isfinite(d) and np.isfinite(band) else False
    own = bool(abs(d_sim) <= sim_band) if np.isfinite(d_sim) and np.isfinite(sim_band) else False
    sim_none = own or (bool(abs(d_sim) <= max(band, RESOLUTION)) if np.isfinite(d_sim) and np.isfinite(band)
                       else False)
    sign_ok = bool(np.sign(d_sim) == np.sign(d)) if np.isfinite(d_sim) and not sim_none else False
    size_ok = bool(abs(d_sim - d) <= SIZE_TOLERANCE * abs(d)) if np.isfinite(d_sim) and not sim_none else False
    if not np.isfinite(d_sim):
        verdict = "no simulation"
    elif not significant:
        verdict = "real: no difference"
    elif sim_none:
        verdict = "sim: no difference"
    elif sign_ok and size_ok:
        verdict = "agree"
    elif sign_ok:
        verdict = "sign only"
    else:
        verdict = "wrong sign"
    ok = verdict == "agree" or (verdict == "real: no difference" and (sim_none or size_ok))
    return dict(metric=metric, real_a=mean_a, real_b=mean_b, real_diff=d, noise_band=band,
                band_known=len(a) > 1 or len(b) > 1, real_significant=significant, sim_diff=d_sim,
                sim_band=sim_band, sim_within_own_band=own, sim_no_difference=sim_none, sign_agrees=sign_ok,
                size_agrees=size_ok, verdict=verdict, ok=ok,
                num_real_a=int(len(a)), num_real_b=int(len(b)))


def policy_differences(real: dict[str, list[dict]], sim: dict[str, dict], metrics=DIFF_METRICS,
                       perturbed: dict[str, list[dict]] | None = None) -> pd.DataFrame:
    """Every pair of policies in `real` (in the given order) x metric; `sim` maps policy -> simulated summary,
    `perturbed` policy -> its summaries under each perturbed cost model, in the same order for every policy."""
    perturbed = perturbed or {}
    rows = []
    for pa, pb in itertools.combinations(list(real), 2):
        for m in metrics:
            rows.append(dict(policy_a=pa, policy_b=pb,
                             **pair_difference(real[pa], real[pb], sim.get(pa), sim.get(pb), m,
                                               perturbed.get(pa, ()), perturbed.get(pb, ()))))
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame) -> str:
    head = ["workload", "A", "B", "metric", "real (B-A)/A", "noise band", "sim (B-A)/A", "sim band", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in df.itertuples(index=False):
        lines.append(f"| {getattr(r, 'workload', '')} | {r.policy_a} | {r.policy_b} | {r.metric} | "
                     f"{100 * r.real_diff:+.1f}% | {100 * r.noise_band:.1f}% | {100 * r.sim_diff:+.1f}% | "
                     f"{_band(getattr(r, 'sim_band', float('nan')))} | {r.verdict} |")
    return "\n".join(lines)


def _band(x: float) -> str:
    return f"{100 * x:.1f}%" if np.isfinite(x) else "n/a"
