"""Run summaries from the recorder's tables (definitions: docs/metrics.md).

summary(requests_df, steps_df, slo) -> flat dict of floats/ints, one key per
metric, e.g. "ttft_s_p99". Latency statistics cover FINISHED requests;
percentiles are numpy's default (linear interpolation), as in vLLM's serving
benchmark.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "normalized_latency_s", "queueing_delay_s")


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput; None = no limit on that metric.

    A finished request is good when ttft_s <= ttft_s, tpot_s <= tpot_s and
    e2e_s <= e2e_s for every limit given (vLLM's --goodput; a 1-token output has
    TPOT 0 there).
    """
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self):
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SLO.{name} must be > 0 seconds or None, got {v}")

    @property
    def is_empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None


def _as_slo(slo) -> SLO | None:
    if slo is None or isinstance(slo, SLO):
        return slo
    if isinstance(slo, dict):
        unknown = set(slo) - {"ttft_s", "tpot_s", "e2e_s"}
        if unknown:
            raise ValueError(f"unknown SLO key(s) {sorted(unknown)}; allowed: ttft_s, tpot_s, e2e_s")
        return SLO(**slo)
    raise TypeError(f"slo must be an SLO, a dict or None, got {type(slo).__name__}")


def _stats(out: dict, name: str, values: np.ndarray) -> None:
    values = values[~np.isnan(values)]
    out[f"{name}_mean"] = float(values.mean()) if len(values) else float("nan")
    for p in PERCENTILES:
        out[f"{name}_p{p}"] = float(np.percentile(values, p)) if len(values) else float("nan")


def good_mask(finished: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Which finished requests meet every limit of `slo`."""
    ok = np.ones(len(finished), dtype=bool)
    if slo.ttft_s is not None:
        ok &= finished["ttft_s"].to_numpy() <= slo.ttft_s
    if slo.tpot_s is not None:
        tpot = np.nan_to_num(finished["tpot_s"].to_numpy(), nan=0.0)   # 1-token outputs count as TPOT 0
        ok &= tpot <= slo.tpot_s
    if slo.e2e_s is not None:
        ok &= finished["e2e_s"].to_numpy() <= slo.e2e_s
    return ok


def itl_values(token_times_df: pd.DataFrame) -> np.ndarray:
    """Inter-token latencies: gaps between consecutive tokens of the same request."""
    if token_times_df is None or len(token_times_df) == 0:
        return np.zeros(0)
    df = token_times_df.sort_values(["request_id", "token_index"], kind="stable")
    t = df["time_s"].to_numpy()
    same = df["request_id"].to_numpy()[1:] == df["request_id"].to_numpy()[:-1]
    return np.diff(t)[same]


def summary(requests_df: pd.DataFrame, steps_df: pd.DataFrame | None = None, slo=None,
            token_times_df: pd.DataFrame | None = None) -> dict:
    """Throughput, goodput, latency percentiles, preemptions and cache hits of one run."""
    fin = requests_df[requests_df["status"] == "finished"]
    out: dict = {"num_requests": int(len(requests_df)), "num_finished": int(len(fin)),
                 "num_rejected": int((requests_df["status"] == "rejected").sum())}
    # makespan: first arrival to last finish (seconds)
    if len(fin):
        makespan = float(fin["finish_time_s"].max() - requests_df["arrival_time_s"].min())
    else:
        makespan = float("nan")
    out["makespan_s"] = makespan
    out_tok = int(fin["num_output_tokens"].sum())
    in_tok = int(fin["num_prompt_tokens"].sum())
    out["num_output_tokens"] = out_tok
    out["num_prompt_tokens"] = in_tok
    ok_span = makespan > 0
    out["request_throughput_rps"] = len(fin) / makespan if ok_span else float("nan")
    out["output_throughput_tps"] = out_tok / makespan if ok_span else float("nan")
    out["total_throughput_tps"] = (out_tok + in_tok) / makespan if ok_span else float("nan")

    slo = _as_slo(slo)
    if slo is not None and not slo.is_empty:
        good = good_mask(fin, slo)
        out["num_good"] = int(good.sum())
        out["goodput_rps"] = int(good.sum()) / makespan if ok_span else float("nan")
        out["slo_attainment"] = float(good.sum() / len(requests_df)) if len(requests_df) else float("nan")

    if len(fin):
        norm = fin["e2e_s"].to_numpy() / fin["num_output_tokens"].to_numpy()
    else:
        norm = np.zeros(0)
    for name in LATENCY_METRICS:
        vals = norm if name == "normalized_latency_s" else fin[name].to_numpy(dtype=np.float64)
        _stats(out, name, np.asarray(vals, dtype=np.float64))
    if token_times_df is not None:
        _stats(out, "itl_s", itl_values(token_times_df))

    out["num_preemptions"] = int(requests_df["num_preemptions"].sum())
    out["num_preempted_requests"] = int((requests_df["num_preemptions"] > 0).sum())
    out["num_swaps"] = int(requests_df["num_swaps"].sum())
    out["prefix_cache_hit_rate"] = (float(fin["num_cached_tokens"].sum() / in_tok) if in_tok else float("nan"))

    if steps_df is not None and len(steps_df):
        out["num_steps"] = int(len(steps_df))
        out["mean_batch_size"] = float(steps_df["batch_size"].mean())
        total = (steps_df["kv_blocks_used"] + steps_df["kv_blocks_free"]).to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            usage = np.where(total > 0, steps_df["kv_blocks_used"].to_numpy() / total, np.nan)
        out["kv_usage_mean"] = float(np.nanmean(usage)) if np.isfinite(usage).any() else float("nan")
        out["kv_usage_max"] = float(np.nanmax(usage)) if np.isfinite(usage).any() else float("nan")
        out["busy_time_s"] = float(steps_df["duration_s"].sum())
    return out


def summaries_frame(runs: dict[str, tuple], slo=None) -> pd.DataFrame:
    """One summary row per run: runs maps a label to (requests_df, steps_df)."""
    rows = []
    for label, (req, steps) in runs.items():
        rows.append({"run": label, **summary(req, steps, slo)})
    return pd.DataFrame(rows)
