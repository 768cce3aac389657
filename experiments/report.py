"""Collect a sweep folder into one table and plot it.

    servelab-report sweeps/fcfs_vs_preemptive          # or: python -m experiments.report SWEEP_DIR
    df = collect("sweeps/fcfs_vs_preemptive")          # one row per job

Each row holds the job's folder, its command-line override values (e.g.
`workload.target_rate_rps`, `scheduler`), its config-group choices, the run's
facts (`request_rate_rps`, `num_kvcache_blocks`, ...) and every summary metric
(docs/metrics.md), nested values as JSON text, and for a fitted cost model the share of steps
and of simulated step time outside its envelope (`cost_model_share_steps_outside`,
`cost_model_share_time_outside`; experiments/report_table.py) and how far each main metric moved with every
step price +- the fit's uncertainty (`<metric>_sim_band`, experiments/sim_band.py). With several `by` values,
differences.csv compares every pair at each x (where the labels name several overrides, the pairs that differ in
one of them): the relative difference of each main metric, the simulator's band on it, and a verdict ("B lower",
"B higher", or "no difference" inside the band or 0.1%). `policy` labels a
line in the plots: the values of every override that differs between the runs, rates excepted
(experiments/report_labels.py). A summary.json in a folder that holds a sweep (a single run
written into the sweep's folder) is left out and named.

Plots (PNG, in SWEEP_DIR/report/): overview.png (p50 and p99 TTFT, TPOT and
normalized latency vs request rate), one throughput-latency plot per metric,
latency CDFs and a step timeline per policy at the highest rate; with latency targets
slo_attainment.png (attainment and goodput vs rate), with several tenants
service_difference.png (service difference and Jain's index over time, one line per policy). The report is
drawn whole beside that folder, then moved in: an earlier report there with the same files, byte for byte, is
left as it is, and one that differs is moved to report.<N>/ first (`publish`), so no report is overwritten and
every report file in report/ shows the runs just read. The command lists the job folders it read (and those it left
out: complete=false), and every job that wrote no results at all (failed, killed, or never started: which
job, its log, the line that says why; experiments/job_record.py), also into report/failed_jobs.csv; an
unknown --x/--by column, a misspelt option or a sweep folder that does not exist fails naming the nearest one.
"""
from __future__ import annotations

import argparse
import difflib
import filecmp
import fnmatch
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import yaml

from experiments.job_record import describe, failed_jobs
from experiments.kept_copies import kept_name
from experiments.output_dirs import safe_name
from experiments.report_labels import fill_overrides, label_keys, natural_key, policy_labels
from experiments.report_table import cell, coverage_columns, parquet_safe
from experiments.results import NON_RESULT_KEYS, SUMMARY, atomic_write_text, read_summary, write_parquet
from experiments.sim_band import band_columns, count_line, differences
from experiments.user_errors import nearest, one_line
from experiments.workloads.changes import describe_input, input_changed

RATE = "request_rate_rps"
TL_METRICS = ("ttft_s", "tpot_s", "normalized_latency_s")


def _parse_override(item: str) -> tuple[str, object]:
    key, _, value = item.partition("=")
    key = key.lstrip("+~")
    try:
        value = yaml.safe_load(value)
    except yaml.YAMLError:
        pass
    return key, value


def _stray(summary_dirs: set[Path]) -> list[Path]:
    """The folders holding a summary.json that also hold a sweep (its multirun.yaml, or job folders with results):
    their summary is not a run of the sweep (a single run once written into the sweep's folder)."""
    above = {p for d in summary_dirs for p in d.parents}
    return sorted(d for d in summary_dirs if d in above or (d / "multirun.yaml").is_file())


NO_SWEEP_HINT = "; give a folder that `servelab -m name=<name> ...` wrote (sweeps/<name>)"


