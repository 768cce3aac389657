"""A run's summary.json values as cells of the sweep table (experiments.report): flat, and writable to parquet.

A summary's meta holds nested values: cost_model_coverage (a dict whose outside_by is {} when no step left the
fitted envelope), dropped_lines and skipped_lines (lists). Parquet has no struct without fields, and one column
cannot hold a struct in one row and a number or text in another, so `cell` writes every nested value as one
JSON text cell, and `parquet_safe` turns a column mixing text with other values into text. The cost model's
coverage also gets flat columns (`coverage_columns`), so a sweep's table says per run how much of it the fit
extrapolated.
"""
from __future__ import annotations

import json

import pandas as pd

# column of the sweep table -> key of summary.json meta.cost_model_coverage (sim.cost_model.envelope.coverage)
COVERAGE_COLUMNS = {
    "cost_model_share_steps_outside": "share_steps_outside",    # fraction of the run's steps outside the envelope
    "cost_model_share_time_outside": "share_time_outside",      # fraction of its simulated step seconds outside
    "cost_model_num_steps_outside": "num_steps_outside",
    "cost_model_time_outside_s": "time_outside_s",
}
OUTSIDE_BY = "cost_model_outside_by"       # "dimension=steps, ..." of the dimensions some step exceeds ("" if none)


def cell(value):
    """A summary value as one table cell: dicts and lists as JSON text (keys sorted), anything else as it is."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return value


def coverage_columns(coverage) -> dict:
    """The flat columns of a run's meta.cost_model_coverage ({} for a run without one: not a fitted cost model,
    or a file fitted before envelopes were recorded)."""
    if not isinstance(coverage, dict):
        return {}
    out = {col: coverage.get(key) for col, key in COVERAGE_COLUMNS.items()}
    by = coverage.get("outside_by") or {}
    out[OUTSIDE_BY] = ", ".join(f"{k}={v}" for k, v in sorted(by.items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """df with each object column that mixes text with other values (an override `5` in one run, `high` in
    another) as text; missing cells stay missing."""
    for col in df.columns:
        if df[col].dtype != object:
            continue
        present = df[col][df[col].notna()]
        kinds = {type(v) for v in present}
        if str in kinds and len(kinds) > 1:
            df[col] = df[col].map(lambda v: v if v is None or (isinstance(v, float) and v != v) else str(v))
    return df
