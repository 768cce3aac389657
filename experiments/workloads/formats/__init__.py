"""Trace formats, one module per format, found by discovery (nothing to list).

    fmt = formats()["azure"]          # a TraceFormat: name, description, reader, matches, ...
    detect_format("trace.csv")        # "azure" | "vidur" | "mooncake" | ... (ValueError for a lengths-only file)
    read_trace("trace.csv", max_requests=100)

A format is a module here with a `FORMAT = TraceFormat(...)` (experiments/workloads/formats/base.py)
and a reader function, which a conf/workload YAML names as `_target_`.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from pathlib import Path

from experiments.workloads._io import check_on_error
from experiments.workloads.formats.base import TraceFormat


@lru_cache(maxsize=None)
def formats() -> dict[str, TraceFormat]:
    """name -> TraceFormat of every module of this package, in detection order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        fmt = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FORMAT", None)
        if isinstance(fmt, TraceFormat):
            found.append(fmt)
    return {f.name: f for f in sorted(found, key=lambda f: (f.detect_order, f.name))}


def trace_formats() -> tuple[str, ...]:
    """The formats read_trace reads (those with arrival times)."""
    return tuple(name for name, f in formats().items() if f.has_arrivals)


def sniff_format(path) -> str | None:
    """The first format (in detection order) whose `matches` says yes for this file, or None."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    header = [h.strip() for h in first.split(",")]
    return next((name for name, f in formats().items() if f.matches(path, header, first)), None)


def detect_format(path) -> str:
    """Guess a trace's format from its extension and header."""
    name = sniff_format(path)
    if name is None:
        with open(path, encoding="utf-8") as f:
            header = [h.strip() for h in f.readline().split(",")]
        raise ValueError(f"{path}: cannot tell the trace format from header {header}; pass format= one of "
                         f"{trace_formats()}")
    fmt = formats()[name]
    if not fmt.has_arrivals:
        raise ValueError(f"{path} holds lengths only (no arrival times); use {fmt.reader.__name__}(path, "
                         f"arrival=...)")
    return name


def read_trace(path, format: str = "auto", **kwargs):
    """Read any supported trace into a Workload; format 'auto' looks at the extension and header."""
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in trace_formats():
        raise ValueError(f"unknown trace format {format!r}; allowed: {('auto',) + trace_formats()}")
    check_on_error(kwargs.get("on_error", "raise"))
    return formats()[fmt].reader(path, **kwargs)