def _nearest_folder(path: Path) -> str:
    """'; did you mean ...?' for the existing folder spelt most like path (each missing part of it matched among the
    folders beside it: sweep/fcfs_vs_vtcc -> sweeps/fcfs_vs_vtc); without a close one, the folders that are there
    (a few), or where sweeps come from."""
    parts, found = path.parts, Path()
    for i, part in enumerate(parts):
        if (found / part).is_dir():
            found = found / part
            continue
        if i == 0 and path.is_absolute():
            return NO_SWEEP_HINT
        beside = sorted(p.name for p in found.iterdir() if p.is_dir() and not p.name.startswith("."))
        near = difflib.get_close_matches(part.lower(), [b.lower() for b in beside], n=1, cutoff=0.6)
        if not near:
            if i and beside:        # inside a folder that exists (sweeps/): what it holds
                more = f" and {len(beside) - 5} more" if len(beside) > 5 else ""
                return f"; {found} holds {', '.join(beside[:5])}{more}"
            return NO_SWEEP_HINT
        found = found / next(b for b in beside if b.lower() == near[0])
    return f"; did you mean {str(found)!r}?"


def input_change_lines(changes: dict, num_runs: int) -> list[str]:
    """One WARNING line per distinct change the runs' workload readers made to their input (clipped, dropped,
    skipped, re-sorted, spread, sampled requests), with how many runs made it: the jobs print theirs where they
    run, which for a cluster launcher is a log file, so the report says it again."""
    counts = Counter(changes.values())        # in first-seen order
    return [f"WARNING: input changed in {n} of {num_runs} runs: {text}" for text, n in counts.items()]


