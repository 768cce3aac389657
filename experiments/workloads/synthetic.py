"""Synthetic workloads: an arrival process plus prompt/output length distributions.

Each component draws from its own Generator spawned from the root seed
(options.spawn_streams): arrivals, prompt lengths, output lengths, priorities.
Changing the output-length distribution therefore leaves arrivals and prompt
lengths exactly as they were, which keeps paired comparisons paired.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from engine.core.requests import SAMPLED, Workload, WorkloadStats
from experiments.workloads.formats.sharegpt import read_length_file
from experiments.workloads.options import TraceOptions, finalize, make_options, spawn_streams


# -- arrival processes: sample(n, rng) -> [n] float64 seconds, first request at 0 --
@dataclass(frozen=True)
class Poisson:
    rate_rps: float

    def __post_init__(self):
        if not self.rate_rps > 0:
            raise ValueError(f"Poisson.rate_rps must be > 0, got {self.rate_rps}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _from_gaps(rng.exponential(1.0 / self.rate_rps, size=n))


@dataclass(frozen=True)
class Gamma:
    """Gamma inter-arrival gaps with mean 1/rate_rps and coefficient of variation cv
    (cv = 1 is Poisson, cv > 1 burstier, cv < 1 more regular)."""
    rate_rps: float
    cv: float = 1.0

    def __post_init__(self):
        if not self.rate_rps > 0:
            raise ValueError(f"Gamma.rate_rps must be > 0, got {self.rate_rps}")
        if not self.cv > 0:
            raise ValueError(f"Gamma.cv must be > 0, got {self.cv}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / self.cv ** 2
        return _from_gaps(rng.gamma(shape, 1.0 / (self.rate_rps * shape), size=n))


@dataclass(frozen=True)
class Constant:
    """Evenly spaced arrivals at rate_rps (no randomness)."""
    rate_rps: float

    def __post_init__(self):
        if not self.rate_rps > 0:
            raise ValueError(f"Constant.rate_rps must be > 0, got {self.rate_rps}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.arange(n, dtype=np.float64) / self.rate_rps


@dataclass(frozen=True)
class AllAtOnce:
    """Every request arrives at time 0 (offline batch)."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(n, dtype=np.float64)


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    # The first request arrives at 0 (no idle lead-in); request i after the first i gaps.
    out = np.empty_like(gaps)
    out[0:1] = 0.0
    np.cumsum(gaps[:-1], out=out[1:])
    return out


# -- length distributions: sample(n, rng) -> [n] int64 tokens >= 1 ------------------
@dataclass(frozen=True)
class Fixed:
    tokens: int

    def __post_init__(self):
        if self.tokens < 1:
            raise ValueError(f"Fixed.tokens must be >= 1, got {self.tokens}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [lo, hi], both ends included."""
    lo: int
    hi: int

    def __post_init__(self):
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"Uniform needs 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)


@lru_cache(maxsize=8)
def _length_file(path: str, mtime_ns: int) -> tuple[np.ndarray, np.ndarray]:
    prompt, output, _ = read_length_file(path)
    return prompt, output


def load_lengths(path) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) columns of a length CSV, cached per file version."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"length file not found: {p}")
    return _length_file(str(p), p.stat().st_mtime_ns)


@dataclass(frozen=True)
class FromFile:
    """Lengths drawn (with replacement) from one column of a ShareGPT-style CSV:
    column 'num_prefill_tokens' for prompts, 'num_decode_tokens' for outputs."""
    path: str
    column: str = "num_prefill_tokens"

    def __post_init__(self):
        if self.column not in ("num_prefill_tokens", "num_decode_tokens"):
            raise ValueError(f"FromFile.column must be 'num_prefill_tokens' or 'num_decode_tokens', "
                             f"got {self.column!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        prompt, output = load_lengths(self.path)
        values = prompt if self.column == "num_prefill_tokens" else output
        return values[rng.integers(0, len(values), size=n)]


def synthetic_workload(num_requests: int, arrival, prompt_len, output_len, *,
                       options: TraceOptions | None = None, **kwargs) -> Workload:
    """num_requests requests from an arrival process and two length distributions.

    Options (TraceOptions keywords) include the root `seed`.
    """
    opts = make_options(options, kwargs)
    arrival_s, prompt, output, stats, change, _ = draw_requests(num_requests, arrival, prompt_len, output_len, opts,
                                                                f"synthetic({type(arrival).__name__})")
    return finalize(arrival_s, prompt, output, opts, stats, change=change)


def draw_requests(num_requests: int, arrival, prompt_len, output_len, opts: TraceOptions, source: str):
    """(arrival_s, prompt, output, stats, change, rng) of a synthetic workload before finalize: each component
    from its own stream of opts.seed (rng, spawn_streams), lengths drawn from a user's file (FromFile) reported
    as resampled (stats.sampled_from, change: SAMPLED on every request; None without)."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    rng = spawn_streams(opts.seed)
    arrival_s = arrival.sample(num_requests, rng["arrivals"])
    prompt = prompt_len.sample(num_requests, rng["prompt_lengths"])
    output = output_len.sample(num_requests, rng["output_lengths"])
    stats = WorkloadStats(source=source, num_rows_read=num_requests)
    drawn = [f"{kind} lengths of {d.path} ({d.column})" for kind, d in (("prompt", prompt_len), ("output", output_len))
             if isinstance(d, FromFile)]
    change = None
    if drawn:
        stats.sampled_from = " and ".join(drawn)
        change = np.full(num_requests, SAMPLED, dtype=np.int8)
    return arrival_s, prompt, output, stats, change, rng
