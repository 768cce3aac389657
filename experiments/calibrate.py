"""Fit the `calibrated` cost model to per-step timing tables and save it as a small JSON.

    python -m experiments.calibrate table.csv [steps.parquet ...] --out profile.json [--hardware H200] \
        [--model Qwen3-0.6B] [--eval other_steps.parquet ...]

Input tables (CSV or parquet, columns of sim.cost_model.base.STEP_TABLE_COLUMNS):
a profile (experiments.profile: `ModelRunner.execute` alone, over a grid of
shapes) and / or a real run's steps table (engine recorder:
`python -m experiments.validate --steps-out`, or `servelab backend=engine`'s
steps.parquet), whose targets become cycle times and which also fit the serving
loop's own host terms (experiments/step_tables.py). Fitting on both gives the
grid's coverage of shapes and the real loop's overheads.

The fit runs on a random 80% of the rows and the other 20% measure the held-out
error, overall and per input table (median, p90 and max of |predicted -
measured| / measured, and the sum of predictions over the sum of measurements:
the bias a simulator's clock accumulates); then the model is refitted on all
rows and saved with those errors, the command, the fit date and the profile's
metadata (device, model) from `<table>.meta.json` when present. `--eval` tables
are never fitted on: e.g. a real run on another slice of the trace (held out by
workload).

A replay's steps are also checked for drift: the fitted model's median relative residual in each tenth of
the replay's run (`replay_drift`, in the saved metadata). On a steady host the tenths agree within about 1%;
a host whose speed moves within one replay (another tenant, frequency scaling) spreads them further, and past
REPLAY_DRIFT_WARN (sim/cost_model/fit_trust.py) the command prints a WARNING: the fit's host terms carry that
host's state, and its prices are a worse guide to other machines (benchmarks/results/generalize/h100_1207q/: 7-10%
there, 0.5-1.5% on three other H100s). So does a device model off its own held-out steps (fit_trust).

Where tables hold each step's device seconds (`device_time_s`: the profile's, a replay's with overlap
scheduling), the same terms are also fitted to those alone and saved as the file's `device` model: the
simulator's price of a step under overlap scheduling (sim/cost_model/calibrated.py). `--device-tables`
are fitted for that model only (an overlapped replay's step times are not the synchronous loop's).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.step_tables import read_step_table
from sim.cost_model.calibrated import KNEE_CANDIDATES, OBJECTIVES, CalibratedCostModel, relative_errors
from sim.cost_model.calibrated_fit import (
    MIXED_WALK_RATIOS,
    WALK_RATIO_MAX_RIDING,
    decode_single_split_min_seqs,
    prefill_host_after_share,
)
from sim.cost_model.fit_identity import model_dims_of, resolve_model_name
from sim.cost_model.fit_trust import REPLAY_DRIFT_WARN, fit_concerns, fit_warning
from sim.cost_model.prefill_span import PrefillSpanGrid
from sim.overlap_timeline import table_restarts

DRIFT_MIN_ROWS = 100   # rows a replay needs for its tenths to mean anything


def replay_drift(model, table: pd.DataFrame) -> dict[str, dict]:
    """source -> {"range": max - min, "tenths": [...]} of `model`'s median relative residual (predicted / measured
    - 1) in each tenth of that source's rows by start time, for every source with start times (a replay's steps;
    a profile grid has none) and DRIFT_MIN_ROWS rows or more."""
    out = {}
    if "start_time_s" not in table or "source" not in table:
        return out
    for src, sub in table.groupby("source", sort=False):
        sub = sub[np.isfinite(sub["start_time_s"].to_numpy(dtype=np.float64))]
        if len(sub) < DRIFT_MIN_ROWS:
            continue
        resid = model.predict_table(sub) / sub["duration_s"].to_numpy() - 1
        tenth = np.minimum((sub["start_time_s"].rank(method="first").to_numpy() - 1) * 10 // len(sub), 9)
        med = pd.Series(resid).groupby(tenth).median()
        out[str(src)] = {"range": float(med.max() - med.min()), "tenths": [round(float(x), 4) for x in med]}
    return out


def read_table(path) -> pd.DataFrame:
    return read_step_table(path)


def heldout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices: a random `fraction` of rows held out, at least one row each."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"heldout fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"need at least 2 rows to hold some out, got {n}")
    perm = np.random.default_rng(seed).permutation(n)
    k = min(max(1, int(round(fraction * n))), n - 1)
    return np.sort(perm[k:]), np.sort(perm[:k])


def error_stats(pred: np.ndarray, true: np.ndarray) -> dict:
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    if len(true) == 0:
        return {"median_rel_err": None, "p90_rel_err": None, "max_rel_err": None, "sum_pred_over_real": None,
                "num_rows": 0}
    e = relative_errors(pred, true)
    return {"median_rel_err": float(np.median(e)), "p90_rel_err": float(np.percentile(e, 90)),
            "max_rel_err": float(e.max()), "sum_pred_over_real": float(pred.sum() / true.sum()),
            "num_rows": int(len(e))}


def _valid(table: pd.DataFrame) -> pd.DataFrame:
    return table[np.isfinite(table["duration_s"]) & (table["duration_s"] > 0)].reset_index(drop=True)


def _by_source(model, table: pd.DataFrame, rows: np.ndarray) -> dict:
    """Error stats of `model` on `rows` of `table`, overall and per `source` value."""
    part = table.iloc[rows]
    out = {"all": error_stats(model.predict_table(part), part["duration_s"].to_numpy())}
    if "source" in part.columns and part["source"].nunique() > 1:
        for src, sub in part.groupby("source", sort=False):
            out[str(src)] = error_stats(model.predict_table(sub), sub["duration_s"].to_numpy())
    return out


def calibrate(table: pd.DataFrame, *, heldout_fraction: float = 0.2, seed: int = 0,
              knee_candidates=KNEE_CANDIDATES, objective: str = "relative", robust: bool = True,
              metadata: dict | None = None, eval_tables: dict | None = None,
              single_split_min_seqs: int | None = None, prefill_span_pairs: float | None = None,
              prefill_graph_max_tokens: int | None = None, prefill_span_grid: PrefillSpanGrid | None = None,
              device_tables: list | None = None,
              mixed_walk_ratios=MIXED_WALK_RATIOS) -> tuple[CalibratedCostModel, dict]:
    """Held-out error of a fit on the rest, then the model refitted on every row; returns (model, report).

    table: one calibration table (an optional `source` column names each row's input, for per-source errors).
    eval_tables: name -> table never fitted on, scored with the final model.
    single_split_min_seqs: the decode batch size from which the engine's decode kernel stops splitting keys
    (decode_tail_keys; main() derives it from the profile's SM and KV-head counts). prefill_span_grid: the prefill
    kernel's program grid, whose makespan prices prefill_attention_span (main() derives it from the SM and head
    counts; prefill_span_pairs: the older spread-or-walk rule instead). prefill_graph_max_tokens: the profiled
    engine's largest prefill CUDA graph (main(): the profile's record, profile_graph_max_tokens).
    device_tables: tables fitted for the device model only (device_table): e.g. a replay with overlap
    scheduling, whose step times are not the synchronous loop's but whose device seconds are measured.
    mixed_walk_ratios: candidates for the ratio of a prefill entry's context from which a riding decode's keys
    cost (calibrated_fit.mixed_decode_tail_keys; with a grid and prefill graphs, a riding decode's key costs
    1 / ratio of a prefill program's in the prefill kernel's makespan), chosen by training error at the chosen knee.

    With a device model (rows with device seconds) and the serving loop's synchronous rows, the step-time model
    is the device model plus host terms fitted on what it leaves of those rows
    (CalibratedCostModel.fit_device_plus_host); otherwise one joint fit of every term.
    """
    table = _valid(table)
    opts = dict(knee_candidates=knee_candidates, objective=objective, robust=robust,
                single_split_min_seqs=single_split_min_seqs, prefill_span_pairs=prefill_span_pairs,
                prefill_graph_max_tokens=prefill_graph_max_tokens, prefill_span_grid=prefill_span_grid,
                mixed_walk_ratios=tuple(mixed_walk_ratios))
    d_opts = dict(opts, run_share=DEVICE_RUN_SHARE, kind_floor=DEVICE_KIND_FLOOR)
    extra = [back_to_back_device_s(_valid(t)) for t in (device_tables or [])]
    train, test = heldout_split(len(table), heldout_fraction, seed)

    def fitted(rows: pd.DataFrame, meta: dict | None) -> tuple[CalibratedCostModel, dict | None]:
        """(the step-time model, the device model's held-out error) fitted on rows (and the device tables)."""
        device = device_table(pd.concat([rows, *extra], ignore_index=True))
        if device is None:
            return CalibratedCostModel.fit(rows, metadata=meta, **opts), None
        # the device's share alone: overlap scheduling hides the rest (CalibratedCostModel.host_time_s)
        d_train, d_test = heldout_split(len(device), heldout_fraction, seed)
        d_part = CalibratedCostModel.fit(device.iloc[d_train], **d_opts)
        d_held = error_stats(d_part.predict_table(device.iloc[d_test]), device["duration_s"].to_numpy()[d_test])
        dev = CalibratedCostModel.fit(device, metadata=dict(heldout=d_held, target="device_time_s"), **d_opts)
        gap = launch_gap_s(extra)
        if gap:
            dev = dev.with_step_added(gap, launch_gap_s=gap)
        model = CalibratedCostModel.fit_device_plus_host(rows, dev, metadata=meta)
        if model is None:
            model = CalibratedCostModel.fit(rows, metadata=meta, **opts)
            model.device_model = dev
            return model, d_held
        # of the host's cost per prefill token, what the overlapped replays' launches leave runs after the tokens
        share = prefill_host_after_share(extra, model.host_prefill_token_s)
        return (model if share is None else model.with_prefill_host_after_share(share)), d_held

    part, _ = fitted(table.iloc[train], None)
    heldout = _by_source(part, table, test)
    heldout["all"].update(fraction=heldout_fraction, seed=seed)
    meta = dict(metadata or {})
    meta["heldout"] = heldout["all"]
    meta["heldout_by_source"] = {k: v for k, v in heldout.items() if k != "all"}
    model, d_held = fitted(table, meta)
    model.metadata["train_error_all_rows"] = _by_source(model, table, np.arange(len(table)))["all"]
    if d_held is not None:
        model.metadata["device_heldout"] = d_held
    report = {"heldout": heldout["all"], "heldout_by_source": meta["heldout_by_source"],
              "train": model.metadata["train_error_all_rows"], "eval": {}}
    for name, t in (eval_tables or {}).items():
        t = _valid(t)
        report["eval"][name] = error_stats(model.predict_table(t), t["duration_s"].to_numpy())
    if report["eval"]:
        model.metadata["eval_not_fitted"] = report["eval"]
    return model, report


# The overlapped replays' share of the device model's row weights (the profile has the rest). Their device seconds
# are what the simulator prices; the profile's, timed in a loop of one shape, ran 2-6% below them for the same
# shapes on one H200 (decode graphs of 8-16 sequences, prefills), while the profile still fixes the shapes a
# replay never reaches (large batches, long prompts). On the 2026-12-01 same-machine suite
# (benchmarks/results/generalize/same_machine/) shares 0.5 / 0.65 / 0.8 / 0.95 gave a median E2E error of
# 2.8 / 2.5 / 2.0 / 1.1% over 20 (workload, policy) runs; 0.95 was chosen there, so those runs are not unseen
# for this one number (docs/validation.md).
DEVICE_RUN_SHARE = 0.95
# Each step kind's least share of the replays' weight in the device model (calibrated_fit.source_weights: decode,
# prefill, intermediate chunk alone, mixed). The calibration replays hold a few dozen intermediate chunks alone
# among ~10k rows, so without a floor one H100's fit (benchmarks/results/generalize/h100_1206b/) priced them 3%
# low and prefix_share's sarathi, made of them for a third of its time, came out 5.4% off. 0.05 was chosen on that
# suite (0.05: max 1.5%; 0.10: max 6.3%, the mixed chunks then 1.7% low); the two suites fitted elsewhere
# (h200_1206, h100_1205c), not used to choose it, moved from max 5.0 / 4.7% to 3.3 / 4.2% (docs/validation.md).
DEVICE_KIND_FLOOR = 0.05
MIN_DEVICE_ROWS = 50     # fewer rows with device seconds than this: no device model


def profile_graph_max_tokens(prof: dict) -> int | None:
    """The profiled engine's largest prefill CUDA graph: the profile's record, or for a profile made before it was
    recorded, the engine's default where its CUDA graphs were on (0 without them; None without a sidecar)."""
    if "prefill_graph_max_tokens" in prof:
        return prof["prefill_graph_max_tokens"]
    if "cuda_graphs" not in prof:
        return None
    from engine.config import EngineConfig
    return EngineConfig.prefill_graph_max_tokens if prof["cuda_graphs"] else 0


LAUNCH_GAP_MAX_SHARE = 0.1


def launch_gap_s(tables: list[pd.DataFrame]) -> float | None:
    """Seconds the device idles between two back-to-back steps of the overlap loop: the median, over the
    overlapped replays' pure decode rows that follow the row before without a gap (no prefill, no block copies,
    device seconds measured, the cycle within LAUNCH_GAP_MAX_SHARE of them: the device, not the host, set the
    pace), of the row's cycle time less its device seconds. None with fewer than MIN_DEVICE_ROWS such rows.

    A step's device seconds are CUDA events around its own work, so they miss the launch of the next step's
    first kernel behind the last one of this step. Overlap scheduling hides every other host second, not that
    one: on one H100 (benchmarks/results/generalize/h100_1205c/) the decode cycles of all four overlapped
    calibration replays and of the five unseen families outlast their device seconds by 7-9.5 us (mean per
    family), where a device model alone priced them to 0.0-0.3 us. The device model takes it in its `step`
    term; the synchronous loop's total does not move (fit_device_plus_host fits the host terms on what the
    device model leaves)."""
    gaps = []
    for t in tables:
        if not len(t) or "device_time_s" not in t or "start_time_s" not in t or "serving_loop" not in t:
            continue
        dev = t["device_time_s"].to_numpy(dtype=float)
        rows = ((t["num_prefill_seqs"].to_numpy() == 0) & (t["num_decode_seqs"].to_numpy() > 0)
                & (t["num_swap_blocks"].to_numpy() == 0) & np.isfinite(dev) & (dev > 0)
                & ~table_restarts(t) & (t["serving_loop"].to_numpy() == 1))
        gap = t["duration_s"].to_numpy(dtype=float)[rows] - dev[rows]
        # a row whose cycle outlasts its device seconds by more than this share waited for the host: not a launch
        gaps.append(gap[(gap >= 0) & (gap <= LAUNCH_GAP_MAX_SHARE * dev[rows])])
    gaps = np.concatenate(gaps) if gaps else np.empty(0)
    return float(np.median(gaps)) if len(gaps) >= MIN_DEVICE_ROWS else None


def _swap_only_rows(table: pd.DataFrame) -> np.ndarray:
    seqs = table["num_prefill_seqs"].to_numpy(dtype=float) + table["num_decode_seqs"].to_numpy(dtype=float)
    return (table["num_swap_blocks"].to_numpy(dtype=float) > 0) & (seqs == 0)


def back_to_back_device_s(table: pd.DataFrame) -> pd.DataFrame:
    """A real run's table (in step order) with device_time_s dropped (NaN) on the rows launched on an idle
    device (sim.overlap_timeline.restarts: a row starting after a gap behind the one before).

    A step's device seconds are CUDA events from its first input copy to its sampled tokens, which time the
    device alone only where it runs steps back to back. On an idle device the first copy starts the events while
    the host still prepares and launches: on the H200 calibration replays the device model priced such prefill
    rows 0.65 (vllm) and 0.89 (sarathi) of their events' seconds, the same shapes back to back 0.99 and 1.04
    (benchmarks/results/generalize/h200_1203/). They are not the device's seconds, so they are not fitted."""
    if "device_time_s" not in table or "start_time_s" not in table or not len(table):
        return table
    idle = table_restarts(table)
    return table.assign(device_time_s=np.where(idle, np.nan, table["device_time_s"].to_numpy(dtype=float)))


def device_table(table: pd.DataFrame) -> pd.DataFrame | None:
    """The rows with measured device seconds, with device_time_s as the target and no serving-loop share
    (the loop is host work); None when the tables have fewer than MIN_DEVICE_ROWS such rows."""
    if "device_time_s" not in table:
        return None
    dev = table["device_time_s"].to_numpy(dtype=float)
    swap_only = _swap_only_rows(table) & ~np.isfinite(dev)
    if swap_only.any():
        # Older profiles timed swaps as steps of copies alone, without device seconds (the grid now times them
        # beside a decode batch, with its events); a swap's copies run on the device's stream
        # (overlapped replays: 0.99 of a swap step's time is device time on bursty mlfq's 189 swap steps), so
        # the device model prices them as the step does. Without them its swap terms were 0 and the simulator
        # hid every swap behind the forward pass.
        dev = np.where(swap_only, table["duration_s"].to_numpy(dtype=float), dev)
        table = table.assign(device_time_s=dev)
    rows = np.isfinite(dev) & (dev > 0)
    if rows.sum() < MIN_DEVICE_ROWS:
        return None
    out = table[rows].drop(columns=[c for c in ("measured_duration_s",) if c in table]).copy()
    return out.assign(duration_s=out["device_time_s"], serving_loop=0, fit_group=out["serving_loop"])


def _fmt(s: dict) -> str:
    if not s.get("num_rows"):
        return "no rows"
    return (f"median |rel err| {100 * s['median_rel_err']:.1f}%, p90 {100 * s['p90_rel_err']:.1f}%, "
            f"sum pred/real {s['sum_pred_over_real']:.3f} ({s['num_rows']} rows)")


def _spec_dims(model_name: str) -> dict | None:
    """The published dimensions of the model a name stands for (sim.specs), recorded where no profile sidecar
    gives the checkpoint's own; the simulator checks a run's model against them (sim.cost_model.fit_identity)."""
    spec = resolve_model_name(model_name)
    return None if spec is None else model_dims_of(spec)


def _ratios(text: str) -> tuple[float, ...]:
    try:
        ratios = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--mixed-walk-ratios {text!r}: give comma-separated numbers in (0, 1], e.g. 1,0.9") from None
    if not ratios or not all(0 < r <= 1 for r in ratios):
        raise ValueError(f"--mixed-walk-ratios {text!r}: each ratio must be in (0, 1], e.g. 1,0.9")
    return ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", help="step tables (CSV or parquet): profiles and / or real runs' steps")
    ap.add_argument("--out", required=True, help="output JSON (written atomically)")
    ap.add_argument("--eval", nargs="*", default=[], metavar="TABLE", help="tables to score but never fit on")
    ap.add_argument("--hardware", default=None, help="hardware name to record (default: the profile's device)")
    ap.add_argument("--model", default=None, help="model name to record (default: the profile's model path); a "
                    "name sim.specs knows (e.g. Qwen3-0.6B, or Qwen3-0.6B-random) also records its dimensions when "
                    "the profile has no <table>.meta.json")
    ap.add_argument("--device-tables", nargs="*", default=[], metavar="TABLE",
                    help="tables fitted for the device model only (their device_time_s): e.g. a replay with overlap "
                         "scheduling (experiments.validate --overlap-scheduling --steps-out)")
    ap.add_argument("--heldout", type=float, default=0.2, help="fraction of rows held out (default 0.2)")
    ap.add_argument("--objective", default="relative", choices=OBJECTIVES,
                    help="residual weighting: relative (default), sqrt or absolute")
    ap.add_argument("--no-robust", action="store_true", help="plain NNLS (no down-weighting of outlier rows)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mixed-walk-ratios", default=",".join(f"{r:g}" for r in MIXED_WALK_RATIOS), metavar="R,R,...",
                    help="candidates for the share of a chunk's context from which a riding decode's keys cost "
                         "(chosen by training error; one value fixes it; default %(default)s)")
    args = ap.parse_args(argv)

    frames, sources = [], []
    for t in args.tables:
        df = read_table(t)
        frames.append(df.assign(source=Path(t).name))
        meta_path = Path(str(t) + ".meta.json")
        src = {"table": str(t), "rows": int(len(df)), "serving_loop": bool(df["serving_loop"].iloc[0]) if len(df)
               else None}
        if meta_path.is_file():
            src["profile"] = json.loads(meta_path.read_text())
        sources.append(src)
    names = [Path(t).name for t in args.tables]
    if len(set(names)) != len(names):
        raise ValueError(f"input tables must have distinct file names (they label the per-source errors), got {names}")
    table = pd.concat(frames, ignore_index=True)
    prof = next((s["profile"] for s in sources if "profile" in s), {})
    model_name = args.model or prof.get("model_path", "unknown")
    meta = {
        "hardware": args.hardware or prof.get("device", "unknown"),
        "device": prof.get("device"),
        "model": model_name,
        "model_dims": prof.get("model") or _spec_dims(model_name),
        "dtype": prof.get("dtype"),
        "attention_backend": prof.get("attention_backend"),
        "cuda_graphs": prof.get("cuda_graphs"),
        "command": "python -m experiments.calibrate " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "profile_command": prof.get("command"),
        "profile_date": prof.get("date"),
        "sources": [{k: v for k, v in s.items() if k != "profile"} for s in sources],
        "num_sms": prof.get("num_sms"),
    }
    # the decode kernel's split rule needs the GPU's SM count (a profile made before it was recorded: none)
    dims = meta["model_dims"] or {}
    split_min = decode_single_split_min_seqs(prof.get("num_sms"), dims.get("num_kv_heads"))
    span_grid = PrefillSpanGrid.from_counts(prof.get("num_sms"), dims.get("num_q_heads"), dims.get("num_kv_heads"))
    evals = {Path(t).name: read_table(t) for t in args.eval}
    model, report = calibrate(table, heldout_fraction=args.heldout, seed=args.seed, objective=args.objective,
                              robust=not args.no_robust, metadata=meta, eval_tables=evals,
                              single_split_min_seqs=split_min, prefill_span_grid=span_grid,
                              prefill_graph_max_tokens=profile_graph_max_tokens(prof),
                              device_tables=[read_table(t).assign(source=Path(t).name) for t in args.device_tables],
                              mixed_walk_ratios=_ratios(args.mixed_walk_ratios))
    drift = replay_drift(model, _valid(table))
    model.metadata["replay_drift"] = drift
    model.save(args.out)
    print(f"{model!r}")
    print(f"held-out: {_fmt(report['heldout'])}")
    for name, s in report["heldout_by_source"].items():
        print(f"  held-out rows of {name}: {_fmt(s)}")
    print(f"all rows after refit: {_fmt(report['train'])}")
    if model.device_model is not None:
        print(f"device seconds alone (the host share overlap hides is the rest), held-out: "
              f"{_fmt(model.metadata['device_heldout'])}")
        gap = model.device_model.metadata.get("launch_gap_s")
        if gap:
            print(f"the device's idle time between two overlapped steps (launch_gap_s, in its step term): "
                  f"{1e6 * gap:.1f} us")
    errors = (model.device_model or model).metadata.get("mixed_walk_ratio_errors")
    if errors:
        print(f"mixed_walk_ratio {model.mixed_walk_ratio:g}, by weighted training error per candidate (fits "
              f"without the chunks carrying more than {WALK_RATIO_MAX_RIDING} decodes, riding keys at one price, the "
              f"profile's mixed shapes at a level of their own): "
              + ", ".join(f"{r} {e:.4g}" for r, e in errors.items()))
    for name, s in report["eval"].items():
        print(f"not fitted on, {name}: {_fmt(s)}")
    for name, d in drift.items():
        line = (f"drift within {name}: residual medians by tenth of its run span {100 * d['range']:.1f}% "
                f"({', '.join(f'{100 * x:+.1f}' for x in d['tenths'])}%)")
        if d["range"] > REPLAY_DRIFT_WARN:
            line = (f"WARNING: {line}: this host's step times moved within one replay, and the fit's host terms "
                    f"carry its state; repeat the replay on a quiet host, or expect the fit to transfer worse")
        print(line)
    line = fit_warning(fit_concerns(model.metadata, overlapped=True), "this fit")    # the device model's held-out bias
    if line:
        print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from experiments.user_errors import run_main
    sys.exit(run_main(main))
