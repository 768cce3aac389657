"""Per-tenant and per-class numbers of a run, service over time and fairness (definitions: docs/metrics.md).

per_tenant(requests)      -> one row per tenant: requests, throughput, service, latency percentiles, SLO attainment
per_class(requests)       -> one row per service class (the pair of TTFT / TPOT targets): attainment and goodput
service_timeline(requests) -> weighted service per tenant per time window, and which tenants were backlogged
service_difference(tl)    -> per window: max - min service among backlogged tenants and their Jain's index
fairness_summary(requests) -> the flat numbers summary.json carries

Service counts tokens as VTC does (Sheng et al., OSDI'24): INPUT_PRICE per prompt token, OUTPUT_PRICE per
output token. In time, a finished request's prompt counts when its first token came, and its outputs
linearly from the first token to its finish (one TPOT apart on average).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

INPUT_PRICE, OUTPUT_PRICE = 1.0, 2.0       # VTC's w_p, w_q (the reference implementation's defaults)
NUM_WINDOWS = 60                           # service_timeline's default resolution over the run
PER_TENANT_COLUMNS = ("tenant", "num_requests", "num_finished", "num_rejected", "request_share",
                      "request_throughput_rps", "output_throughput_tps", "service_tokens", "service_share",
                      "ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99", "e2e_s_p50",
                      "e2e_s_p99", "num_with_slo", "slo_attainment", "goodput_rps")
PER_CLASS_COLUMNS = ("slo_class", "ttft_slo_s", "tpot_slo_s", "num_requests", "num_finished", "num_rejected",
                     "num_rejected_by_policy", "ttft_attainment", "tpot_attainment", "slo_attainment", "goodput_rps",
                     "ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99")


def jain_index(x) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one gets everything."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0 or not (x ** 2).sum() > 0:
        return float("nan")
    return float(x.sum() ** 2 / (len(x) * (x ** 2).sum()))


def _span(requests: pd.DataFrame) -> tuple[float, float]:
    fin = requests["finish_time_s"][requests["status"] == "finished"]
    start = float(requests["arrival_time_s"].min()) if len(requests) else 0.0
    return start, float(fin.max()) if len(fin) else start


def _good(df: pd.DataFrame) -> np.ndarray:
    """Finished requests that met every target they have (no target: good)."""
    met = df["slo_met"].astype("boolean").fillna(True).to_numpy(dtype=bool)
    return (df["status"] == "finished").to_numpy() & met


def service_tokens(df: pd.DataFrame) -> np.ndarray:
    fin = (df["status"] == "finished").to_numpy()
    return np.where(fin, INPUT_PRICE * df["num_prompt_tokens"].to_numpy() + OUTPUT_PRICE
                    * df["num_output_tokens"].to_numpy(), 0.0)


def _num_rejected_by_policy(df: pd.DataFrame) -> int:
    """Rejected requests whose reason is the scheduling policy's ("policy <name>: ...")."""
    reasons = df["reject_reason"][(df["status"] == "rejected").to_numpy()]
    return int(reasons.fillna("").astype(str).str.startswith("policy ").sum())


def _pct(values, p) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, p)) if len(v) else float("nan")


