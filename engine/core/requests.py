"""Request specs, the columnar Workload that holds them, and lazy prompt tokens.

A workload is a few numpy columns (one row per request, sorted by arrival), so a
million-request run costs tens of MB, not a million Python objects. Iterating a
Workload yields light `RequestSpec`s; prompt token ids are made only when a
request arrives, by `prompt_token_ids(spec, vocab_size, rng_seed)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

import numpy as np

from engine.core.sequence import DEFAULT_TENANT

MOONCAKE_BLOCK_TOKENS = 512     # tokens per Mooncake prefix-hash block
# Workload.input_change bits: what the reader changed in a request (0 = run as recorded). SPREAD: its arrival
# moved within its timestamp bucket (Mooncake spread_within_bucket); SAMPLED: its row drawn with replacement
# (sample=true); SYNTHETIC_ARRIVAL: the file gives no time, an arrival process made it.
REORDERED, CLIPPED_PROMPT, CLIPPED_OUTPUT, SPREAD, SAMPLED, SYNTHETIC_ARRIVAL = 1, 2, 4, 8, 16, 32
INPUT_CHANGE_NAMES = ((REORDERED, "reordered"), (CLIPPED_PROMPT, "clipped_prompt"), (CLIPPED_OUTPUT, "clipped_output"),
                      (SPREAD, "arrival_spread"), (SAMPLED, "sampled"), (SYNTHETIC_ARRIVAL, "synthetic_arrival"))
MAX_LISTED_LINES = 100          # line numbers kept per kind of lost row (skipped, dropped)


class WorkloadFormatError(ValueError):
    """A trace or length file has a bad row; names the file, 1-based line and column."""

    def __init__(self, path, line: int | None, column: str | None, message: str):
        self.path, self.line, self.column = str(path), line, column
        where = str(path) + (f", line {line}" if line is not None else "") + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    request_id: int
    arrival_time_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int = 0                           # lower value = more important (as in Sequence)
    prefix_hash_ids: tuple | None = None        # one id per prefix block (Mooncake); None = no shared prefixes
    prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    tenant: str = DEFAULT_TENANT                # the client the request comes from (fair scheduling, per-tenant tables)
    ttft_slo_s: float | None = None             # time-to-first-token target, seconds; None = no target
    tpot_slo_s: float | None = None             # time-per-output-token target, seconds; None = no target


def check_slo_column(name: str, values: np.ndarray) -> np.ndarray:
    """values as float64 seconds, NaN = no target; ValueError naming `name` when a target is not > 0 or not
    finite. Callers map "no target" to NaN before (a NaN written by a user is caught where it is read)."""
    x = np.asarray(values, dtype=np.float64)
    bad = ~np.isnan(x) & ~(np.isfinite(x) & (x > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"Workload.{name}[{i}] is {float(x[i])!r}; an SLO target must be a finite number of "
                         "seconds > 0 (or no target)")
    return x


@dataclass
class WorkloadStats:
    """What happened to the input rows; every row is accounted for, nothing is dropped silently."""
    source: str = ""
    num_rows_read: int = 0          # data rows seen in the file (blank lines excluded)
    num_rows_skipped: int = 0       # malformed rows skipped with on_error="skip"
    num_blank_lines: int = 0        # empty lines ignored
    num_truncated: int = 0          # rows past max_requests, not used
    num_skipped_head: int = 0       # first rows dropped by skip_requests, not used
    arrival_scale: float = 1.0      # every inter-arrival gap multiplied by this (time_scale or target_rate_rps)
    num_clipped: int = 0            # requests whose lengths were clipped to max_model_len
    num_clipped_prompt: int = 0     # ... of which the prompt was shortened
    num_clipped_tokens: int = 0     # prompt + output tokens the clipping removed
    num_dropped_too_long: int = 0   # requests dropped because too_long="drop"
    num_dropped_tokens: int = 0     # prompt + output tokens of those requests
    num_checked_requests: int = 0   # requests checked against max_model_len (run + dropped)
    num_checked_tokens: int = 0     # their prompt + output tokens as the trace gives them
    num_reordered: int = 0          # rows listed after a row that arrives later (moved up by the stable sort)
    num_spread: int = 0             # requests whose arrival spread_within_bucket moved (later within its bucket)
    spread_max_shift_s: float = 0.0     # ... the largest move, seconds on the file's clock
    num_sampled: int = 0            # requests whose row was drawn with replacement (sample=true)
    num_sampled_distinct: int = 0   # ... distinct file rows among them
    sampled_from: str = ""          # what a synthetic workload drew from a file ("prompt lengths of x.csv ..."); ""
    num_synthetic_arrivals: int = 0     # requests timed by an arrival process (the file gives no times)
    arrival_source: str = ""        # that process (e.g. "Poisson(rate_rps=10.0)"); "" = the file's own times
    max_model_len: int | None = None    # the limit requests were checked against (None: not checked)
    too_long: str = "clip"              # what was done to longer requests: clip | drop
    skipped_lines: list[int] = field(default_factory=list)   # 1-based line numbers of skipped rows (first 100)
    dropped_lines: list[int] = field(default_factory=list)   # ... of rows dropped as too long (first 100)

    def note_skip(self, line: int) -> None:
        self.num_rows_skipped += 1
        if len(self.skipped_lines) < MAX_LISTED_LINES:
            self.skipped_lines.append(line)

    def summary(self) -> str:
        return (f"{self.source}: {self.num_rows_read} rows read, {self.num_rows_skipped} skipped, "
                + (f"{self.num_skipped_head} before skip_requests, " if self.num_skipped_head else "")
                + f"{self.num_truncated} past max_requests, {self.num_clipped} clipped "
                f"({self.num_clipped_prompt} prompts), {self.num_dropped_too_long} dropped as too long")


@dataclass
class Workload:
    """Requests in arrival order, as columns. request_id is 0..n-1 in that order."""
    arrival_time_s: np.ndarray          # [n] float64, seconds on the run's clock, non-decreasing
    num_prompt_tokens: np.ndarray       # [n] int64, >= 1
    num_output_tokens: np.ndarray       # [n] int64, >= 1
    priority: np.ndarray                # [n] int64
    prefix_hash_ids: list[tuple] | None = None      # [n] tuples, or None for no shared prefixes
    prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    stats: WorkloadStats = field(default_factory=WorkloadStats)
    source_line: np.ndarray | None = None           # [n] 1-based line in the source file, for traceability
    # What the reader changed, per request (None: nothing): the lengths the trace gives and a bit mask
    # of REORDERED / CLIPPED_PROMPT / CLIPPED_OUTPUT.
    trace_num_prompt_tokens: np.ndarray | None = None   # [n] int64
    trace_num_output_tokens: np.ndarray | None = None   # [n] int64
    input_change: np.ndarray | None = None              # [n] int8 bit mask
    trace_arrival_time_s: np.ndarray | None = None      # [n] float64, the file's own time (s); NaN: it gives none
    # Service classes (None: every request is DEFAULT_TENANT's, without targets):
    tenant: np.ndarray | None = None                    # [n] object (str), the client of each request
    ttft_slo_s: np.ndarray | None = None                # [n] float64 seconds, NaN = no target
    tpot_slo_s: np.ndarray | None = None                # [n] float64 seconds, NaN = no target

    def __post_init__(self):
        n = len(self.arrival_time_s)
        for name in ("num_prompt_tokens", "num_output_tokens", "priority"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Workload.{name} has {len(getattr(self, name))} rows, arrival_time_s has {n}")
        for name in ("source_line", "trace_num_prompt_tokens", "trace_num_output_tokens", "input_change",
                     "trace_arrival_time_s", "tenant", "ttft_slo_s", "tpot_slo_s"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"Workload.{name} has {len(getattr(self, name))} rows, arrival_time_s has {n}")
        for name in ("ttft_slo_s", "tpot_slo_s"):
            if getattr(self, name) is not None:
                setattr(self, name, check_slo_column(name, getattr(self, name)))
        if self.tenant is not None:
            self.tenant = np.asarray(self.tenant, dtype=object)
            bad = [i for i, t in enumerate(self.tenant.tolist()) if not isinstance(t, str) or not t]
            if bad:
                raise ValueError(f"Workload.tenant[{bad[0]}] is {self.tenant[bad[0]]!r}; a tenant is a non-empty "
                                 "string")
        if self.prefix_hash_ids is not None and len(self.prefix_hash_ids) != n:
            raise ValueError(f"Workload.prefix_hash_ids has {len(self.prefix_hash_ids)} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.arrival_time_s)

    def __getitem__(self, i: int) -> RequestSpec:
        return RequestSpec(
            request_id=int(i), arrival_time_s=float(self.arrival_time_s[i]),
            num_prompt_tokens=int(self.num_prompt_tokens[i]), num_output_tokens=int(self.num_output_tokens[i]),
            priority=int(self.priority[i]),
            prefix_hash_ids=None if self.prefix_hash_ids is None else self.prefix_hash_ids[i],
            prefix_block_tokens=self.prefix_block_tokens,
            tenant=DEFAULT_TENANT if self.tenant is None else self.tenant[i],
            ttft_slo_s=_target(self.ttft_slo_s, i), tpot_slo_s=_target(self.tpot_slo_s, i))

    def __iter__(self) -> Iterator[RequestSpec]:
        return (RequestSpec(*row) for row in self.spec_rows())

    def spec_rows(self) -> Iterator[tuple]:
        """Each request's RequestSpec fields, in RequestSpec's field order, as a plain tuple (what iterating
        yields, without building a RequestSpec per request: the simulator reads its arrivals this way)."""
        # tolist() once: converting numpy scalars one by one is the slow part.
        arr, p, o, pr = (self.arrival_time_s.tolist(), self.num_prompt_tokens.tolist(),
                         self.num_output_tokens.tolist(), self.priority.tolist())
        hashes = self.prefix_hash_ids
        bt = self.prefix_block_tokens
        if self.tenant is None and self.ttft_slo_s is None and self.tpot_slo_s is None:
            for i in range(len(arr)):
                h = None if hashes is None else hashes[i]
                yield i, arr[i], p[i], o[i], pr[i], h, bt, DEFAULT_TENANT, None, None
            return
        n = len(arr)
        tenant = [DEFAULT_TENANT] * n if self.tenant is None else self.tenant.tolist()
        ttft, tpot = (_targets(c, n) for c in (self.ttft_slo_s, self.tpot_slo_s))
        for i in range(n):
            yield i, arr[i], p[i], o[i], pr[i], None if hashes is None else hashes[i], bt, tenant[i], ttft[i], tpot[i]

    @property
    def tenants(self) -> np.ndarray:
        """[n] object: each request's tenant (DEFAULT_TENANT where the workload names none)."""
        return np.full(len(self), DEFAULT_TENANT, dtype=object) if self.tenant is None else self.tenant

    def specs(self) -> list[RequestSpec]:
        return list(self)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.arrival_time_s[-1] - self.arrival_time_s[0]) if len(self) > 1 else 0.0

    @property
    def mean_rate_rps(self) -> float:
        """(n - 1) / duration: the rate whose mean inter-arrival gap the workload has."""
        d = self.duration_s
        return (len(self) - 1) / d if d > 0 else float("inf")

    def to_frame(self):
        import pandas as pd
        nan = np.full(len(self), np.nan)
        return pd.DataFrame({
            "request_id": np.arange(len(self), dtype=np.int64), "arrival_time_s": self.arrival_time_s,
            "num_prompt_tokens": self.num_prompt_tokens, "num_output_tokens": self.num_output_tokens,
            "priority": self.priority, "tenant": self.tenants,
            "ttft_slo_s": nan if self.ttft_slo_s is None else self.ttft_slo_s,
            "tpot_slo_s": nan if self.tpot_slo_s is None else self.tpot_slo_s})

    def input_columns(self) -> dict[str, np.ndarray]:
        """Per request (index = request_id): source_line (1-based file line; 0 when the request has no
        line of its own, e.g. synthetic), input_change ("" = as recorded, else names joined by "+"),
        trace_num_prompt_tokens and trace_num_output_tokens (the lengths before clipping), trace_arrival_time_s
        (the file's own time in seconds, before spreading and rescaling; NaN when the file gives none)."""
        n = len(self)
        codes = np.zeros(n, dtype=np.int8) if self.input_change is None else self.input_change
        names = np.empty(2 ** len(INPUT_CHANGE_NAMES), dtype=object)        # every combination of the bits
        for code in range(len(names)):
            names[code] = "+".join(name for bit, name in INPUT_CHANGE_NAMES if code & bit)
        return {
            "source_line": (np.zeros(n, dtype=np.int64) if self.source_line is None
                            else np.asarray(self.source_line, dtype=np.int64)),
            "input_change": names[codes.astype(np.int64)],
            "trace_num_prompt_tokens": (self.num_prompt_tokens if self.trace_num_prompt_tokens is None
                                        else self.trace_num_prompt_tokens).astype(np.int64),
            "trace_num_output_tokens": (self.num_output_tokens if self.trace_num_output_tokens is None
                                        else self.trace_num_output_tokens).astype(np.int64),
            "trace_arrival_time_s": (np.full(n, np.nan) if self.trace_arrival_time_s is None
                                     else np.asarray(self.trace_arrival_time_s, dtype=np.float64)),
        }


