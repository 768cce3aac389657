"""Step tables as calibration input: a profile (execute() alone) or a real run's steps table (the serving loop).

    table = read_step_table("steps.parquet")       # CSV or parquet; a real run's table gets cycle-time targets

Two kinds of table have the columns of sim.cost_model.base.STEP_TABLE_COLUMNS:

  * a profile (experiments.profile; it has a `kind` column): `duration_s` is
    one `ModelRunner.execute` call. It gets `serving_loop = 0`.
  * a real run's steps table (engine.core.recorder via experiments.validate
    --steps-out or `servelab backend=engine`; it has `start_time_s`): the
    simulator's clock advances by one step's duration and the next step starts
    at once, while the engine also spends host time between steps
    (postprocess, finished requests, arrivals). So the target becomes the
    *cycle time*: `duration_s` plus the gap to the next step's start, where
    the loop did not sit idle waiting for an arrival (a gap longer than
    IDLE_GAP_S, or the last step, gets the median of the other gaps). It gets
    `serving_loop = 1`, `measured_duration_s` keeps the original column, and `idle_before_s` is the time from
    the previous row's end to its start (NaN on the first row): a row after a long one was scheduled by a loop
    that had sat idle (the calibrated model's cold_step).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost_model.base import STEP_TABLE_COLUMNS

IDLE_GAP_S = 0.002    # longer than any postprocess the H200 runs showed (~0.3 ms at 256 sequences): an idle wait


def read_step_table(path) -> pd.DataFrame:
    """A calibration table from a CSV or parquet file (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"step table not found: {p}")
    df = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
    missing = [c for c in STEP_TABLE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: lacks column(s) {missing}; give a profile (python -m experiments.profile) or a real "
                         f"run's steps table (python -m experiments.validate --steps-out, or backend=engine)")
    return calibration_table(df)


def is_run_table(df: pd.DataFrame) -> bool:
    """A real run's steps table (start times, no profile `kind`)."""
    return "start_time_s" in df.columns and "kind" not in df.columns


def calibration_table(df: pd.DataFrame) -> pd.DataFrame:
    """df with `serving_loop` set and, for a real run's table, cycle-time targets (module docstring)."""
    if "serving_loop" in df.columns:
        return df
    if not is_run_table(df):
        return df.assign(serving_loop=0)
    if "replica" in df.columns and df["replica"].nunique() > 1:
        cycle, idle = np.empty(len(df)), np.empty(len(df))
        for _, rows in df.groupby("replica").indices.items():
            cycle[rows], idle[rows] = cycle_times(df.iloc[rows]), idle_before(df.iloc[rows])
    else:
        cycle, idle = cycle_times(df), idle_before(df)
    return df.assign(measured_duration_s=df["duration_s"], duration_s=cycle, serving_loop=1, idle_before_s=idle)


def idle_before(steps: pd.DataFrame) -> np.ndarray:
    """Per step of one replica, in order: seconds from the previous step's end to its start (NaN for the first)."""
    start = np.asarray(steps["start_time_s"], dtype=np.float64)
    end = start + np.asarray(steps["duration_s"], dtype=np.float64)
    return np.concatenate([[np.nan], start[1:] - end[:-1]]) if len(start) else start


def cycle_times(steps: pd.DataFrame, idle_gap_s: float = IDLE_GAP_S) -> np.ndarray:
    """Per step: duration plus the host gap to the next step's start (seconds); see the module docstring."""
    start = np.asarray(steps["start_time_s"], dtype=np.float64)
    dur = np.asarray(steps["duration_s"], dtype=np.float64)
    if len(start) == 0:
        return dur
    if np.any(np.diff(start) < 0):
        raise ValueError("steps table: start_time_s must be non-decreasing (one replica, in step order); "
                         "split a multi-replica table by its `replica` column first")
    gap = np.append(idle_before(steps)[1:], np.inf)     # [rows] the gap after each step
    busy = (gap >= 0) & (gap <= idle_gap_s)
    typical = float(np.median(gap[busy])) if busy.any() else 0.0
    return dur + np.where(busy, gap, typical)


def run_was_overlapped(info) -> bool:
    """Whether a real run (its RunResult.info) ran with overlap scheduling (docs/overlap.md)."""
    return bool(((info or {}).get("engine") or {}).get("overlap_scheduling"))


def priced_steps(steps: pd.DataFrame, cost_model, overlapped: bool = False) -> tuple[pd.DataFrame, np.ndarray]:
    """(calibration table of a real run's steps, the cost model's seconds for each): cycle-time targets, and
    each step priced as the simulator prices it (overlapped: the rows of one run in step order, timed as the
    simulator's overlap loop times them: CalibratedCostModel.predict_table, sim/overlap_timeline.py)."""
    st = calibration_table(steps.assign(block_size=getattr(cost_model, "block_size", 16)))
    pred = cost_model.predict_table(st, overlapped=True) if overlapped else cost_model.predict_table(st)
    return st, pred
