"""Options every workload accepts (rescaling, offset, truncation, clipping,
priorities) and the one function that applies them, in a fixed order."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.core.requests import (
    CLIPPED_OUTPUT,
    CLIPPED_PROMPT,
    MAX_LISTED_LINES,
    MOONCAKE_BLOCK_TOKENS,
    REORDERED,
    SAMPLED,
    SPREAD,
    SYNTHETIC_ARRIVAL,
    Workload,
    WorkloadStats,
)

# Append only: spawned child i is the same whatever the count, so a new stream never shifts an old one's numbers.
STREAMS = ("arrivals", "prompt_lengths", "output_lengths", "priorities", "prefix_groups")
TOO_LONG_MODES = ("clip", "drop")


def spawn_streams(seed: int) -> dict[str, np.random.Generator]:
    """One Generator per stochastic component, spawned from the run's root seed.

    The spawn order is fixed (STREAMS), so changing how one component draws
    never shifts another's numbers.
    """
    children = np.random.SeedSequence(int(seed)).spawn(len(STREAMS))
    return {name: np.random.default_rng(ss) for name, ss in zip(STREAMS, children)}


@dataclass(frozen=True)
class PriorityClasses:
    """Random priority classes: value values[i] with probability probs[i] (lower value = more important)."""
    values: tuple[int, ...] = (0, 1)
    probs: tuple[float, ...] = (0.5, 0.5)

    def __post_init__(self):
        if len(self.values) == 0 or len(self.values) != len(self.probs):
            raise ValueError(f"PriorityClasses: values {self.values} and probs {self.probs} must be non-empty "
                             "and of equal length")
        if any(p < 0 for p in self.probs) or abs(sum(self.probs) - 1.0) > 1e-6:
            raise ValueError(f"PriorityClasses.probs must be >= 0 and sum to 1, got {self.probs}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, p=np.asarray(self.probs, dtype=float))


@dataclass(frozen=True)
class TraceOptions:
    """How a trace (or synthetic stream) is turned into the run's requests.

    Applied in this order: sort by arrival (stable), drop the first
    `skip_requests` (a later slice of a trace, e.g. to calibrate on requests
    300-599 and validate on 0-299), keep the first `max_requests`, shift so the first request arrives at 0,
    rescale the gaps
    (`time_scale` multiplies every inter-arrival gap, 2.0 = half the rate; or
    `target_rate_rps` sets the mean rate (n-1)/span), add `start_offset_s`, then
    make every request fit `max_model_len` (prompt + output tokens): with
    too_long="clip" the prompt is cut to max_model_len - 1 if needed and the
    output to what is left; with "drop" the request is removed. Both are counted
    in the stats, and each request carries what was changed (Workload.input_change).
    """
    time_scale: float | None = None
    target_rate_rps: float | None = None
    start_offset_s: float = 0.0
    max_requests: int | None = None
    skip_requests: int = 0
    max_model_len: int | None = None
    too_long: str = "clip"
    priorities: PriorityClasses | None = None
    seed: int = 0
    # Trace columns holding each request's tenant and latency targets (seconds; an empty cell = no
    # target); None: the trace has none (every request is the default tenant's, without targets).
    tenant_column: str | None = None
    ttft_slo_column: str | None = None
    tpot_slo_column: str | None = None

    def __post_init__(self):
        if self.time_scale is not None and self.target_rate_rps is not None:
            raise ValueError("give at most one of time_scale and target_rate_rps")
        if self.time_scale is not None and not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.target_rate_rps is not None and not self.target_rate_rps > 0:
            raise ValueError(f"target_rate_rps must be > 0, got {self.target_rate_rps}")
        if self.start_offset_s < 0:
            raise ValueError(f"start_offset_s must be >= 0, got {self.start_offset_s}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {self.max_requests}")
        if self.skip_requests < 0:
            raise ValueError(f"skip_requests must be >= 0, got {self.skip_requests}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (one prompt and one output token), got {self.max_model_len}")
        if self.too_long not in TOO_LONG_MODES:
            raise ValueError(f"too_long must be one of {TOO_LONG_MODES}, got {self.too_long!r}")
        for name in ("tenant_column", "ttft_slo_column", "tpot_slo_column"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"{name} must be the name of a trace column (or null), got {v!r}")
        if isinstance(self.priorities, Mapping):   # from a config file: {values: [...], probs: [...]}
            object.__setattr__(self, "priorities", PriorityClasses(tuple(self.priorities["values"]),
                                                                   tuple(self.priorities["probs"])))


def make_options(options: TraceOptions | None, kwargs: dict) -> TraceOptions:
    if options is not None and kwargs:
        raise TypeError("pass either options=TraceOptions(...) or keyword options, not both")
    if options is not None:
        return options
    allowed = set(TraceOptions.__dataclass_fields__)
    unknown = set(kwargs) - allowed
    if unknown:
        raise TypeError(f"unknown workload option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return TraceOptions(**kwargs)


CLASS_COLUMNS = ("tenant", "ttft_slo_s", "tpot_slo_s")       # Workload fields of a request's service class


def class_columns(opts: TraceOptions) -> dict[str, str]:
    """The trace columns `opts` names for tenants and SLO targets: column name -> reader kind (_io.KINDS)."""
    named = ((opts.tenant_column, "text"), (opts.ttft_slo_column, "slo"), (opts.tpot_slo_column, "slo"))
    return {c: kind for c, kind in named if c is not None}


def classes_from(cols: dict, opts: TraceOptions) -> dict[str, np.ndarray]:
    """The service-class columns (CLASS_COLUMNS) of a trace's columns, for finalize."""
    out = {}
    for field_name, column in zip(CLASS_COLUMNS, (opts.tenant_column, opts.ttft_slo_column, opts.tpot_slo_column)):
        if column is not None:
            out[field_name] = cols[column]
    return out


