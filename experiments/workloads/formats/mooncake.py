"""Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids of shared 512-token prefixes)."""
from __future__ import annotations

import numpy as np

from engine.core.requests import SPREAD, Workload
from experiments.workloads._io import read_jsonl_columns
from experiments.workloads.formats.base import TraceFormat
from experiments.workloads.options import TraceOptions, class_columns, classes_from, finalize, make_options

MOONCAKE_COLUMNS = {"timestamp": "time", "input_length": "count", "output_length": "count"}


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
    recorded_s = cols["timestamp"] / 1000.0
    arrival_s = recorded_s
    if spread_within_bucket and len(arrival_s) > 1:
        arrival_s = spread_buckets(recorded_s)
    # a request the spreading moved carries it (input_change arrival_spread, trace_arrival_time_s the file's time)
    change = np.where(arrival_s != recorded_s, SPREAD, 0).astype(np.int8)
    return finalize(arrival_s, cols["input_length"], cols["output_length"], opts, stats,
                    hashes=cols["hash_ids"], source_line=lines, classes=classes_from(cols, opts),
                    trace_arrival_s=recorded_s, change=change)


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


FORMAT = TraceFormat("mooncake", "a Mooncake JSONL trace", read_mooncake_trace,
                     lambda path, header, first_line: path.suffix == ".jsonl" or first_line.lstrip().startswith("{"),
                     detect_order=0)
