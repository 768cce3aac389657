"""The validation's overlay plot: per policy, latency CDFs and output throughput over time, real vs simulated.

    overlay_plot({"vllm": {"real": run, "calibrated": sim}}, "validation_x.png")
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


def _token_times(req) -> np.ndarray:
    """Output token times: the first at first_token_time_s, the rest spread evenly up to finish_time_s."""
    fin = req[req["status"] == "finished"]
    t1, t2 = fin["first_token_time_s"].to_numpy(), fin["finish_time_s"].to_numpy()
    n = fin["num_output_tokens"].to_numpy().astype(np.int64)
    rest = np.maximum(n - 1, 0)
    idx = np.repeat(np.arange(len(n)), rest)
    k = np.arange(rest.sum()) - np.repeat(np.cumsum(rest) - rest, rest) + 1       # 1..n-1 within each request
    later = t1[idx] + (t2[idx] - t1[idx]) * k / np.maximum(rest[idx], 1)
    return np.concatenate([t1, later])


def overlay_plot(runs_by_policy: dict[str, dict], path, title: str = "") -> Path:
    """One row per policy: TTFT, TPOT, E2E CDFs and output tokens/s over time, real vs each simulation
    (runs_by_policy: policy -> label -> experiments.runner_engine.RunResult)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(runs_by_policy)
    fig, axes = plt.subplots(rows, 4, figsize=(18, 3.8 * rows), squeeze=False, constrained_layout=True)
    for i, (policy, runs) in enumerate(runs_by_policy.items()):
        end = max((float(np.nanmax(r.requests["finish_time_s"])) for r in runs.values() if len(r.requests)),
                  default=1.0)
        bins = np.linspace(0.0, end if end > 0 else 1.0, 61)
        for j, (label, run) in enumerate(runs.items()):
            style = dict(color="black", lw=1.8) if label == "real" else dict(color=f"C{j}", lw=1.2, ls="--")
            fin = run.requests[run.requests["status"] == "finished"]
            for c, m in enumerate(LATENCIES):
                v = np.sort(fin[m].to_numpy(dtype=float))
                v = v[np.isfinite(v)]
                if len(v):
                    axes[i, c].step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, **style)
            hist, _ = np.histogram(_token_times(run.requests), bins=bins)
            axes[i, 3].plot(0.5 * (bins[1:] + bins[:-1]), hist / np.diff(bins), label=label, **style)
        for c, m in enumerate(LATENCIES):
            axes[i, c].set_xlabel(f"{m[:-2].upper()} (s)")
            axes[i, c].set_ylabel("fraction of requests")
            axes[i, c].set_title(f"{policy}: {m[:-2].upper()} CDF", fontsize=10)
        axes[i, 3].set_xlabel("time (s)")
        axes[i, 3].set_ylabel("output tokens/s")
        axes[i, 3].set_title(f"{policy}: throughput over time", fontsize=10)
        for ax in axes[i]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
