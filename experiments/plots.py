"""Plots of run tables (matplotlib, Agg backend: files only, no display).

Each function takes DataFrames and an output path, writes a PNG and returns the path.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

_LABELS = {"ttft_s": "TTFT (s)", "tpot_s": "TPOT (s)", "e2e_s": "E2E latency (s)", "itl_s": "ITL (s)",
           "queueing_delay_s": "queueing delay (s)", "normalized_latency_s": "normalized latency (s/token)",
           "request_rate_rps": "request rate (req/s)"}


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def axis_label(col: str) -> str:
    """The words for a column on an axis (a latency metric, the request rate), any other column as it is."""
    return _LABELS.get(col, col)


def legend_outside(ax, **kw):
    """A legend right of the axes: inside one it sits on some line or bar sooner or later (the "fair share" line
    on replica 0's bar, a p99 line), and matplotlib's "best" placement scans every plotted point (seconds for a
    long run)."""
    return ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), **kw)


def value_text(v) -> str:
    """A swept value for a label: a number to 3 significant digits (a measured rate: 60.8), anything else as it is."""
    return f"{v:.3g}" if isinstance(v, (int, float, np.number)) and not isinstance(v, bool) else str(v)


WIDE_DECADES = 1.5     # latencies spanning more decades than this get a log axis


def log_if_wide(ax, values) -> bool:
    """A log y-axis when the positive values span more than WIDE_DECADES decades (a linear one then draws every
    low-latency line at 0), else linear (a log axis over a narrow span labels ticks as 2.3 x 10^-2); returns
    whether it chose log."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    wide = len(v) > 0 and np.log10(v.max() / v.min()) > WIDE_DECADES
    ax.set_yscale("log" if wide else "linear")
    return bool(wide)


# One marker per series, drawn hollow and smaller for each later series, with thinner lines: a series equal to an
# earlier one (fcfs and vllm below saturation) sits inside it, both colours and shapes visible, instead of under it;
# its label says so (series_labels).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def series_style(i: int, n: int) -> dict:
    """plot() keywords of series i of n: its colour, its marker (hollow) and a size and width that shrink with i."""
    shrink = i / (n - 1) if n > 1 else 0.0
    return dict(color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)], mfc="none", ms=8.5 - 4.0 * shrink,
                mew=1.2, lw=2.2 - 1.2 * shrink)


def repeats_earlier(seen: list, key, values: np.ndarray):
    """The key of the first (key, values) in seen whose values equal these (a series drawn on top of that one), or
    None; then appends (key, values) to seen."""
    same = next((k for k, v in seen if v.shape == values.shape and np.allclose(v, values, rtol=1e-9, atol=0,
                                                                                equal_nan=True)), None)
    seen.append((key, values))
    return same


def series_labels(groups: list, x: str, cols: list) -> list[str]:
    """The legend label of each (key, frame) series: its key, and "(= <key>)" naming an earlier series whose x and
    cols values it repeats exactly, since it is drawn on top of that one."""
    labels, seen = [], []
    for key, grp in groups:
        same = repeats_earlier(seen, key, grp.sort_values(x)[[x, *cols]].to_numpy(dtype=float))
        labels.append(str(key) if same is None else f"{key} (= {same})")
    return labels


PCT_STYLES = ("-", "--", ":", "-.")       # line style per percentile (p50 solid, p99 dashed)
PCT_POINTS = (dict(marker="o"), dict(marker="o", mfc="none"), dict(marker="x"), dict(marker="+"))   # one x each


