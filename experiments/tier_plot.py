"""Prefix-cache hit rate per tier and TTFT against the CPU tier's size, from a sweep over cpu_cache_num_blocks.

    servelab -m experiment=cpu_tier workload.path=path/to/conversation_trace.jsonl
    python -m experiments.tier_plot sweeps/cpu_tier [--out DIR]

Writes DIR/cpu_tier.png (left: the share of prompt tokens served from GPU blocks and from the CPU tier,
stacked; right: TTFT mean, p50 and p99 relative to the run without a tier, or the smallest tier) and
DIR/cpu_tier.csv (one row per run). DIR defaults to SWEEP_DIR/report_tier (servelab-report owns
SWEEP_DIR/report). The x axis is the tier in blocks, with its size in GiB of the run's KV (block bytes
from the model and block size) on the top axis. One line per GPU cache size when the sweep varies it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments.report import collect, draw_and_publish
from experiments.results import atomic_write_text

COLUMNS = ("num_kvcache_blocks", "cpu_cache_num_blocks", "prefix_cache_hit_rate", "prefix_cache_hit_rate_gpu",
           "prefix_cache_hit_rate_cpu", "ttft_s_mean", "ttft_s_p50", "ttft_s_p99", "e2e_s_p50",
           "output_throughput_tps", "busy_time_s")

SWEEP_IT = "sweep it, e.g. servelab -m experiment=cpu_tier workload.path=..."


def tier_table(sweep_dir) -> pd.DataFrame:
    """One row per run of the sweep, COLUMNS (those present), by GPU cache then tier size."""
    df = collect(sweep_dir)
    if "cpu_cache_num_blocks" not in df:
        raise ValueError(f"{sweep_dir}: no run records cpu_cache_num_blocks; {SWEEP_IT}")
    df = df.assign(cpu_cache_num_blocks=df["cpu_cache_num_blocks"].fillna(0).astype(int))
    sizes = sorted(set(df["cpu_cache_num_blocks"]))
    if len(sizes) < 2:
        raise ValueError(f"{sweep_dir}: every run has cpu_cache_num_blocks={sizes[0]}, nothing to compare; {SWEEP_IT}")
    for c in ("prefix_cache_hit_rate_gpu", "prefix_cache_hit_rate_cpu"):
        if c not in df:
            df[c] = float("nan")
    cols = [c for c in COLUMNS if c in df]
    return df[cols].sort_values(["num_kvcache_blocks", "cpu_cache_num_blocks"], ignore_index=True)


def plot(table: pd.DataFrame, path, block_gib: float | None = None) -> Path:
    import matplotlib.pyplot as plt

    from experiments.plots import _save  # (sets the Agg backend)

    fig, (ax_hit, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4))
    groups = list(table.groupby("num_kvcache_blocks"))
    for i, (gpu, t) in enumerate(groups):
        x = t["cpu_cache_num_blocks"].to_numpy()
        label = f"GPU {gpu:,} blocks" if len(groups) > 1 else None
        gpu_hits = 100 * t["prefix_cache_hit_rate_gpu"].fillna(t["prefix_cache_hit_rate"]).to_numpy()
        cpu_hits = 100 * t["prefix_cache_hit_rate_cpu"].fillna(0).to_numpy()
        ax_hit.plot(x, gpu_hits, "o--", color=f"C{i}", label=f"GPU tier{' ' + label if label else ''}")
        ax_hit.plot(x, gpu_hits + cpu_hits, "o-", color=f"C{i}", label=f"GPU + CPU tier{' ' + label if label else ''}")
        ax_hit.fill_between(x, gpu_hits, gpu_hits + cpu_hits, color=f"C{i}", alpha=0.2)
        base = t[t["cpu_cache_num_blocks"] == 0]
        for name, style in (("ttft_s_mean", "s-"), ("ttft_s_p50", "o-"), ("ttft_s_p99", "^-")):
            ref = float(base[name].iloc[0]) if len(base) else float(t[name].iloc[0])
            ax_ttft.plot(x, 100 * t[name] / ref, style, color=f"C{i}",
                         label=f"{name[7:]} ({ref:.3g} s without){' ' + label if label else ''}")
    ax_hit.set(xlabel="CPU tier (blocks)", ylabel="prompt tokens served from the cache (%)",
               title="prefix-cache hits per tier")
    ax_ttft.set(xlabel="CPU tier (blocks)", ylabel="TTFT, % of the run without a CPU tier",
                title="time to first token")
    for ax in (ax_hit, ax_ttft):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if block_gib:
            top = ax.secondary_xaxis("top", functions=(lambda b: b * block_gib, lambda g: g / block_gib))
            top.set_xlabel("CPU tier (GiB)")
    fig.tight_layout()
    return _save(fig, path)


def _block_gib(sweep_dir) -> float | None:
    """GiB of one KV block of the sweep's model (from the first run's resolved config), or None."""
    import yaml

    from sim.specs.capacity import block_bytes_per_gpu
    from sim.specs.models import get_model_spec
    for cfg_path in sorted(Path(sweep_dir).rglob(".hydra/config.yaml")):
        cfg = yaml.safe_load(cfg_path.read_text())
        try:
            model = get_model_spec(cfg["model"]["name"])
            return block_bytes_per_gpu(model, int(cfg["block_size"]), int(cfg["tensor_parallel_size"])) / 2**30
        except (KeyError, ValueError):
            return None
    return None


def main(argv=None) -> None:
    from experiments.user_errors import USER_ERRORS, fail
    ap = argparse.ArgumentParser(prog="python -m experiments.tier_plot", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="a sweep folder over cpu_cache_num_blocks, e.g. sweeps/cpu_tier")
    ap.add_argument("--out", default=None, help="output folder (default: SWEEP_DIR/report_tier)")
    args = ap.parse_args(argv)
    try:
        table = tier_table(args.sweep_dir)
    except USER_ERRORS as e:
        fail(str(e))
    out = (Path(args.out) if args.out else Path(args.sweep_dir) / "report_tier").resolve()

    def draw(folder: Path) -> list[Path]:
        atomic_write_text(folder / "cpu_tier.csv", table.to_csv(index=False))
        return [plot(table, folder / "cpu_tier.png", _block_gib(args.sweep_dir)), folder / "cpu_tier.csv"]

    # drawn aside and moved in as servelab-report's files are: an earlier, different plot is kept as out.<N>/
    _, kept, unchanged = draw_and_publish(out, draw)
    print(table.to_string(index=False))
    files = f"{out / 'cpu_tier.png'} and {out / 'cpu_tier.csv'}"
    print(f"{files}: already this plot, left as they were" if unchanged else f"wrote {files}"
          + (f" (the earlier ones differ and are kept in {kept})" if kept else ""))


if __name__ == "__main__":
    main()
