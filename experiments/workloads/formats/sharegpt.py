"""ShareGPT-style length CSV (num_prefill_tokens, num_decode_tokens; other columns ignored): lengths only,
no arrival times, so requests arrive by a given arrival process (sharegpt_workload)."""
from __future__ import annotations

import numpy as np

from engine.core.requests import SAMPLED, SYNTHETIC_ARRIVAL, Workload, WorkloadStats
from experiments.workloads._io import read_csv_columns
from experiments.workloads.formats.base import TraceFormat
from experiments.workloads.options import TraceOptions, finalize, make_options, spawn_streams

LENGTH_COLUMNS = {"num_prefill_tokens": "count", "num_decode_tokens": "count"}


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


def sharegpt_workload(path, arrival, num_requests: int | None = None, *, sample: bool = False,
                      on_error: str = "raise", options: TraceOptions | None = None, **kwargs) -> Workload:
    """(prompt, output) pairs from a ShareGPT-style length CSV, arriving by `arrival`.

    Pairs stay together (the file's prompt/output correlation is kept). With
    sample=False the first num_requests rows (all rows if None) are used in file
    order; with sample=True num_requests rows are drawn with replacement using
    the prompt-lengths stream.
    """
    opts = make_options(options, kwargs)
    prompt, output, lines, stats = read_length_rows(path, on_error=on_error)
    n_file = len(prompt)
    if num_requests is None:
        if sample:
            raise ValueError("sample=True needs num_requests")
        num_requests = n_file
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    rng = spawn_streams(opts.seed)
    if sample:
        rows = rng["prompt_lengths"].integers(0, n_file, size=num_requests)
    else:
        if num_requests > n_file:
            raise ValueError(f"{path} has {n_file} usable rows, num_requests={num_requests}; "
                             "pass sample=True to draw with replacement")
        stats.num_truncated = n_file - num_requests
        rows = np.arange(num_requests)
    arrival_s = arrival.sample(num_requests, rng["arrivals"])
    # the file gives lengths only: every request's time is synthetic, and with sample=True its row is a draw
    stats.arrival_source = arrival_label(arrival)
    change = np.full(num_requests, SYNTHETIC_ARRIVAL | (SAMPLED if sample else 0), dtype=np.int8)
    return finalize(arrival_s, prompt[rows], output[rows], opts, stats, source_line=lines[rows], change=change)


def arrival_label(arrival) -> str:
    """An arrival process as the summary names it: "Poisson(rate_rps=10.0)" (a dataclass's fields), else its type."""
    import dataclasses
    if dataclasses.is_dataclass(arrival):
        fields = ", ".join(f"{f.name}={getattr(arrival, f.name)!r}" for f in dataclasses.fields(arrival))
        return f"{type(arrival).__name__}({fields})"
    return type(arrival).__name__


# After the trace formats: a Splitwise/Vidur file has the same length columns plus arrived_at.
FORMAT = TraceFormat("sharegpt", "a length-only CSV (no arrival times)", sharegpt_workload,
                     lambda path, header, first_line: "num_prefill_tokens" in header, detect_order=100,
                     has_arrivals=False)