def percentile_lines(ax, df: pd.DataFrame, x: str, by: str, metric: str, percentiles=(50, 99),
                     same_cols: list | None = None) -> bool:
    """Percentiles of `metric` vs x, one colour and marker per `by` value (series_style; a value repeating an
    earlier one's columns same_cols, by default the ones drawn, is labelled so: series_labels), shaded with the
    simulator's band where the runs have one (sim_band); returns whether it drew points instead.

    Where every `by` value ran at a single x (a single-rate sweep) a line has one point, and neither its style
    nor a shade shows: each value gets its own x position (ticks name it), its percentiles a marker each (p50
    filled, p99 hollow, see percentile_key) and the band an error bar."""
    groups = list(df.groupby(by, sort=True))
    if all(grp[x].nunique() <= 1 for _, grp in groups):
        for i, (key, grp) in enumerate(groups):
            color = f"C{i % 10}"
            ys = [float(grp[f"{metric}_p{p}"].iloc[0]) for p in percentiles]
            ax.plot([i] * len(ys), ys, "-", lw=0.8, color=color, alpha=0.6)       # joins one value's markers
            for j, (p, y) in enumerate(zip(percentiles, ys)):
                ax.plot([i], [y], ls="none", ms=7, mew=1.5, color=color, label=str(key) if j == 0 else None,
                        **PCT_POINTS[j % len(PCT_POINTS)])
                band = f"{metric}_p{p}_sim_band"
                if band in grp and grp[band].notna().any():
                    lo, hi = _band_edges(np.array([y]), grp[band].to_numpy(dtype=float)[:1])
                    ax.errorbar([i], [y], yerr=[y - lo, hi - y], fmt="none", ecolor=color, elinewidth=1.2,
                                capsize=4)
        names = [str(k) for k, _ in groups]
        ax.set_xticks(range(len(groups)))
        # short names label their ticks; long ones (unrelated runs) only the legend, which has room for them
        ax.set_xticklabels(names if max(map(len, names), default=0) <= 12 else [""] * len(names),
                           rotation=20 if len(groups) > 3 else 0)
        ax.set_xlim(-0.6, len(groups) - 0.4)
        at = " / ".join(dict.fromkeys(value_text(v) for v in sorted(df[x].dropna())))
        ax.set_xlabel(f"{by}, at {at} req/s" if x == "request_rate_rps" else f"{by}, at {x} = {at}")
        return True
    labels = series_labels(groups, x, same_cols or [f"{metric}_p{p}" for p in percentiles])
    for i, (label, (key, grp)) in enumerate(zip(labels, groups)):
        grp = grp.sort_values(x)
        style = series_style(i, len(groups))
        for j, p in enumerate(percentiles):
            ax.plot(grp[x], grp[f"{metric}_p{p}"], PCT_STYLES[j % len(PCT_STYLES)], **style,
                    label=label if j == 0 else None)
            sim_band(ax, grp, x, f"{metric}_p{p}", style["color"])
    ax.set_xlabel(axis_label(x))
    return False


