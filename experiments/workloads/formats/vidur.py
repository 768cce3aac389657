"""Splitwise / Vidur trace CSV: arrived_at (seconds), num_prefill_tokens, num_decode_tokens."""
from __future__ import annotations

from engine.core.requests import Workload
from experiments.workloads._io import read_csv_columns
from experiments.workloads.formats.base import TraceFormat
from experiments.workloads.options import TraceOptions, class_columns, classes_from, finalize, make_options

VIDUR_COLUMNS = {"arrived_at": "time", "num_prefill_tokens": "count", "num_decode_tokens": "count"}


def read_vidur_trace(path, *, on_error: str = "raise", options: TraceOptions | None = None, **kwargs) -> Workload:
    """CSV with arrived_at (seconds), num_prefill_tokens, num_decode_tokens (e.g. splitwise_conv.csv)."""
    opts = make_options(options, kwargs)
    cols, lines, stats = read_csv_columns(path, {**VIDUR_COLUMNS, **class_columns(opts)}, on_error)
    return finalize(cols["arrived_at"], cols["num_prefill_tokens"], cols["num_decode_tokens"], opts, stats,
                    source_line=lines, classes=classes_from(cols, opts), trace_arrival_s=cols["arrived_at"])


FORMAT = TraceFormat("vidur", "a Splitwise/Vidur trace (arrived_at, num_prefill_tokens, num_decode_tokens)",
                     read_vidur_trace, lambda path, header, first_line: "arrived_at" in header, detect_order=2)
