"""Plots of run tables (matplotlib, Agg backend: files only, no display).

Each function takes DataFrames and an output path, writes a PNG and returns the path.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

_LABELS = {"ttft_s": "TTFT (s)", "tpot_s": "TPOT (s)", "e2e_s": "E2E latency (s)", "itl_s": "ITL (s)",
           "queueing_delay_s": "queueing delay (s)", "normalized_latency_s": "normalized latency (s/token)"}


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def latency_cdf(runs: dict[str, pd.DataFrame], path, metric: str = "ttft_s", log_x: bool = False) -> Path:
    """Empirical CDF of one per-request latency column, one line per run (label -> requests table).

    metric may be any requests-table column or 'normalized_latency_s' (e2e per output token).
    Only finished requests are plotted.
    """
    if not runs:
        raise ValueError("latency_cdf needs at least one run")
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, df in runs.items():
        fin = df[df["status"] == "finished"] if "status" in df else df
        if metric == "normalized_latency_s":
            vals = fin["e2e_s"].to_numpy() / fin["num_output_tokens"].to_numpy()
        elif metric in fin:
            vals = fin[metric].to_numpy(dtype=float)
        else:
            raise ValueError(f"unknown metric {metric!r}; use a requests-table column or 'normalized_latency_s'")
        vals = np.sort(vals[~np.isnan(vals)])
        if len(vals):
            ax.step(vals, np.arange(1, len(vals) + 1) / len(vals), where="post", label=f"{label} (n={len(vals)})")
    ax.set_xlabel(_LABELS.get(metric, metric))
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    if log_x:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def throughput_latency(summaries: pd.DataFrame, path, metric: str = "ttft_s", x: str = "request_rate_rps",
                       by: str = "policy", percentiles=(50, 99)) -> Path:
    """Latency vs load: one colour per `by` value, solid p50 and dashed p99.

    summaries: one row per run with columns x, by and f"{metric}_p{p}" (as
    metrics.summary gives, plus the run's x and by values).
    """
    needed = [x, by] + [f"{metric}_p{p}" for p in percentiles]
    missing = [c for c in needed if c not in summaries]
    if missing:
        raise ValueError(f"throughput_latency: summaries lack column(s) {missing}; has {list(summaries.columns)}")
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = ["-", "--", ":", "-."]
    for i, (key, grp) in enumerate(summaries.groupby(by, sort=True)):
        grp = grp.sort_values(x)
        color = f"C{i % 10}"
        for j, p in enumerate(percentiles):
            ax.plot(grp[x], grp[f"{metric}_p{p}"], styles[j % len(styles)], marker="o", ms=3, color=color,
                    label=f"{key} p{p}")
            sim_band(ax, grp, x, f"{metric}_p{p}", color)
    ax.set_xlabel(x)
    ax.set_ylabel(_LABELS.get(metric, metric))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def sim_band(ax, grp: pd.DataFrame, x: str, col: str, color: str) -> None:
    """Shade col +- its simulator's band (`<col>_sim_band`, the largest relative move with every step price +- the
    fit's uncertainty: experiments/sim_band.py) around the line; nothing for runs without one."""
    band = f"{col}_sim_band"
    if band not in grp or not grp[band].notna().any():
        return
    y, b = grp[col].to_numpy(dtype=float), grp[band].to_numpy(dtype=float)
    # a move of more than 100% was upwards (a positive value cannot fall by that much): the lower edge stays above 0
    lower = y * np.where(b < 1, 1 - b, 1 / (1 + b))
    ax.fill_between(grp[x].to_numpy(dtype=float), lower, y * (1 + b), color=color, alpha=0.18, lw=0)


def _envelope(t: np.ndarray, y, buckets: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(t, y) of a time-ordered series, or for a long one its min and max over `buckets` runs of
    consecutive points, drawn as one vertical stroke per run: the figure a line through every
    point gives at plot resolution (8 inches at 120 dpi: under 1,000 pixels), at a fraction of
    the drawing time."""
    y = np.asarray(y, dtype=float)
    if len(y) <= 2 * buckets:
        return t, y
    starts = np.linspace(0, len(y), buckets, endpoint=False).astype(np.int64)
    lo, hi = np.fmin.reduceat(y, starts), np.fmax.reduceat(y, starts)
    return np.repeat(t[starts], 2), np.column_stack([lo, hi]).ravel()


def step_timeline(steps_df: pd.DataFrame, path, title: str | None = None) -> Path:
    """Batch size, KV-cache usage and preemptions over run time, one panel each (long runs drawn as
    their min/max envelope, see _envelope). Legends sit right of the panels (matplotlib's "best"
    placement scans every plotted point: seconds for a long run)."""
    if len(steps_df) == 0:
        raise ValueError("step_timeline: the steps table is empty")
    t = steps_df["start_time_s"].to_numpy()
    fig, axes = plt.subplots(3, 1, figsize=(8, 6), sharex=True)
    axes[0].plot(*_envelope(t, steps_df["batch_size"]), lw=0.8, label="batch size")
    axes[0].plot(*_envelope(t, steps_df["num_prefill_seqs"]), lw=0.8, label="prefill seqs")
    axes[0].set_ylabel("sequences")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    total = (steps_df["kv_blocks_used"] + steps_df["kv_blocks_free"]).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        axes[1].plot(*_envelope(t, np.where(total > 0, steps_df["kv_blocks_used"] / total, np.nan)), lw=0.8,
                     label="used")
        axes[1].plot(*_envelope(t, np.where(total > 0, steps_df["kv_blocks_cached"] / total, np.nan)), lw=0.8,
                     label="cached")
    axes[1].set_ylabel("KV blocks (fraction)")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[2].plot(*_envelope(t, np.cumsum(steps_df["num_preempted"])), lw=0.8, label="preempted")
    axes[2].plot(*_envelope(t, np.cumsum(steps_df["num_swapped_out"])), lw=0.8, label="swapped out")
    axes[2].set_ylabel("cumulative count")
    axes[2].set_xlabel("time (s)")
    axes[2].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        axes[0].set_title(title)
    return _save(fig, path)


def replica_load(table: pd.DataFrame, path, title: str | None = None) -> Path:
    """Per-replica load, one bar per replica: requests served, busy fraction, KV-cache use (mean bars,
    max dots) and prefix-cache hit rate; table: experiments.metrics.per_replica's rows."""
    if len(table) == 0:
        raise ValueError("replica_load: the per-replica table is empty")
    table = pd.DataFrame(table)
    x = table["replica"].to_numpy()
    fair = table["num_requests"].sum() / len(table)
    fig, axes = plt.subplots(4, 1, figsize=(max(6.0, 0.35 * len(x) + 3), 7.5), sharex=True)
    axes[0].bar(x, table["num_requests"], color="C0")
    axes[0].axhline(fair, color="k", lw=0.8, ls="--", label="fair share")
    axes[0].set_ylabel("requests")
    axes[0].legend(fontsize=8)
    axes[1].bar(x, table["busy_fraction"].astype(float), color="C1")
    axes[1].set_ylabel("busy fraction")
    axes[1].set_ylim(0, 1.05)
    axes[2].bar(x, table["kv_usage_mean"].astype(float), color="C2", label="mean")
    axes[2].plot(x, table["kv_usage_max"].astype(float), "k_", ms=12, mew=2, label="max")
    axes[2].set_ylabel("KV-cache use")
    axes[2].set_ylim(0, 1.05)
    axes[2].legend(fontsize=8)
    axes[3].bar(x, table["prefix_cache_hit_rate"].astype(float), color="C3")
    axes[3].set_ylabel("prefix hit rate")
    axes[3].set_ylim(0, 1.05)
    axes[3].set_xlabel("replica")
    axes[3].set_xticks(x)
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    if title:
        axes[0].set_title(title, fontsize=8, wrap=True)
    return _save(fig, path)


# -- tenants, service classes, fairness (tables of experiments.tenant_metrics) ------------------------
def tenant_service(timeline: pd.DataFrame, difference: pd.DataFrame, path, title: str | None = None) -> Path:
    """Weighted service rate per tenant over time (dotted where the tenant was not backlogged), the
    service difference among backlogged tenants and their Jain's index, one panel each."""
    if len(timeline) == 0:
        raise ValueError("tenant_service: the service timeline is empty")
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    for i, (tenant, df) in enumerate(timeline.groupby("tenant", sort=True)):
        mid = 0.5 * (df["window_start_s"] + df["window_end_s"]).to_numpy()
        rate = df["service_rate"].to_numpy(dtype=float)
        axes[0].plot(mid, rate, ":", lw=0.8, color=f"C{i % 10}")
        axes[0].plot(mid, np.where(df["backlogged"].to_numpy(dtype=bool), rate, np.nan), "-", lw=1.2,
                     color=f"C{i % 10}", label=str(tenant))
    axes[0].set_ylabel("service (weighted tok/s)")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="solid: backlogged",
                   title_fontsize=7)
    mid = 0.5 * (difference["window_start_s"] + difference["window_end_s"]).to_numpy()
    axes[1].plot(mid, difference["service_diff_rate"].to_numpy(dtype=float), "-", marker="o", ms=2, color="k")
    axes[1].set_ylabel("max - min service\n(backlogged, tok/s)")
    axes[2].plot(mid, difference["jain_index"].to_numpy(dtype=float), "-", marker="o", ms=2, color="C3")
    axes[2].set_ylabel("Jain's index\n(backlogged)")
    axes[2].set_ylim(0, 1.05)
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        axes[0].set_title(title, fontsize=9)
    return _save(fig, path)


def _bar_panels(fig, axes, x, labels, title, path, rotation: int, fontsize: int) -> Path:
    """Label the shared x positions of bar panels, title the figure and save it."""
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(pd.Series(labels).astype(str), rotation=rotation, fontsize=fontsize)
        ax.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def tenant_latency(tenants: pd.DataFrame, path, title: str | None = None) -> Path:
    """Per tenant: output throughput, TTFT p50 / p99 and SLO attainment (experiments.tenant_metrics.per_tenant)."""
    if len(tenants) == 0:
        raise ValueError("tenant_latency: the per-tenant table is empty")
    tenants = pd.DataFrame(tenants)
    x = np.arange(len(tenants))
    fig, axes = plt.subplots(1, 3, figsize=(max(9.0, 1.2 * len(x) + 6), 3.2))
    axes[0].bar(x, tenants["output_throughput_tps"].astype(float), color="C0")
    axes[0].set_ylabel("output tok/s")
    axes[1].bar(x - 0.2, tenants["ttft_s_p50"].astype(float), 0.4, color="C1", label="p50")
    axes[1].bar(x + 0.2, tenants["ttft_s_p99"].astype(float), 0.4, color="C2", label="p99")
    axes[1].set_ylabel("TTFT (s)")
    axes[1].legend(fontsize=8)
    axes[2].bar(x, tenants["slo_attainment"].astype(float), color="C3")
    axes[2].set_ylabel("SLO attainment")
    axes[2].set_ylim(0, 1.05)
    return _bar_panels(fig, axes, x, tenants["tenant"], title, path, rotation=30, fontsize=8)


def slo_classes(classes: pd.DataFrame, path, title: str | None = None) -> Path:
    """Per service class: TTFT, TPOT and joint attainment, and goodput (experiments.tenant_metrics.per_class)."""
    if len(classes) == 0:
        raise ValueError("slo_classes: the per-class table is empty")
    classes = pd.DataFrame(classes)
    x = np.arange(len(classes))
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 2.0 * len(x) + 4), 3.4))
    for j, (col, label) in enumerate((("ttft_attainment", "TTFT"), ("tpot_attainment", "TPOT"),
                                      ("slo_attainment", "both"))):
        axes[0].bar(x + (j - 1) * 0.27, classes[col].astype(float), 0.27, color=f"C{j}", label=label)
    axes[0].set_ylabel("SLO attainment")
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    axes[1].bar(x, classes["goodput_rps"].astype(float), color="C3")
    axes[1].set_ylabel("goodput (req/s)")
    return _bar_panels(fig, axes, x, classes["slo_class"], title, path, rotation=20, fontsize=7)


