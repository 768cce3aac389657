"""Readers for public request traces (the public files and their formats: docs/experiments.md).

Every reader returns a Workload in arrival order with request ids 0..n-1, and
takes the TraceOptions keywords (time_scale / target_rate_rps, start_offset_s,
max_requests, max_model_len, too_long, priorities, seed, tenant_column / ttft_slo_column /
tpot_slo_column naming the columns of tenants and SLO targets) plus
on_error="raise"|"skip". `workload.stats` counts rows read, skipped and clipped.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.core.requests import Workload, WorkloadStats
from experiments.workloads._io import check_on_error, read_csv_columns, read_jsonl_columns
from experiments.workloads.options import TraceOptions, class_columns, classes_from, finalize, make_options

AZURE_COLUMNS = {"TIMESTAMP": "timestamp", "ContextTokens": "count", "GeneratedTokens": "count"}
VIDUR_COLUMNS = {"arrived_at": "time", "num_prefill_tokens": "count", "num_decode_tokens": "count"}
LENGTH_COLUMNS = {"num_prefill_tokens": "count", "num_decode_tokens": "count"}
MOONCAKE_COLUMNS = {"timestamp": "time", "input_length": "count", "output_length": "count"}


def read_azure_trace(path, *, on_error: str = "raise", options: TraceOptions | None = None, **kwargs) -> Workload:
    """Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens; 2023 and 2024 files).

    TIMESTAMP is wall-clock with up to 7 fractional digits; arrival = seconds
    since the earliest row.
    """
    opts = make_options(options, kwargs)
    cols, lines, stats = read_csv_columns(path, {**AZURE_COLUMNS, **class_columns(opts)}, on_error)
    return finalize(cols["TIMESTAMP"], cols["ContextTokens"], cols["GeneratedTokens"], opts, stats, source_line=lines,
                    classes=classes_from(cols, opts))


def read_vidur_trace(path, *, on_error: str = "raise", options: TraceOptions | None = None, **kwargs) -> Workload:
    """CSV with arrived_at (seconds), num_prefill_tokens, num_decode_tokens (e.g. splitwise_conv.csv)."""
    opts = make_options(options, kwargs)
    cols, lines, stats = read_csv_columns(path, {**VIDUR_COLUMNS, **class_columns(opts)}, on_error)
    return finalize(cols["arrived_at"], cols["num_prefill_tokens"], cols["num_decode_tokens"], opts, stats,
                    source_line=lines, classes=classes_from(cols, opts))


def read_mooncake_trace(path, *, spread_within_bucket: bool = False, on_error: str = "raise",
                        options: TraceOptions | None = None, **kwargs) -> Workload:
    """Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids per 512-token block).

    The published timestamps are rounded into buckets (~3 s apart in the
    conversation trace). With spread_within_bucket, the m requests of a bucket
    starting at t are placed at t + k/m * gap (k = 0..m-1, in file order), where
    gap is the distance to the next bucket (the median gap for the last one):
    uniform and deterministic.
    """
    opts = make_options(options, kwargs)
    cols, lines, stats = read_jsonl_columns(path, {**MOONCAKE_COLUMNS, **class_columns(opts)}, list_column="hash_ids",
                                            on_error=on_error)
    arrival_s = cols["timestamp"] / 1000.0
    if spread_within_bucket and len(arrival_s) > 1:
        arrival_s = spread_buckets(arrival_s)
    return finalize(arrival_s, cols["input_length"], cols["output_length"], opts, stats,
                    hashes=cols["hash_ids"], source_line=lines, classes=classes_from(cols, opts))


def spread_buckets(t: np.ndarray) -> np.ndarray:
    """Spread equal times evenly over the gap to the next distinct time (see read_mooncake_trace)."""
    order = np.argsort(t, kind="stable")
    ts = t[order]
    uniq, first, counts = np.unique(ts, return_index=True, return_counts=True)
    gaps = np.diff(uniq)
    last_gap = float(np.median(gaps)) if len(gaps) else 0.0
    gaps = np.append(gaps, last_gap)
    bucket = np.repeat(np.arange(len(uniq)), counts)
    rank = np.arange(len(ts)) - first[bucket]
    out = np.empty_like(t)
    out[order] = ts + rank / counts[bucket] * gaps[bucket]
    return out


def read_length_file(path, *, on_error: str = "raise") -> tuple[np.ndarray, np.ndarray, WorkloadStats]:
    """ShareGPT-style length CSV (num_prefill_tokens, num_decode_tokens, other columns ignored).

    Returns (prompt lengths [n], output lengths [n], stats), in file order.
    """
    prompt, output, _, stats = read_length_rows(path, on_error=on_error)
    return prompt, output, stats


def read_length_rows(path, *, on_error: str = "raise"):
    """read_length_file plus the 1-based file line of each row: (prompt [n], output [n], lines [n], stats)."""
    cols, lines, stats = read_csv_columns(path, LENGTH_COLUMNS, on_error)
    return cols["num_prefill_tokens"], cols["num_decode_tokens"], lines, stats


FORMATS = ("azure", "vidur", "mooncake")


def detect_format(path) -> str:
    """Guess a trace's format from its extension and header."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    if path.suffix == ".jsonl" or first.lstrip().startswith("{"):
        return "mooncake"
    header = [h.strip() for h in first.split(",")]
    if "TIMESTAMP" in header:
        return "azure"
    if "arrived_at" in header:
        return "vidur"
    if "num_prefill_tokens" in header:
        raise ValueError(f"{path} holds lengths only (no arrival times); use sharegpt_workload(path, arrival=...)")
    raise ValueError(f"{path}: cannot tell the trace format from header {header}; pass format= one of {FORMATS}")


def read_trace(path, format: str = "auto", **kwargs) -> Workload:
    """Read any supported trace; format 'auto' looks at the extension and header."""
    fmt = detect_format(path) if format == "auto" else format
    readers = {"azure": read_azure_trace, "vidur": read_vidur_trace, "mooncake": read_mooncake_trace}
    if fmt not in readers:
        raise ValueError(f"unknown trace format {format!r}; allowed: {('auto',) + FORMATS}")
    check_on_error(kwargs.get("on_error", "raise"))
    return readers[fmt](path, **kwargs)