def collect(sweep_dir, complete_only: bool = True) -> pd.DataFrame:
    """One row per job folder under sweep_dir that holds a summary.json."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder not found: {sweep_dir}{_nearest_folder(sweep_dir)}"
                                if not sweep_dir.exists() else
                                f"{sweep_dir} is a file; give the sweep folder (sweeps/<name>)")
    rows, override_keys, skipped, bands, changed = [], set(), [], {}, {}
    summary_dirs = {p.parent for p in sweep_dir.rglob(SUMMARY)}
    stray = _stray(summary_dirs)
    for folder in sorted(summary_dirs - set(stray)):
        s = read_summary(folder)
        if s is None or (complete_only and not s.get("complete")):
            skipped.append(str(folder.relative_to(sweep_dir)))
            continue
        row = {"run_dir": str(folder.relative_to(sweep_dir)), "complete": bool(s.get("complete"))}
        for item in s.get("overrides", []):
            k, v = _parse_override(item)
            if k.startswith("hydra") or k in ("experiment", "sweep", "name") or k in NON_RESULT_KEYS:
                continue
            row[k] = cell(v)
            override_keys.add(k)
        for k, v in s.get("choices", {}).items():
            row.setdefault(k, v)
        meta = s.get("meta", {})
        if input_changed(meta):
            changed[row["run_dir"]] = describe_input(meta)
        for k, v in meta.items():
            row.setdefault(k, cell(v))
        row.update(coverage_columns(meta.get("cost_model_coverage")))
        row.update({k: cell(v) for k, v in s.get("metrics", {}).items()})
        row.update(band_columns(s.get("sim_band")))
        bands[row["run_dir"]] = s.get("sim_band")
        rows.append(row)
    failed = failed_jobs(sweep_dir)
    if not rows:
        why = (f" ({len(skipped)} interrupted or unreadable: relaunch the sweep to finish them)" if skipped else
               "" if failed else "; give a folder that `servelab -m ...` wrote, e.g. sweeps/<name>")
        if failed:
            why += f" ({len(failed)} failed job(s), first: {describe(failed[0])})"
        if stray:
            why += (f" (left out {', '.join(str(d.relative_to(sweep_dir) / SUMMARY) for d in stray)}: in a folder that "
                    "holds a sweep, not a job of it)")
        raise ValueError(f"no {'complete ' if complete_only else ''}runs (summary.json) under {sweep_dir}{why}")
    fill_overrides(rows, override_keys, sweep_dir)
    keys = label_keys(rows, override_keys)
    labels = policy_labels(rows, override_keys, RATE, keys)
    df = parquet_safe(pd.DataFrame(rows))
    df["policy"] = labels
    sort = [c for c in ("policy", RATE) if c in df]
    # labels in natural order (numbers in them as numbers: cpu_cache_num_blocks=512 before =1024)
    df = df.sort_values(sort, kind="stable", key=lambda c: c.map(natural_key) if c.name == "policy" else c) \
        .reset_index(drop=True)
    df.attrs["skipped"] = skipped         # job folders left out (complete=false or unreadable)
    # summary.json files left out: a single run's, in a folder that holds a sweep (output_dirs refuses that now)
    df.attrs["stray"] = [str(d.relative_to(sweep_dir) / SUMMARY) for d in stray]
    df.attrs["failed"] = [asdict(f) for f in failed]     # jobs that wrote no summary.json (job_record.FailedJob)
    df.attrs["sim_band"] = bands          # run_dir -> its summary's sim_band (None without one)
    df.attrs["input_changes"] = changed   # run_dir -> what its workload reader changed (describe_input), if anything
    df.attrs["label_keys"] = keys         # the override keys the policy labels name
    return df


LONG_LABEL_CHARS = 60     # a legend label longer than this gets a column of its own under the figure


def overview(df: pd.DataFrame, path, x: str = RATE, by: str = "policy", metrics=TL_METRICS) -> Path:
    """p50 (solid) and p99 (dashed) of each metric vs x, one colour per `by` value, side by side; shaded: the
    simulator's own band where the runs have one (plots.percentile_lines: markers and error bars for a
    single-rate sweep, each panel on a log axis when it spans more than plots.WIDE_DECADES decades). The legend
    sits under the figure: inside an axes it lay on a line sooner or later (srpt's p99 in kv_pressure, every
    point of a single-rate sweep)."""
    import matplotlib.pyplot as plt

    from experiments import plots  # selects the Agg backend; percentile_lines

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4))
    for ax, metric in zip(axes, metrics):
        points = plots.percentile_lines(ax, df, x, by, metric,
                                        same_cols=[f"{m}_p{p}" for m in metrics for p in (50, 99)])
        plots.log_if_wide(ax, df[[f"{metric}_p{p}" for p in (50, 99)]].to_numpy())
        ax.set_ylabel(plots.axis_label(metric))
        ax.grid(alpha=0.3, which="both")
    banded = any(c.endswith("_sim_band") and df[c].notna().any() for c in df.columns)
    handles, names = axes[0].get_legend_handles_labels()
    keys = plots.percentile_key(points, banded)
    fig.tight_layout()
    # labels of unrelated runs (one per differing override) are wider than an axes: one to a row, left-aligned;
    # short ones side by side
    long = max(map(len, names), default=0) > LONG_LABEL_CHARS
    fig.legend(handles + keys, names + [k.get_label() for k in keys], loc="upper left" if long else "upper center",
               bbox_to_anchor=(0.0, 0.0) if long else (0.5, 0.0), fontsize=7 if long else 8,
               ncol=1 if long else min(len(names) + len(keys), 8), alignment="left" if long else "center")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def make_report(sweep_dir, out_dir=None, x: str = RATE, by: str = "policy") -> tuple[pd.DataFrame, list[Path]]:
    """Collect the sweep, write results.csv/.parquet and the plots; returns (table, files). The report is drawn
    whole in a folder beside `out` and then published there (`publish`): df.attrs["kept"] names the folder an
    earlier, different report was moved to, df.attrs["unchanged"] says an identical one was left as it was."""
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir else sweep_dir / "report"
    if out.name in ("", ".", ".."):           # --out . : name the folder, so the earlier one can be kept beside it
        out = out.resolve()
    df = collect(sweep_dir)
    for flag, col in (("--x", x), ("--by", by)):
        if col not in df:
            cols = [c for c in df.columns if c != "run_dir"]
            raise ValueError(f"{flag} {col!r} is not a column of the sweep table{nearest(col, cols)} (columns: "
                             f"{', '.join(cols[:12])}, ...; all in report/results.csv)")
    names, df.attrs["kept"], df.attrs["unchanged"] = draw_and_publish(out, lambda d: _draw(df, sweep_dir, d, x, by))
    return df, [out / n for n in names]


def draw_and_publish(out: Path, draw) -> tuple[list[str], Path | None, bool]:
    """draw(folder) -> its files, into a fresh folder beside `out`, then published into `out` (`publish`); returns
    (the files' names, publish's kept folder, publish's unchanged)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".new"))
    try:
        names = [p.name for p in draw(staging)]
        return (names, *publish(staging, out))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _draw(df: pd.DataFrame, sweep_dir: Path, out: Path, x: str, by: str) -> list[Path]:
    """Every table and plot of the report into `out`; returns the files."""
    from experiments import plots

    files = [write_parquet(df, out / "results.parquet")]
    files.append(atomic_write_text(out / "results.csv", df.to_csv(index=False)))
    if df[by].nunique() > 1:
        diff = differences(df, df.attrs["sim_band"], by, x, keys=df.attrs["label_keys"] if by == "policy" else None)
        df.attrs["differences"] = diff
        files.append(atomic_write_text(out / "differences.csv", diff.to_csv(index=False)))
    if df.attrs["failed"]:
        table = pd.DataFrame([{**f, "overrides": " ".join(f["overrides"])} for f in df.attrs["failed"]])
        files.append(atomic_write_text(out / "failed_jobs.csv", table.to_csv(index=False)))
    if x in df and df[x].notna().any():
        files.append(overview(df, out / "overview.png", x, by))
        for metric in TL_METRICS:
            files.append(plots.throughput_latency(df, out / f"throughput_latency_{metric}.png", metric, x, by))
        # CDFs and timelines at each policy's highest rate
        top = df.loc[df.dropna(subset=[x]).groupby(by)[x].idxmax()]   # a group may lack x (another sweep's runs)
        if "slo_attainment_targets" in df and df["slo_attainment_targets"].notna().any():
            files.append(plots.attainment_vs_load(df, out / "slo_attainment.png", x, by))
    else:
        top = df.drop_duplicates(by)
    runs = {row[by]: sweep_dir / row["run_dir"] for _, row in top.iterrows()}
    reqs = {k: pd.read_parquet(d / "requests.parquet") for k, d in runs.items() if (d / "requests.parquet").is_file()}
    if reqs:
        title = _shown_at(top, x, by, list(reqs))
        for metric in ("ttft_s", "normalized_latency_s"):
            files.append(plots.latency_cdf(reqs, out / f"latency_cdf_{metric}.png", metric, log_x=True,
                                           title=title))
    if reqs and all("tenant" in r and r["tenant"].nunique() > 1 for r in reqs.values()):
        from experiments.tenant_metrics import service_difference, service_timeline
        diffs = {k: service_difference(service_timeline(r)) for k, r in reqs.items()}
        files.append(plots.service_difference_runs(diffs, out / "service_difference.png"))
    for k, d in runs.items():
        if (d / "steps.parquet").is_file():
            steps = pd.read_parquet(d / "steps.parquet")
            if len(steps):
                steps = steps[steps["replica"] == steps["replica"].min()]
                files.append(plots.step_timeline(steps, out / f"step_timeline_{safe_name(str(k))}.png",
                                                 title=f"{k} ({d.name})"))
    return files


def _shown_at(top: pd.DataFrame, x: str, by: str, keys: list) -> str | None:
    """The title of the report's CDFs: the x value of the runs they show (each `by` value's highest), one value
    when all share it, else each value's own; None without an x."""
    if x not in top or top[x].isna().all():
        return None
    from experiments.plots import value_text
    at = {row[by]: value_text(row[x]) for _, row in top.iterrows() if row[by] in keys}
    unit = " req/s" if x == RATE else ""
    if len(set(at.values())) == 1:
        return f"at {'' if x == RATE else x + ' = '}{next(iter(at.values()))}{unit} (the sweep's highest)"
    return f"each at its highest {'request rate' if x == RATE else x}: " + ", ".join(
        f"{k} {v}{unit}" for k, v in at.items())


# Files a report writes: in the report folder, one of these is an earlier report's (other files there are not
# the report's, and stay where they are).
REPORT_FILES = ("results.csv", "results.parquet", "failed_jobs.csv", "differences.csv", "overview.png",
                "throughput_latency_*.png", "latency_cdf_*.png", "step_timeline_*.png", "slo_attainment.png",
                "service_difference.png")


def publish(staging: Path, out: Path) -> tuple[Path | None, bool]:
    """Move the report drawn in `staging` into `out`; returns (the folder the earlier report was kept in, or None;
    whether `out` already held this very report). A report is derived from the runs, so the same runs and options
    give the same files, byte for byte: an earlier report equal to this one is left as it is. One that differs
    (runs added, other --x/--by, another servelab) moves to out.<N>/ first (experiments/kept_copies.py): numbers
    read from it stay on disk, and every report file in `out` shows the runs just read."""
    new = {p.name: p for p in staging.iterdir()}
    old = {p.name: p for p in out.iterdir() if p.is_file() and (p.name in new or any(
        fnmatch.fnmatchcase(p.name, pattern) for pattern in REPORT_FILES))} if out.is_dir() else {}
    if old and old.keys() == new.keys() and all(filecmp.cmp(old[n], new[n], shallow=False) for n in new):
        return None, True
    kept = None
    if old:
        kept = kept_name(out)
        kept.mkdir()
        for p in old.values():
            os.replace(p, kept / p.name)
    out.mkdir(parents=True, exist_ok=True)
    for p in new.values():
        os.replace(p, out / p.name)
    return kept, False


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="servelab-report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="a sweep folder, e.g. sweeps/fcfs_vs_preemptive")
    ap.add_argument("--out", default=None, help="where to write the report (default: SWEEP_DIR/report)")
    ap.add_argument("--x", default=RATE, help=f"x-axis column (default {RATE})")
    ap.add_argument("--by", default="policy", help="one line per value of this column (default policy)")
    args, unknown = ap.parse_known_args(argv)
    if unknown:     # argparse names a misspelt option without the one meant
        options = [o for a in ap._actions for o in a.option_strings if o.startswith("--")]
        flag = next((u for u in unknown if u.startswith("-")), unknown[0])
        ap.exit(2, f"servelab-report: error: unrecognized argument {flag.split('=', 1)[0]!r}"
                   f"{nearest(flag.split('=', 1)[0], options)} (options: {', '.join(options)})\n")
    try:
        df, files = make_report(args.sweep_dir, args.out, args.x, args.by)
    except (FileNotFoundError, ValueError) as e:
        ap.exit(2, f"servelab-report: error: {one_line(e)}\n")
    cols = [c for c in (args.by, args.x, "num_finished", "request_throughput_rps", "ttft_s_p50", "ttft_s_p99",
                        "tpot_s_p99", "normalized_latency_s_p99", "num_preemptions",
                        "slo_attainment_targets", "goodput_targets_rps", "jain_index", "service_diff_rate_mean",
                        "cost_model_share_steps_outside", "cost_model_share_time_outside")
            if c in df and df[c].notna().any()]     # SLO and fairness columns only for runs that have them
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if "jain_index" in cols and df["jain_index"].isna().any():
        print(f"jain_index, service_diff_rate_mean: NaN in {int(df['jain_index'].isna().sum())} of {len(df)} runs, "
              "which had no time window with two tenants backlogged (nothing to share: docs/metrics.md)")
    skipped = df.attrs.get("skipped", [])
    runs = f"{len(df)} run{'s' * (len(df) != 1)}"
    print(f"read {runs} under {args.sweep_dir}" + (f" (left out {len(skipped)} incomplete: "
          f"{', '.join(skipped)})" if skipped else "") + ":")
    for d in df["run_dir"]:
        print(f"  {d}")
    for line in input_change_lines(df.attrs.get("input_changes", {}), len(df)):
        print(line)
    for path in df.attrs.get("stray", []):
        print(f"left out {path}: a single run's summary in a folder that holds a sweep, not a job of the sweep")
    failed = df.attrs.get("failed", [])
    if failed:
        print(f"FAILED: {len(failed)} job(s) wrote no results (relaunch the sweep to run only those):")
        for f in failed:
            print(f"  {describe(f)}")
    diff = df.attrs.get("differences")
    if diff is not None:
        print(f"differences between {args.by} values (report/differences.csv): {count_line(diff)}")
    out, kept = files[0].parent, df.attrs.get("kept")
    if df.attrs.get("unchanged"):
        print(f"{len(df)} runs; {out} already holds this report (the same {len(files)} files, left as they were)")
    else:
        print(f"{len(df)} runs; wrote {len(files)} files to {out}" + (
            f"; the earlier report there differs (other runs or options) and is kept in {kept}" if kept else ""))


if __name__ == "__main__":
    main()