def service_difference_runs(runs: dict[str, pd.DataFrame], path) -> Path:
    """Service difference among backlogged tenants over time, one line per run (label -> service_difference
    table), with Jain's index below: FCFS against VTC on one workload, say."""
    if not runs:
        raise ValueError("service_difference_runs needs at least one run")
    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for i, (label, diff) in enumerate(runs.items()):
        mid = 0.5 * (diff["window_start_s"] + diff["window_end_s"]).to_numpy()
        axes[0].plot(mid, diff["service_diff_rate"].to_numpy(dtype=float), "-", marker="o", ms=2,
                     color=f"C{i % 10}", label=str(label))
        axes[1].plot(mid, diff["jain_index"].to_numpy(dtype=float), "-", marker="o", ms=2, color=f"C{i % 10}")
    axes[0].set_ylabel("max - min service among\nbacklogged tenants (tok/s)")
    axes[0].legend(fontsize=8)
    axes[1].set_ylabel("Jain's index (backlogged)")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save(fig, path)


def attainment_vs_load(summaries: pd.DataFrame, path, x: str = "request_rate_rps", by: str = "policy") -> Path:
    """SLO attainment (over the requests with targets) and goodput vs load, one colour per `by` value."""
    needed = [x, by, "slo_attainment_targets", "goodput_targets_rps"]
    missing = [c for c in needed if c not in summaries]
    if missing:
        raise ValueError(f"attainment_vs_load: summaries lack column(s) {missing}")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for i, (key, grp) in enumerate(summaries.groupby(by, sort=True)):
        grp = grp.sort_values(x)
        axes[0].plot(grp[x], grp["slo_attainment_targets"], "-", marker="o", ms=3, color=f"C{i % 10}", label=str(key))
        axes[1].plot(grp[x], grp["goodput_targets_rps"], "-", marker="o", ms=3, color=f"C{i % 10}")
    axes[0].set_ylabel("SLO attainment")
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylabel("goodput (req/s)")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)" if x == "request_rate_rps" else x)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def generalization(table: pd.DataFrame, diffs: pd.DataFrame, path, goals: dict, title: str | None = None) -> Path:
    """The generalization suite at a glance (experiments.generalize): per (workload, policy) cell the per-request
    E2E median |error| against its goal and its real-vs-real floor, and the step-sum ratio against its band;
    per workload the verdicts of the policy pairs whose real difference exceeds twice its noise band."""
    fig, axes = plt.subplots(3, 1, figsize=(max(8, 0.32 * len(table) + 2), 9), layout="constrained",
                             gridspec_kw=dict(height_ratios=[3, 2, 2]))
    axes[0].sharex(axes[1])
    x = np.arange(len(table))
    wl = table["workload"].to_numpy()
    colors = {w: f"C{i}" for i, w in enumerate(dict.fromkeys(wl))}
    err = 100 * table["e2e_median_err"].abs().to_numpy(dtype=float)
    axes[0].bar(x, np.maximum(err, 1e-3), color=[colors[w] for w in wl])
    axes[0].scatter(x, 100 * table["floor_e2e_median"].to_numpy(dtype=float), marker="_", s=120, color="k",
                    zorder=3, label="real-vs-real floor")
    axes[0].axhline(100 * goals["e2e_median_err"], ls="--", color="k", lw=0.8, label="goal")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("E2E median |error| (%)")
    axes[0].legend(fontsize=8)
    ratio = table["step_sum_ratio"].to_numpy(dtype=float)
    axes[1].scatter(x, ratio, color=[colors[w] for w in wl], zorder=3)
    band = goals["step_sum_err"]
    axes[1].axhspan(1 - band, 1 + band, color="0.85", label=f"goal: within {100 * band:g}%")
    axes[1].set_ylabel("step sum, sim / real")
    axes[1].legend(fontsize=8)
    for ax in axes[:2]:
        ax.set_xticks(x)
        ax.set_xlim(-0.6, len(x) - 0.4)
        ax.grid(alpha=0.3, axis="y")
    axes[0].tick_params(labelbottom=False)
    axes[1].set_xticklabels([f"{w}:{p}" for w, p in zip(wl, table["policy"])], rotation=70, fontsize=7)
    sig = diffs[diffs["verdict"] != "real: no difference"] if len(diffs) else diffs
    order = ["agree", "sign only", "sim: no difference", "wrong sign"]
    counts = (sig.groupby(["workload", "verdict"]).size().unstack(fill_value=0).reindex(columns=order, fill_value=0)
              if len(sig) else pd.DataFrame(columns=order))
    bottom = np.zeros(len(counts))
    pos = np.arange(len(counts))
    for verdict, color in zip(order, ("C2", "C1", "0.6", "C3")):
        vals = counts[verdict].to_numpy(dtype=float)
        axes[2].bar(pos, vals, bottom=bottom, color=color, label=verdict)
        bottom += vals
    axes[2].set_xticks(pos)
    axes[2].set_xticklabels(counts.index, fontsize=8)
    axes[2].set_ylabel("pairs x metrics whose real\ndifference > 2x its band", fontsize=8)
    axes[2].set_ylim(0, 1.3 * max(bottom.max(initial=0), 1))
    axes[2].legend(fontsize=7, ncol=4, loc="upper center")
    axes[2].grid(alpha=0.3, axis="y")
    if title:
        axes[0].set_title(title, fontsize=9)
    return _save(fig, path)
