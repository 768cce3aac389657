"""What a run changed in its input, reported three ways: per request, in summary.json, on stderr.

Both backends call the same three functions on the run's Workload:

    requests = add_input_columns(requests, wl)   # requests.parquet: source_line, input_change, trace_num_*_tokens
    meta.update(input_meta(wl))                  # summary.json meta: counts and the lines of lost rows
    warn_if_lossy(meta, ...)                     # one WARNING line on stderr above LOSS_WARN_FRACTION

A request can be clipped (too_long=clip: prompt + output longer than
max_model_len), dropped (too_long=drop), skipped (a malformed row,
on_error=skip) or re-sorted (the file lists it after a request that arrives
later). Clipped and re-sorted requests keep their row in requests.parquet with
what was changed; dropped and skipped rows are not run, so summary.json lists
their file lines (the first MAX_LISTED_LINES of each) and counts them.
"""
from __future__ import annotations

import sys

import numpy as np

from engine.core.requests import MAX_LISTED_LINES, Workload

INPUT_COLUMNS = ("source_line", "input_change", "trace_num_prompt_tokens", "trace_num_output_tokens")
# A workload that loses more than this share of its requests or tokens warns on stderr: at 1%, a
# clipped tail already moves the tail latency percentiles a run is judged by.
LOSS_WARN_FRACTION = 0.01


def add_input_columns(requests, wl: Workload):
    """requests (a requests table whose request_id indexes wl) with the INPUT_COLUMNS appended."""
    cols = wl.input_columns()
    ids = requests["request_id"].to_numpy(dtype=np.int64)
    out = requests.copy()
    for name in INPUT_COLUMNS:
        out[name] = cols[name][ids]
    return out


def input_meta(wl: Workload) -> dict:
    """The counts summary.json records about the input (JSON-able)."""
    s = wl.stats
    checked = s.num_checked_requests or len(wl)
    lost_requests = s.num_clipped + s.num_dropped_too_long + s.num_rows_skipped
    return {
        "workload_source": s.source, "num_rows_read": s.num_rows_read, "num_workload_requests": len(wl),
        "num_skipped_head": s.num_skipped_head, "num_truncated": s.num_truncated,
        "too_long": s.too_long, "num_clipped": s.num_clipped, "num_clipped_prompt": s.num_clipped_prompt,
        "num_clipped_output": s.num_clipped - s.num_clipped_prompt, "num_clipped_tokens": s.num_clipped_tokens,
        "num_dropped_too_long": s.num_dropped_too_long, "num_dropped_tokens": s.num_dropped_tokens,
        "dropped_lines": list(s.dropped_lines), "num_rows_skipped": s.num_rows_skipped,
        "skipped_lines": list(s.skipped_lines), "num_reordered": s.num_reordered,
        "lost_request_fraction": lost_requests / (checked + s.num_rows_skipped),
        "lost_token_fraction": ((s.num_clipped_tokens + s.num_dropped_tokens) / s.num_checked_tokens
                                if s.num_checked_tokens else 0.0),
        "listed_lines_max": MAX_LISTED_LINES,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def describe_input(meta: dict) -> str:
    """One line: what was clipped, dropped, skipped and re-sorted, and why (printed summary)."""
    parts = []
    m = meta.get("max_model_len")
    if meta.get("num_clipped"):
        parts.append(f"{meta['num_clipped']} clipped to max_model_len={m} (prompt + output longer; "
                     f"{meta['num_clipped_prompt']} prompts cut, {meta['num_clipped_tokens']} tokens removed)")
    if meta.get("num_dropped_too_long"):
        parts.append(f"{meta['num_dropped_too_long']} dropped as longer than max_model_len={m} (too_long=drop)")
    if meta.get("num_rows_skipped"):
        parts.append(f"{meta['num_rows_skipped']} malformed rows skipped (on_error=skip)")
    if meta.get("num_reordered"):
        parts.append(f"{meta['num_reordered']} re-sorted by arrival time (listed after a later request)")
    # Rows left out on request (skip_requests, max_requests) are not lost, but the reader should see them.
    used = (f"; {meta.get('num_workload_requests')} of {meta.get('num_rows_read')} rows used "
            "(skip_requests / max_requests)" if meta.get("num_truncated") or meta.get("num_skipped_head") else "")
    if not parts:
        return "run as recorded (nothing clipped, dropped, skipped or re-sorted)" + used
    lost = meta.get("lost_request_fraction", 0.0)
    return "; ".join(parts) + used + (f" -- {_pct(lost)} of requests, {_pct(meta.get('lost_token_fraction', 0.0))} "
                                      "of tokens lost; per request: requests.parquet input_change, lines: "
                                      "summary.json meta")


def loss_warning(meta: dict, model_max_len: int | None = None) -> str | None:
    """The WARNING line for a workload that lost more than LOSS_WARN_FRACTION, else None."""
    req, tok = meta.get("lost_request_fraction", 0.0), meta.get("lost_token_fraction", 0.0)
    if max(req, tok) <= LOSS_WARN_FRACTION:
        return None
    fixes = []
    if meta.get("num_clipped") or meta.get("num_dropped_too_long"):
        fixes.append(f"raise max_model_len (up to {model_max_len}, the model's limit)"
                     if model_max_len and model_max_len > (meta.get("max_model_len") or 0)
                     else "choose a model with a longer context window (model=...)")
        if meta.get("num_clipped"):
            fixes.append("or set workload.too_long=drop to leave the long requests out instead of clipping them")
    if meta.get("num_rows_skipped"):
        fixes.append("repair the rows at summary.json meta.skipped_lines")
    return (f"WARNING: {meta.get('workload_source')}: the run loses {_pct(req)} of its requests and {_pct(tok)} of "
            f"its tokens ({describe_input(meta).split(' -- ')[0]}); to keep them: {', '.join(fixes)}")


def warn_if_lossy(meta: dict, model_max_len: int | None = None, file=None) -> str | None:
    """Prints loss_warning (if any) on stderr and returns it."""
    text = loss_warning(meta, model_max_len)
    if text:
        print(text, file=file or sys.stderr, flush=True)
    return text