def finalize(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, opts: TraceOptions,
             stats: WorkloadStats, hashes: list | None = None, source_line: np.ndarray | None = None,
             block_tokens: int = MOONCAKE_BLOCK_TOKENS, classes: dict | None = None,
             trace_arrival_s: np.ndarray | None = None, change: np.ndarray | None = None) -> Workload:
    """Apply `opts` to raw columns (one row per request) and build the Workload.

    classes: per-request service-class columns (CLASS_COLUMNS: tenant, ttft_slo_s, tpot_slo_s), kept
    with their rows through sorting, slicing and dropping. trace_arrival_s: the file's own times in seconds
    (None: the file gives none); change: input_change bits the reader already set per row (SPREAD, SAMPLED,
    SYNTHETIC_ARRIVAL), counted here over the requests that are kept.
    Every change to a request is kept with it: the Workload's input_change bits
    (REORDERED, CLIPPED_PROMPT, CLIPPED_OUTPUT and the reader's) and the trace's own lengths and times; the
    stats count them and list the lines of dropped rows.
    """
    rows = {"arrival": np.asarray(arrival_s, dtype=np.float64), "prompt": np.asarray(prompt, dtype=np.int64),
            "output": np.asarray(output, dtype=np.int64)}
    n_rows = len(rows["arrival"])
    rows["trace_arrival"] = (np.full(n_rows, np.nan) if trace_arrival_s is None
                             else np.asarray(trace_arrival_s, dtype=np.float64))
    rows["reader_change"] = np.zeros(n_rows, dtype=np.int8) if change is None else np.asarray(change, dtype=np.int8)
    rows["shift"] = rows["arrival"] - rows["trace_arrival"]       # [n] s the reader moved a row (NaN: no file time)
    if source_line is not None:
        rows["line"] = np.asarray(source_line, dtype=np.int64)
    for name, values in (classes or {}).items():
        if name not in CLASS_COLUMNS:
            raise ValueError(f"finalize: unknown class column {name!r}; allowed: {CLASS_COLUMNS}")
        rows[name] = np.asarray(values, dtype=object if name == "tenant" else np.float64)

    def keep(index) -> None:        # index: a slice, a boolean mask or a permutation of the rows
        nonlocal hashes
        for k in rows:
            rows[k] = rows[k][index]
        if hashes is not None:
            hashes = (hashes[index] if isinstance(index, slice) else
                      [hashes[i] for i in np.flatnonzero(index)] if index.dtype == bool else [hashes[i] for i in index])

    if len(rows["arrival"]) == 0:
        raise ValueError(f"{stats.source or 'workload'}: no requests left to run "
                         f"({stats.num_rows_read} rows read, {stats.num_rows_skipped} skipped)")
    t = rows["arrival"]
    # A row is reordered when the file lists it after a row that arrives later: the sort moves it up.
    earlier_max = np.maximum.accumulate(np.concatenate([[-np.inf], t[:-1]]))
    rows["change"] = np.where(t < earlier_max, REORDERED, 0).astype(np.int8) | rows.pop("reader_change")
    if np.any(np.diff(t) < 0):
        stats.num_reordered = int(np.count_nonzero(rows["change"]))
        keep(np.argsort(t, kind="stable"))
    if opts.skip_requests:
        k = opts.skip_requests
        if k >= len(rows["arrival"]):
            raise ValueError(f"{stats.source or 'workload'}: skip_requests={k} leaves none of its "
                             f"{len(rows['arrival'])} requests; lower skip_requests")
        stats.num_skipped_head = k
        keep(slice(k, None))
    if opts.max_requests is not None and len(rows["arrival"]) > opts.max_requests:
        stats.num_truncated += len(rows["arrival"]) - opts.max_requests
        keep(slice(None, opts.max_requests))

    arrival_s = rows["arrival"] - rows["arrival"][0]
    if opts.time_scale is not None:
        stats.arrival_scale = float(opts.time_scale)
    elif opts.target_rate_rps is not None:
        if len(arrival_s) < 2 or arrival_s[-1] <= 0:
            raise ValueError("target_rate_rps needs at least two requests at different times")
        current_rate = (len(arrival_s) - 1) / arrival_s[-1]
        stats.arrival_scale = float(current_rate / opts.target_rate_rps)
    arrival_s = arrival_s * stats.arrival_scale
    rows["arrival"] = arrival_s + opts.start_offset_s

    rows["trace_prompt"], rows["trace_output"] = rows["prompt"].copy(), rows["output"].copy()
    if opts.max_model_len is not None:
        m = opts.max_model_len
        stats.max_model_len, stats.too_long = m, opts.too_long
        total = rows["prompt"] + rows["output"]
        stats.num_checked_requests, stats.num_checked_tokens = len(total), int(total.sum())
        too_long = total > m
        if opts.too_long == "drop":
            stats.num_dropped_too_long = int(too_long.sum())
            stats.num_dropped_tokens = int(total[too_long].sum())
            if "line" in rows:
                stats.dropped_lines = rows["line"][too_long][:MAX_LISTED_LINES].tolist()
            keep(~too_long)
            if len(rows["arrival"]) == 0:
                raise ValueError(f"{stats.source}: every request is longer than max_model_len={m}")
        else:
            cut_prompt = rows["prompt"] > m - 1
            stats.num_clipped = int(too_long.sum())
            stats.num_clipped_prompt = int(cut_prompt.sum())
            rows["prompt"] = np.minimum(rows["prompt"], m - 1)
            rows["output"] = np.minimum(rows["output"], m - rows["prompt"])
            stats.num_clipped_tokens = int((total - rows["prompt"] - rows["output"]).sum())
            rows["change"] |= np.where(cut_prompt, CLIPPED_PROMPT,
                                       np.where(too_long, CLIPPED_OUTPUT, 0)).astype(np.int8)

    prompt = rows["prompt"]
    if hashes is not None:
        # Keep only the blocks the (possibly clipped) prompt still covers.
        hashes = [tuple(h[: -(-p // block_tokens)]) for h, p in zip(hashes, prompt.tolist())]

    n = len(prompt)
    _count_reader_changes(stats, rows)
    priority = (opts.priorities.sample(n, spawn_streams(opts.seed)["priorities"])
                if opts.priorities is not None else np.zeros(n, dtype=np.int64))
    return Workload(arrival_time_s=rows["arrival"], num_prompt_tokens=prompt, num_output_tokens=rows["output"],
                    priority=priority, prefix_hash_ids=hashes, prefix_block_tokens=block_tokens, stats=stats,
                    source_line=rows.get("line"), trace_num_prompt_tokens=rows["trace_prompt"],
                    trace_num_output_tokens=rows["trace_output"], input_change=rows["change"],
                    trace_arrival_time_s=rows["trace_arrival"],
                    **{k: rows[k] for k in CLASS_COLUMNS if k in rows})


def _count_reader_changes(stats: WorkloadStats, rows: dict) -> None:
    """The stats' counts of the reader's changes (SPREAD, SAMPLED, SYNTHETIC_ARRIVAL) over the kept rows."""
    change = rows["change"]
    spread = (change & SPREAD) != 0
    stats.num_spread = int(spread.sum())
    shift = rows["shift"][spread]       # on the file's clock: before shifting and rescaling
    stats.spread_max_shift_s = float(shift.max()) if len(shift) else 0.0
    sampled = (change & SAMPLED) != 0
    stats.num_sampled = int(sampled.sum())
    # (np.unique only when some row was sampled: its first call imports numpy.ma, ~15 ms of every trace read)
    stats.num_sampled_distinct = (int(len(np.unique(rows["line"][sampled]))) if "line" in rows and stats.num_sampled
                                  else stats.num_sampled)
    stats.num_synthetic_arrivals = int(((change & SYNTHETIC_ARRIVAL) != 0).sum())
