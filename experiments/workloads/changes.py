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

A reader can also change a request without losing anything: move its arrival within its timestamp bucket
(Mooncake spread_within_bucket), draw its row with replacement (sample=true) or time it by an arrival process
(a lengths-only file). These are counted, named on the input line, marked per request (input_change
arrival_spread, sampled, synthetic_arrival; trace_arrival_time_s keeps the file's own time) and, being
defaults a user may not have chosen, told in one NOTE line on stderr with how to turn them off.
"""
from __future__ import annotations

import sys

import numpy as np

from engine.core.requests import MAX_LISTED_LINES, Workload

INPUT_COLUMNS = ("source_line", "input_change", "trace_num_prompt_tokens", "trace_num_output_tokens",
                 "trace_arrival_time_s")
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
        "num_skipped_head": s.num_skipped_head, "num_truncated": s.num_truncated, "arrival_scale": s.arrival_scale,
        "too_long": s.too_long, "num_clipped": s.num_clipped, "num_clipped_prompt": s.num_clipped_prompt,
        "num_clipped_output": s.num_clipped - s.num_clipped_prompt, "num_clipped_tokens": s.num_clipped_tokens,
        "num_dropped_too_long": s.num_dropped_too_long, "num_dropped_tokens": s.num_dropped_tokens,
        "dropped_lines": list(s.dropped_lines), "num_rows_skipped": s.num_rows_skipped,
        "skipped_lines": list(s.skipped_lines), "num_reordered": s.num_reordered,
        "lost_request_fraction": lost_requests / (checked + s.num_rows_skipped),
        "lost_token_fraction": ((s.num_clipped_tokens + s.num_dropped_tokens) / s.num_checked_tokens
                                if s.num_checked_tokens else 0.0),
        "listed_lines_max": MAX_LISTED_LINES,
        "num_spread": s.num_spread, "spread_max_shift_s": s.spread_max_shift_s, "num_sampled": s.num_sampled,
        "num_sampled_distinct": s.num_sampled_distinct, "num_synthetic_arrivals": s.num_synthetic_arrivals,
        "arrival_source": s.arrival_source, "sampled_from": s.sampled_from,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def _loss_parts(meta: dict) -> list[str]:
    parts = []
    m = meta.get("max_model_len")
    if meta.get("num_clipped"):
        parts.append(f"{meta['num_clipped']} clipped to max_model_len={m} (prompt + output longer; "
                     f"{meta['num_clipped_prompt']} prompts cut, {meta['num_clipped_tokens']} tokens removed)")
    if meta.get("num_dropped_too_long"):
        parts.append(f"{meta['num_dropped_too_long']} dropped as longer than max_model_len={m} (too_long=drop)")
    if meta.get("num_rows_skipped"):
        parts.append(f"{meta['num_rows_skipped']} malformed rows skipped (on_error=skip)")
    return parts


def _change_parts(meta: dict) -> list[str]:
    """What the reader changed without losing a request (see the module docstring), with how to turn it off."""
    parts = []
    if meta.get("num_reordered"):
        parts.append(f"{meta['num_reordered']} re-sorted by arrival time (listed after a later request)")
    if meta.get("num_spread"):
        scale = meta.get("arrival_scale") or 1.0
        clock = "" if scale == 1.0 else f" of trace time ({scale * meta.get('spread_max_shift_s', 0.0):.3g} s as run)"
        parts.append(f"{meta['num_spread']} arrivals moved later within their timestamp bucket, by up to "
                     f"{meta.get('spread_max_shift_s', 0.0):.3g} s{clock} (spread_within_bucket=true; "
                     "workload.spread_within_bucket=false runs the recorded times)")
    if meta.get("num_sampled") and meta.get("sampled_from"):
        parts.append(f"{meta['num_sampled']} requests' {meta['sampled_from']} drawn with replacement, each column on "
                     "its own (workload=sharegpt draws (prompt, output) pairs)")
    elif meta.get("num_sampled"):
        parts.append(f"{meta['num_sampled']} rows drawn with replacement from the file's {meta.get('num_rows_read')} "
                     f"({meta.get('num_sampled_distinct')} distinct; sample=true; workload.sample=false runs the "
                     "first num_requests rows once each)")
    if meta.get("num_synthetic_arrivals"):
        parts.append(f"{meta['num_synthetic_arrivals']} arrival times synthetic, {meta.get('arrival_source')} (the "
                     "file gives none)")
    return parts


def input_changed(meta: dict) -> bool:
    """Whether the run clipped, dropped, skipped, re-sorted, spread, sampled or timed any request (describe_input
    then says what)."""
    return bool(_loss_parts(meta) or _change_parts(meta))


def describe_input(meta: dict) -> str:
    """One line: what was clipped, dropped, skipped, re-sorted, spread, sampled or timed, and why (printed
    summary)."""
    losses, changes = _loss_parts(meta), _change_parts(meta)
    # Rows left out on request (skip_requests, max_requests) are not lost, but the reader should see them.
    used = (f"; {meta.get('num_workload_requests')} of {meta.get('num_rows_read')} rows used "
            "(skip_requests / max_requests)" if meta.get("num_truncated") or meta.get("num_skipped_head") else "")
    scale = meta.get("arrival_scale", 1.0)
    scaled = (f"arrival gaps scaled x{scale:.4g} as asked (time_scale / target_rate_rps)" if scale != 1.0 else "")
    if not losses and not changes:
        head = scaled or "run as recorded"
        if used:        # rows left out as asked: "nothing skipped" would read as a contradiction
            return head + "; of the rows used none clipped, dropped or re-sorted" + used
        return head + " (nothing clipped, dropped, skipped or re-sorted)"
    text = "; ".join(losses + changes + ([scaled] if scaled else [])) + used
    if not losses:
        return text + " -- nothing lost; per request: requests.parquet input_change"
    lost = meta.get("lost_request_fraction", 0.0)
    return text + (f" -- {_pct(lost)} of requests, {_pct(meta.get('lost_token_fraction', 0.0))} "
                   "of tokens lost; per request: requests.parquet input_change, lines: summary.json meta")


def change_note(meta: dict) -> str | None:
    """The NOTE line for a workload whose reader spread, sampled or timed its requests (defaults a user may not
    have chosen), else None."""
    parts = _change_parts({**meta, "num_reordered": 0})       # a re-sort changes no time or row: the input line
    if not parts:
        return None
    return (f"NOTE: {meta.get('workload_source')}: the run changes its input: {'; '.join(parts)}; per request: "
            "requests.parquet input_change, trace_arrival_time_s")


def note_changes(meta: dict, file=None) -> str | None:
    """Prints change_note (if any) on stderr and returns it."""
    text = change_note(meta)
    if text:
        print(text, file=file or sys.stderr, flush=True)
    return text


def loss_warning(meta: dict, model_max_len: int | None = None, server_max_len: int | None = None) -> str | None:
    """The WARNING line for a workload that lost more than LOSS_WARN_FRACTION, else None. server_max_len: the
    max_model_len the server reports (backend=http), the limit then rather than the model's."""
    req, tok = meta.get("lost_request_fraction", 0.0), meta.get("lost_token_fraction", 0.0)
    if max(req, tok) <= LOSS_WARN_FRACTION:
        return None
    fixes = []
    too_long, run_len = meta.get("num_clipped") or meta.get("num_dropped_too_long"), meta.get("max_model_len") or 0
    if too_long and server_max_len:
        # the server refuses a longer request whatever the model's window: its own start option is the limit
        fixes.append(f"raise max_model_len (up to {server_max_len}, the server's limit)" if server_max_len > run_len
                     else f"start the server with a longer max_model_len (its /v1/models says {server_max_len})")
    elif too_long:
        fixes.append(f"raise max_model_len (up to {model_max_len}, the model's limit)"
                     if model_max_len and model_max_len > run_len
                     else "choose a model with a longer context window (model=...)")
    if meta.get("num_clipped"):
        fixes.append("or set workload.too_long=drop to leave the long requests out instead of clipping them")
    if meta.get("num_rows_skipped"):
        fixes.append("repair the rows at summary.json meta.skipped_lines")
    # a clipped request still runs, shorter: the requests are "not as recorded", the tokens lost
    return (f"WARNING: {meta.get('workload_source')}: {_pct(req)} of the requests do not run as recorded and "
            f"{_pct(tok)} of the tokens are lost ({'; '.join(_loss_parts(meta))}); to keep them: {', '.join(fixes)}")


def warn_if_lossy(meta: dict, model_max_len: int | None = None, file=None,
                  server_max_len: int | None = None) -> str | None:
    """Prints loss_warning (if any) on stderr and returns it."""
    text = loss_warning(meta, model_max_len, server_max_len)
    if text:
        print(text, file=file or sys.stderr, flush=True)
    return text
