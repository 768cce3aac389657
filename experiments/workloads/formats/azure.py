"""Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens; the 2023 and 2024 files)."""
from __future__ import annotations

from engine.core.requests import Workload
from experiments.workloads._io import read_csv_columns
from experiments.workloads.formats.base import TraceFormat
from experiments.workloads.options import TraceOptions, class_columns, classes_from, finalize, make_options

AZURE_COLUMNS = {"TIMESTAMP": "timestamp", "ContextTokens": "count", "GeneratedTokens": "count"}


def read_azure_trace(path, *, on_error: str = "raise", options: TraceOptions | None = None, **kwargs) -> Workload:
    """Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens; 2023 and 2024 files).

    TIMESTAMP is wall-clock with up to 7 fractional digits; arrival = seconds
    since the earliest row.
    """
    opts = make_options(options, kwargs)
    cols, lines, stats = read_csv_columns(path, {**AZURE_COLUMNS, **class_columns(opts)}, on_error)
    return finalize(cols["TIMESTAMP"], cols["ContextTokens"], cols["GeneratedTokens"], opts, stats, source_line=lines,
                    classes=classes_from(cols, opts), trace_arrival_s=cols["TIMESTAMP"])


FORMAT = TraceFormat("azure", "an Azure trace (TIMESTAMP, ContextTokens, GeneratedTokens)", read_azure_trace,
                     lambda path, header, first_line: "TIMESTAMP" in header, detect_order=1)