def _target(column: np.ndarray | None, i: int) -> float | None:
    if column is None or np.isnan(column[i]):
        return None
    return float(column[i])


def _targets(column: np.ndarray | None, n: int) -> list:
    if column is None:
        return [None] * n
    return [None if v != v else v for v in column.tolist()]     # v != v: NaN, no target


# -- prompt token ids ------------------------------------------------------------
# Token ids are a counter-based hash (splitmix64) of (stream key, index, position):
# vectorized over a whole prompt and free to evaluate in any order. The stream keys
# come from np.random.SeedSequence(rng_seed), so seeds of different runs are well
# mixed. (Building one numpy Generator per 512-token block costs ~60 us; a Mooncake
# replay touches ~290k blocks.)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@lru_cache(maxsize=64)
def _stream_keys(rng_seed: int) -> tuple[np.uint64, np.uint64]:
    # word 0 keys prefix blocks (by hash id), word 1 keys private prompts (by request id)
    k = np.random.SeedSequence(rng_seed).generate_state(2, dtype=np.uint64)
    return k[0], k[1]


def _hash_tokens(key: np.uint64, ids: np.ndarray, positions: np.ndarray, vocab_size: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = _splitmix64(_splitmix64(ids.astype(np.uint64) ^ key) + positions.astype(np.uint64))
    return (h % np.uint64(vocab_size)).astype(np.int64)


def prompt_token_ids(spec: RequestSpec, vocab_size: int, rng_seed: int = 0) -> list[int]:
    """The prompt of `spec` as token ids in [0, vocab_size), deterministic in (rng_seed, spec).

    Without prefix hash ids the ids depend on (rng_seed, request_id, position), so
    different requests share no prefix. With hash ids, block j (tokens
    [j*B, (j+1)*B), B = prefix_block_tokens) depends only on (rng_seed,
    hash_ids[j], position in block): equal hash ids give identical token blocks.
    The last block is cut to the prompt length; prompt tokens past the listed
    blocks fall back to the private (request_id) stream.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    n = int(spec.num_prompt_tokens)
    if n < 1:
        raise ValueError(f"request {spec.request_id}: num_prompt_tokens must be >= 1, got {n}")
    block_key, private_key = _stream_keys(int(rng_seed))
    pos = np.arange(n, dtype=np.int64)
    if not spec.prefix_hash_ids:
        return _hash_tokens(private_key, np.full(n, spec.request_id, dtype=np.int64), pos, vocab_size).tolist()
    b = int(spec.prefix_block_tokens)
    hashes = np.asarray(spec.prefix_hash_ids, dtype=np.int64)[: -(-n // b)]
    covered = min(n, len(hashes) * b)
    out = _hash_tokens(block_key, np.repeat(hashes, b)[:covered], pos[:covered] % b, vocab_size)
    if covered < n:
        rest = _hash_tokens(private_key, np.full(n - covered, spec.request_id, dtype=np.int64), pos[covered:],
                            vocab_size)
        out = np.concatenate([out, rest])
    return out.tolist()
