"""Run summaries from the recorder's tables (definitions: docs/metrics.md).

summary(requests_df, steps_df, slo) -> flat dict of floats/ints, one key per
metric, e.g. "ttft_s_p99". Latency statistics cover FINISHED requests;
percentiles are numpy's default (linear interpolation), as in vLLM's serving
benchmark. per_replica(requests_df, steps_df, num_replicas) -> one row per
replica (requests served, busy fraction, KV use, prefix hits). Tenants, service
classes and fairness: experiments.tenant_metrics (its flat numbers join the summary).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
# The busiest replica carrying more than this times the mean replica's tokens is "badly imbalanced".
IMBALANCE_WARN_RATIO = 1.5
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


def _kv_usage(steps_df: pd.DataFrame) -> np.ndarray:
    """kv_blocks_used / (used + free) per step; NaN where a step reports no blocks."""
    total = (steps_df["kv_blocks_used"] + steps_df["kv_blocks_free"]).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, steps_df["kv_blocks_used"].to_numpy() / total, np.nan)


def _nan_stat(fn, values: np.ndarray) -> float:
    return float(fn(values)) if np.isfinite(values).any() else float("nan")


def _makespan_s(requests_df: pd.DataFrame) -> float:
    """First arrival to last finish (seconds); NaN when nothing finished."""
    fin = requests_df["finish_time_s"][requests_df["status"] == "finished"]
    return float(fin.max() - requests_df["arrival_time_s"].min()) if len(fin) else float("nan")


PER_REPLICA_COLUMNS = ("replica", "num_requests", "num_finished", "request_share", "num_tokens", "busy_time_s",
                       "busy_fraction", "kv_usage_mean", "kv_usage_max", "prefix_cache_hit_rate", "ttft_s_p50",
                       "ttft_s_p99")


def per_replica(requests_df: pd.DataFrame, steps_df: pd.DataFrame | None = None,
                num_replicas: int | None = None) -> pd.DataFrame:
    """One row per replica 0..n-1 (docs/metrics.md), replicas that served nothing included.

    n = num_replicas, or one past the highest replica in either table when None (an idle
    replica past the last busy one is then missing: pass num_replicas). busy_fraction is the
    replica's summed step durations over the run's makespan (first arrival to last finish).
    """
    seen = [int(df["replica"].max()) + 1 for df in (requests_df, steps_df) if df is not None and len(df)]
    n = max([int(num_replicas or 0), *seen, 1])
    idx = pd.RangeIndex(n, name="replica")
    by = requests_df.groupby("replica")
    fin = requests_df[requests_df["status"] == "finished"]
    fin_by = fin.groupby("replica")
    num_requests = by.size().reindex(idx, fill_value=0)
    prompt = fin_by["num_prompt_tokens"].sum().reindex(idx, fill_value=0)
    cached = fin_by["num_cached_tokens"].sum().reindex(idx, fill_value=0)
    out = pd.DataFrame({
        "num_requests": num_requests,
        "num_finished": fin_by.size().reindex(idx, fill_value=0),
        "request_share": num_requests / max(int(num_requests.sum()), 1),
        "num_tokens": (requests_df["num_prompt_tokens"] + requests_df["num_output_tokens"])
        .groupby(requests_df["replica"]).sum().reindex(idx, fill_value=0),
        "prefix_cache_hit_rate": (cached / prompt.where(prompt > 0)),
        "ttft_s_p50": fin_by["ttft_s"].median().reindex(idx),
        "ttft_s_p99": fin_by["ttft_s"].quantile(0.99).reindex(idx),
    }, index=idx)
    if steps_df is not None and len(steps_df):
        sb = steps_df.assign(_usage=_kv_usage(steps_df)).groupby("replica")
        busy = sb["duration_s"].sum().reindex(idx, fill_value=0.0)
        out["kv_usage_mean"] = sb["_usage"].mean().reindex(idx)
        out["kv_usage_max"] = sb["_usage"].max().reindex(idx)
    else:
        busy = pd.Series(np.nan, index=idx)
        out["kv_usage_mean"] = out["kv_usage_max"] = np.nan
    makespan = _makespan_s(requests_df) if len(requests_df) else float("nan")
    out["busy_time_s"] = busy
    out["busy_fraction"] = busy / makespan if makespan > 0 else np.nan
    return out.reset_index()[list(PER_REPLICA_COLUMNS)]


def replica_balance(table: pd.DataFrame) -> dict:
    """Flat imbalance numbers of a per_replica table (docs/metrics.md)."""
    tokens = table["num_tokens"].to_numpy(dtype=np.float64)
    requests = table["num_requests"].to_numpy(dtype=np.float64)
    busy = table["busy_fraction"].to_numpy(dtype=np.float64)
    return {
        "num_idle_replicas": int((requests == 0).sum()),
        "replica_requests_max_over_mean": float(requests.max() / requests.mean()) if requests.sum() else float("nan"),
        "replica_tokens_max_over_mean": float(tokens.max() / tokens.mean()) if tokens.sum() else float("nan"),
        "replica_busy_fraction_min": _nan_stat(np.nanmin, busy),
        "replica_busy_fraction_max": _nan_stat(np.nanmax, busy),
    }


def summary(requests_df: pd.DataFrame, steps_df: pd.DataFrame | None = None, slo=None,
            token_times_df: pd.DataFrame | None = None, num_replicas: int | None = None) -> dict:
    """Throughput, goodput, latency percentiles, preemptions and cache hits of one run; with more
    than one replica (num_replicas, or seen in the tables) also replica_balance's numbers."""
    fin = requests_df[requests_df["status"] == "finished"]
    out: dict = {"num_requests": int(len(requests_df)), "num_finished": int(len(fin)),
                 "num_rejected": int((requests_df["status"] == "rejected").sum())}
    makespan = _makespan_s(requests_df)
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
        usage = _kv_usage(steps_df)
        out["kv_usage_mean"] = _nan_stat(np.nanmean, usage)
        out["kv_usage_max"] = _nan_stat(np.nanmax, usage)
        out["busy_time_s"] = float(steps_df["duration_s"].sum())
    if len(requests_df) and "replica" in requests_df:
        table = per_replica(requests_df, steps_df, num_replicas)
        if len(table) > 1:
            out.update(replica_balance(table))
    if len(requests_df) and "tenant" in requests_df and "slo_met" in requests_df:
        from experiments.tenant_metrics import fairness_summary
        out.update(fairness_summary(requests_df))
    return out


def summaries_frame(runs: dict[str, tuple], slo=None) -> pd.DataFrame:
    """One summary row per run: runs maps a label to (requests_df, steps_df)."""
    rows = []
    for label, (req, steps) in runs.items():
        rows.append({"run": label, **summary(req, steps, slo)})
    return pd.DataFrame(rows)