def percentile_key(points: bool, banded: bool, percentiles=(50, 99)) -> list:
    """Legend handles (black) that say what percentile_lines drew: a line style or a marker per percentile, and
    the band's shade or error bar."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    if points:
        keys = [Line2D([], [], ls="none", ms=7, mew=1.5, color="k", label=f"p{p}", **PCT_POINTS[j % len(PCT_POINTS)])
                for j, p in enumerate(percentiles)]
        if banded:
            keys.append(Line2D([], [], ls="none", marker="|", ms=12, mew=1.2, color="k", label="bar: the sim's band"))
        return keys
    keys = [Line2D([], [], ls=PCT_STYLES[j % len(PCT_STYLES)], color="k", label=f"p{p}")
            for j, p in enumerate(percentiles)]
    if banded:
        keys.append(Patch(color="k", alpha=0.18, lw=0, label="shaded: the sim's band"))
    return keys


def _plain_log_ticks(axis, lo: float, hi: float) -> None:
    """Log-axis tick labels as plain numbers (0.05, not 5 x 10^-2: matplotlib's labels of a span under two decades
    overlap), the 2s and 5s between the powers of ten labelled only where the span leaves room for them."""
    def plain(v, _):
        return f"{v:g}"

    def twos_and_fives(v, _):
        return f"{v:g}" if round(v / 10 ** np.floor(np.log10(v))) in (2, 5) else ""

    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(plain))
    few = lo > 0 and np.log10(hi / lo) <= 2
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(twos_and_fives) if few
                             else matplotlib.ticker.NullFormatter())


def latency_cdf(runs: dict[str, pd.DataFrame], path, metric: str = "ttft_s", log_x: bool = False,
                title: str | None = None) -> Path:
    """Empirical CDF of one per-request latency column, one line per run (label -> requests table).

    metric may be any requests-table column or 'normalized_latency_s' (e2e per output token).
    Only finished requests are plotted, each later run a thinner line (series_style): a run equal to an earlier
    one shows inside it, and its label names that one. title: what the runs share (the report's: the request rate).
    """
    if not runs:
        raise ValueError("latency_cdf needs at least one run")
    fig, ax = plt.subplots(figsize=(6, 4))
    seen = []
    for i, (label, df) in enumerate(runs.items()):
        fin = df[df["status"] == "finished"] if "status" in df else df
        if metric == "normalized_latency_s":
            vals = fin["e2e_s"].to_numpy() / fin["num_output_tokens"].to_numpy()
        elif metric in fin:
            vals = fin[metric].to_numpy(dtype=float)
        else:
            raise ValueError(f"unknown metric {metric!r}; use a requests-table column or 'normalized_latency_s'")
        vals = np.sort(vals[~np.isnan(vals)])
        same = repeats_earlier(seen, label, vals)
        if len(vals):
            style = series_style(i, len(runs))
            ax.step(vals, np.arange(1, len(vals) + 1) / len(vals), where="post", color=style["color"],
                    lw=style["lw"] - 0.4, label=f"{label} (n={len(vals)}" + (f", = {same})" if same else ")"))
    ax.set_xlabel(axis_label(metric))
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    if log_x:
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis, *ax.get_xlim())
    ax.grid(alpha=0.3)
    legend_outside(ax)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


def throughput_latency(summaries: pd.DataFrame, path, metric: str = "ttft_s", x: str = "request_rate_rps",
                       by: str = "policy", percentiles=(50, 99)) -> Path:
    """Latency vs load: one colour per `by` value, solid p50 and dashed p99 (percentile_lines; markers for a
    single-rate sweep), on a log y-axis when the latencies span more than WIDE_DECADES decades.

    summaries: one row per run with columns x, by and f"{metric}_p{p}" (as
    metrics.summary gives, plus the run's x and by values).
    """
    needed = [x, by] + [f"{metric}_p{p}" for p in percentiles]
    missing = [c for c in needed if c not in summaries]
    if missing:
        raise ValueError(f"throughput_latency: summaries lack column(s) {missing}; has {list(summaries.columns)}")
    fig, ax = plt.subplots(figsize=(6, 4))
    points = percentile_lines(ax, summaries, x, by, metric, percentiles)
    log_if_wide(ax, summaries[[f"{metric}_p{p}" for p in percentiles]].to_numpy())
    ax.set_ylabel(axis_label(metric))
    ax.grid(alpha=0.3, which="both")
    banded = any(summaries.get(f"{metric}_p{p}_sim_band", pd.Series(dtype=float)).notna().any() for p in percentiles)
    handles, _ = ax.get_legend_handles_labels()
    legend_outside(ax, handles=handles + percentile_key(points, banded, percentiles))
    return _save(fig, path)


def sim_band(ax, grp: pd.DataFrame, x: str, col: str, color: str) -> None:
    """Shade col +- its simulator's band (`<col>_sim_band`, the largest relative move with every step price +- the
    fit's uncertainty: experiments/sim_band.py) around the line; nothing for runs without one."""
    band = f"{col}_sim_band"
    if band not in grp or not grp[band].notna().any():
        return
    y, b = grp[col].to_numpy(dtype=float), grp[band].to_numpy(dtype=float)
    ax.fill_between(grp[x].to_numpy(dtype=float), *_band_edges(y, b), color=color, alpha=0.18, lw=0)


def _band_edges(y: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of y moved by its relative band b. A move of more than 100% was upwards (a positive value
    cannot fall by that much): the lower edge stays above 0."""
    return y * np.where(b < 1, 1 - b, 1 / (1 + b)), y * (1 + b)


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


STEP_WINDOWS = 250      # the batch-size panel aggregates the steps into about this many windows


def _step_windows(t: np.ndarray, steps_df: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    """(steps per window, one row per window of consecutive steps: its first step's time, the mean decode seqs of
    its steps that decode, the mean prefill seqs of its steps that prefill, the max batch size). A line through
    every step's batch size is a solid block: it swings each step between a prefill step of a few sequences and
    the full decode batch; a median per window jumps between the two as well."""
    w = max(5, -(-len(t) // STEP_WINDOWS))
    batch = steps_df["batch_size"].to_numpy(dtype=float)
    prefill = steps_df["num_prefill_seqs"].to_numpy(dtype=float)
    decode = batch - prefill
    frame = pd.DataFrame({"t": t, "batch": batch, "decode": np.where(decode > 0, decode, np.nan),
                          "prefill": np.where(prefill > 0, prefill, np.nan)})
    agg = frame.groupby(np.arange(len(t)) // w).agg(t=("t", "first"), decode=("decode", "mean"),
                                                    prefill=("prefill", "mean"), batch_max=("batch", "max"))
    return w, agg


def step_timeline(steps_df: pd.DataFrame, path, title: str | None = None) -> Path:
    """Sequences per step (per window of steps, see _step_windows), KV-cache usage and preemptions over run time,
    one panel each (the other panels of long runs drawn as their min/max envelope, see _envelope). Legends sit
    right of the panels (legend_outside)."""
    if len(steps_df) == 0:
        raise ValueError("step_timeline: the steps table is empty")
    t = steps_df["start_time_s"].to_numpy()
    fig, axes = plt.subplots(3, 1, figsize=(8, 6), sharex=True)
    w, win = _step_windows(t, steps_df)
    axes[0].plot(win["t"], win["batch_max"], drawstyle="steps-post", lw=0.8, color="0.6", label="batch size: max")
    axes[0].plot(win["t"], win["decode"], drawstyle="steps-post", lw=1.2, color="C0",
                 label="decode seqs: mean of\nthe steps that decode")
    axes[0].plot(win["t"], win["prefill"], drawstyle="steps-post", lw=1.2, color="C1",
                 label="prefill seqs: mean of\nthe steps that prefill")
    axes[0].set_ylabel("sequences per step")
    legend_outside(axes[0], title=f"per window of {w} steps", title_fontsize=7)
    total = (steps_df["kv_blocks_used"] + steps_df["kv_blocks_free"]).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        axes[1].plot(*_envelope(t, np.where(total > 0, steps_df["kv_blocks_used"] / total, np.nan)), lw=0.8,
                     label="used")
        axes[1].plot(*_envelope(t, np.where(total > 0, steps_df["kv_blocks_cached"] / total, np.nan)), lw=0.8,
                     label="cached")
    axes[1].set_ylabel("KV blocks (fraction)")
    legend_outside(axes[1])
    axes[2].plot(*_envelope(t, np.cumsum(steps_df["num_preempted"])), lw=0.8, label="preempted")
    axes[2].plot(*_envelope(t, np.cumsum(steps_df["num_swapped_out"])), lw=0.8, label="swapped out")
    axes[2].set_ylabel("cumulative count")
    # counts: whole ticks from 0 (a run without preemptions otherwise gets an axis of -0.05..0.05 labelled 0.00)
    axes[2].set_ylim(bottom=0, top=max(axes[2].get_ylim()[1], 1))
    axes[2].yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[2].set_xlabel("time (s)")
    legend_outside(axes[2])
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        axes[0].set_title(title, fontsize=9, wrap=True)     # a sweep job's title names all its overrides
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
    legend_outside(axes[0])
    axes[1].bar(x, table["busy_fraction"].astype(float), color="C1")
    axes[1].set_ylabel("busy fraction")
    axes[1].set_ylim(0, 1.05)
    axes[2].bar(x, table["kv_usage_mean"].astype(float), color="C2", label="mean")
    axes[2].plot(x, table["kv_usage_max"].astype(float), "k_", ms=12, mew=2, label="max")
    axes[2].set_ylabel("KV-cache use")
    axes[2].set_ylim(0, 1.05)
    legend_outside(axes[2])
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
    legend_outside(axes[0], title="solid: backlogged", title_fontsize=7)
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


NO_SLO_NOTE = "no SLO targets\nin this workload"


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
    # a tenant served at once (0.05 s) beside a queued one (30 s): on a linear axis its bars vanish
    log_if_wide(axes[1], tenants[["ttft_s_p50", "ttft_s_p99"]].to_numpy())
    legend_outside(axes[1])
    attainment = tenants["slo_attainment"].astype(float)
    axes[2].bar(x, attainment, color="C3")
    axes[2].set_ylabel("SLO attainment")
    axes[2].set_ylim(0, 1.05)
    if attainment.isna().all():       # no request carries a target: say so rather than leave empty axes
        axes[2].text(0.5, 0.5, NO_SLO_NOTE, transform=axes[2].transAxes, ha="center", va="center", fontsize=9,
                     color="0.35")
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
    legend_outside(axes[0])
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
    legend_outside(axes[0])
    axes[1].set_ylabel("Jain's index (backlogged)")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save(fig, path)


def attainment_vs_load(summaries: pd.DataFrame, path, x: str = "request_rate_rps", by: str = "policy") -> Path:
    """SLO attainment (over the requests with targets) and goodput vs load, one colour and marker per `by` value
    (series_style)."""
    needed = [x, by, "slo_attainment_targets", "goodput_targets_rps"]
    missing = [c for c in needed if c not in summaries]
    if missing:
        raise ValueError(f"attainment_vs_load: summaries lack column(s) {missing}")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    groups = list(summaries.groupby(by, sort=True))
    labels = series_labels(groups, x, ["slo_attainment_targets", "goodput_targets_rps"])
    for i, (label, (key, grp)) in enumerate(zip(labels, groups)):
        grp = grp.sort_values(x)
        style = series_style(i, len(groups))
        axes[0].plot(grp[x], grp["slo_attainment_targets"], "-", **style, label=label)
        axes[1].plot(grp[x], grp["goodput_targets_rps"], "-", **style)
    axes[0].set_ylabel("SLO attainment")
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylabel("goodput (req/s)")
    for ax in axes:
        ax.set_xlabel(axis_label(x))
        ax.grid(alpha=0.3)
    legend_outside(axes[1], handles=axes[0].get_legend_handles_labels()[0])
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