def per_tenant(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per tenant (sorted by name); rates over the run's makespan (first arrival to last finish)."""
    start, end = _span(requests)
    span = end - start
    service = service_tokens(requests)
    total_service = service.sum()
    rows = []
    for tenant, df in requests.groupby("tenant", sort=True):
        fin = df[df["status"] == "finished"]
        has_slo = df["slo_met"].notna().to_numpy()
        s = service[requests.index.get_indexer(df.index)].sum()
        rows.append({
            "tenant": tenant, "num_requests": len(df), "num_finished": len(fin),
            "num_rejected": int((df["status"] == "rejected").sum()), "request_share": len(df) / len(requests),
            "request_throughput_rps": len(fin) / span if span > 0 else float("nan"),
            "output_throughput_tps": fin["num_output_tokens"].sum() / span if span > 0 else float("nan"),
            "service_tokens": float(s), "service_share": float(s / total_service) if total_service else float("nan"),
            **{f"{m}_p{p}": _pct(fin[m], p) for m, ps in (("ttft_s", (50, 90, 99)), ("tpot_s", (50, 99)),
                                                           ("e2e_s", (50, 99))) for p in ps},
            "num_with_slo": int(has_slo.sum()),
            "slo_attainment": (float(df["slo_met"][has_slo].astype(bool).mean()) if has_slo.any()
                               else float("nan")),
            "goodput_rps": _good(df).sum() / span if span > 0 else float("nan"),
        })
    return pd.DataFrame(rows, columns=list(PER_TENANT_COLUMNS))


def class_label(ttft_slo_s: float, tpot_slo_s: float) -> str:
    parts = [f"{name} <= {v:g} s" for name, v in (("TTFT", ttft_slo_s), ("TPOT", tpot_slo_s)) if v == v]
    return ", ".join(parts) or "no target"


def per_class(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per service class: the distinct (ttft_slo_s, tpot_slo_s) pairs (NaN = no target)."""
    start, end = _span(requests)
    span = end - start
    keys = requests[["ttft_slo_s", "tpot_slo_s"]].fillna(-1.0)       # NaN does not group: -1 stands for none
    rows = []
    for (ttft_slo, tpot_slo), df in requests.groupby([keys["ttft_slo_s"], keys["tpot_slo_s"]], sort=True):
        ttft_slo, tpot_slo = (float("nan") if v < 0 else float(v) for v in (ttft_slo, tpot_slo))
        fin = df[df["status"] == "finished"]
        rows.append({
            "slo_class": class_label(ttft_slo, tpot_slo), "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo,
            "num_requests": len(df), "num_finished": len(fin), "num_rejected": int((df["status"] == "rejected").sum()),
            "num_rejected_by_policy": _num_rejected_by_policy(df),
            **{f"{m}_attainment": (float(df[f"{m}_slo_met"].astype(bool).mean()) if df[f"{m}_slo_met"].notna().all()
                                   else float("nan")) for m in ("ttft", "tpot")},
            "slo_attainment": float(df["slo_met"].astype(bool).mean()) if df["slo_met"].notna().all() else float("nan"),
            "goodput_rps": _good(df).sum() / span if span > 0 else float("nan"),
            **{f"{m}_p{p}": _pct(fin[m], p) for m in ("ttft_s", "tpot_s") for p in (50, 99)},
        })
    return pd.DataFrame(rows, columns=list(PER_CLASS_COLUMNS))


def _cumulative_service(df: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """[len(t)] weighted service the finished requests of df had received by each time t."""
    fin = df[df["status"] == "finished"]
    if not len(fin):
        return np.zeros(len(t))
    first = fin["first_token_time_s"].to_numpy()[:, None]
    last = fin["finish_time_s"].to_numpy()[:, None]
    n_out = fin["num_output_tokens"].to_numpy()[:, None].astype(np.float64)
    t = t[None, :]
    started = t > first         # by time t: what came before t (windows are [a, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(last > first, (t - first) / (last - first), 1.0)
    # the first output token comes with the prefill; the other n - 1 linearly up to the finish
    outputs = np.where(started, 1.0 + (n_out - 1.0) * np.clip(frac, 0.0, 1.0), 0.0)
    prompt = np.where(started, fin["num_prompt_tokens"].to_numpy()[:, None], 0.0)
    return (INPUT_PRICE * prompt + OUTPUT_PRICE * outputs).sum(axis=0)


def _covered(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether the union of intervals [starts, ends) covers each [a, b)."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    merged = []
    for lo, hi in zip(s.tolist(), e.tolist()):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    if not merged:
        return np.zeros(len(a), dtype=bool)
    lo, hi = np.asarray(merged).T
    k = np.searchsorted(lo, a, side="right") - 1
    return (k >= 0) & (hi[np.maximum(k, 0)] >= b)


def service_timeline(requests: pd.DataFrame, window_s: float | None = None) -> pd.DataFrame:
    """Long table: window_start_s, window_end_s, tenant, service_tokens (weighted service received in the
    window), service_rate (per second) and backlogged (VTC's sense: the tenant had a request queued, arrived
    and not yet scheduled, through the whole window). window_s None: the run in NUM_WINDOWS windows."""
    start, end = _span(requests)
    if end <= start:
        return pd.DataFrame(columns=["window_start_s", "window_end_s", "tenant", "service_tokens", "service_rate",
                                     "backlogged"])
    if window_s is not None and not window_s > 0:
        raise ValueError(f"window_s must be > 0 seconds, got {window_s}")
    width = (end - start) / NUM_WINDOWS if window_s is None else float(window_s)
    edges = start + width * np.arange(int(np.ceil((end - start) / width - 1e-9)) + 1)
    edges[-1] = np.nextafter(max(edges[-1], end), np.inf)     # the last window holds what came at the end
    a, b = edges[:-1], edges[1:]
    out = []
    for tenant, df in requests.groupby("tenant", sort=True):
        cum = _cumulative_service(df, edges)
        arrival = df["arrival_time_s"].to_numpy()
        # queued from arrival until first scheduled; a rejected request never scheduled counts as not queued
        # (the table keeps no time for when a policy gave up on it)
        queued_until = df["first_scheduled_time_s"].to_numpy()
        leave = np.where(np.isnan(queued_until), arrival, queued_until)
        out.append(pd.DataFrame({"window_start_s": a, "window_end_s": b, "tenant": tenant,
                                 "service_tokens": np.diff(cum), "service_rate": np.diff(cum) / (b - a),
                                 "backlogged": _covered(arrival, leave, a, b)}))
    return pd.concat(out, ignore_index=True)


def service_difference(timeline: pd.DataFrame) -> pd.DataFrame:
    """Per window: num_backlogged, service_diff_rate (max - min service rate among the backlogged tenants,
    NaN with fewer than two) and jain_index among them."""
    rows = []
    for (a, b), w in timeline.groupby(["window_start_s", "window_end_s"], sort=True):
        x = w["service_rate"][w["backlogged"]].to_numpy()
        rows.append({"window_start_s": a, "window_end_s": b, "num_backlogged": len(x),
                     "service_diff_rate": float(x.max() - x.min()) if len(x) > 1 else float("nan"),
                     "jain_index": jain_index(x) if len(x) > 1 else float("nan")})
    return pd.DataFrame(rows, columns=["window_start_s", "window_end_s", "num_backlogged", "service_diff_rate",
                                       "jain_index"])


def fairness_summary(requests: pd.DataFrame) -> dict:
    """Flat numbers (docs/metrics.md): tenants, Jain's index over the whole run and over backlogged windows,
    the largest and mean service difference, SLO attainment over the requests with targets, policy rejections."""
    out: dict = {"num_tenants": int(requests["tenant"].nunique()) if len(requests) else 0}
    out["num_rejected_by_policy"] = _num_rejected_by_policy(requests)
    has = requests["slo_met"].notna()
    if has.any():
        out["num_with_slo"] = int(has.sum())
        out["slo_attainment_targets"] = float(requests["slo_met"][has].astype(bool).mean())
        start, end = _span(requests)
        out["goodput_targets_rps"] = (float(_good(requests[has]).sum() / (end - start)) if end > start
                                      else float("nan"))
    if out["num_tenants"] > 1:
        tenants = per_tenant(requests)
        out["jain_index_overall"] = jain_index(tenants["service_tokens"])
        timeline = service_timeline(requests)
        diff = service_difference(timeline)
        both = diff[diff["num_backlogged"] > 1]
        out["num_backlogged_windows"] = int(len(both))
        # Which tenants queued at all (one alone has no one to be fair to): the printed fairness line says why
        # no window has two.
        out["num_windows"] = int(len(diff))
        out["window_s"] = float((diff["window_end_s"] - diff["window_start_s"]).median()) if len(diff) else float("nan")
        out["num_windows_any_backlogged"] = int((diff["num_backlogged"] > 0).sum())
        counts = timeline[timeline["backlogged"].astype(bool)].groupby("tenant").size().sort_values(ascending=False,
                                                                                                    kind="stable")
        out["backlogged_tenants"] = ", ".join(f"{t}: {int(k)}" for t, k in counts.items())
        out["jain_index"] = float(both["jain_index"].mean()) if len(both) else float("nan")
        out["service_diff_rate_max"] = float(both["service_diff_rate"].max()) if len(both) else float("nan")
        out["service_diff_rate_mean"] = float(both["service_diff_rate"].mean()) if len(both) else float("nan")
    return out
