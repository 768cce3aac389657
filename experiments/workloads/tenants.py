"""Multi-tenant synthetic workloads: streams of requests, one per (tenant, service class).

Each stream is one tenant's traffic of one class: its own arrival process (Poisson, or gamma gaps of
coefficient of variation `cv`; optionally only inside a [start_s, end_s) window and in bursts of
`burst_on_s` seconds every `burst_on_s + burst_off_s`), its own length distributions (or the
workload's), and its latency targets. Typical mixes (conf/workload/tenants*.yaml): interactive and
batch classes with different targets; a heavy tenant beside light ones; tenants arriving in bursts.

Stream i draws from its own Generators, spawned from (root seed, i): adding or changing one stream
never moves another stream's arrivals or lengths, so paired comparisons stay paired.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from engine.core.requests import Workload, WorkloadStats
from experiments.workloads.options import TraceOptions, finalize, make_options


def _check_positive(where: str, name: str, value, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        extra = " (or null for none)" if allow_none else ""
        raise ValueError(f"{where}.{name} must be a finite number > 0{extra}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class TenantStream:
    """One tenant's requests of one class. Times in seconds; rates in requests per second of "on" time."""
    tenant: str
    rate_rps: float
    cv: float = 1.0                     # gamma inter-arrival gaps' coefficient of variation (1 = Poisson)
    start_s: float = 0.0                # first moment the stream sends
    end_s: float | None = None          # last moment (None: the workload's duration_s)
    burst_on_s: float | None = None     # with burst_off_s: send only during on-periods of this length
    burst_off_s: float | None = None
    prompt_len: object = None           # a length distribution (experiments.workloads.Uniform, ...); None: workload's
    output_len: object = None
    ttft_slo_s: float | None = None     # targets of this class (None: no target)
    tpot_slo_s: float | None = None
    where: str = "stream"               # how errors name this stream, e.g. "workload.streams[1]"

    def __post_init__(self):
        w = self.where
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError(f"{w}.tenant must be a non-empty string (the tenant's id), got {self.tenant!r}")
        _check_positive(w, "rate_rps", self.rate_rps)
        _check_positive(w, "cv", self.cv)
        for name in ("ttft_slo_s", "tpot_slo_s"):
            _check_positive(w, name, getattr(self, name), allow_none=True)
        if isinstance(self.start_s, bool) or not isinstance(self.start_s, (int, float)) \
                or not math.isfinite(self.start_s) or self.start_s < 0:
            raise ValueError(f"{w}.start_s must be a finite number >= 0, got {self.start_s!r}")
        if self.end_s is not None:
            _check_positive(w, "end_s", self.end_s)
            if self.end_s <= self.start_s:
                raise ValueError(f"{w}.end_s ({self.end_s}) must be after start_s ({self.start_s})")
        if (self.burst_on_s is None) != (self.burst_off_s is None):
            raise ValueError(f"{w}: give both burst_on_s and burst_off_s (bursts), or neither")
        if self.burst_on_s is not None:
            _check_positive(w, "burst_on_s", self.burst_on_s)
            _check_positive(w, "burst_off_s", self.burst_off_s)

    def arrivals(self, duration_s: float, rng: np.random.Generator, rate_scale: float) -> np.ndarray:
        """Arrival times (seconds, sorted) in [start_s, end_s or duration_s)."""
        end = duration_s if self.end_s is None else min(self.end_s, duration_s)
        span = end - self.start_s
        if span <= 0:
            return np.zeros(0)
        on, off = self.burst_on_s, self.burst_off_s
        period = None if on is None else on + off
        # "on" time available in the window: the stream's clock while it may send
        horizon = span if period is None else (span // period) * on + min(span % period, on)
        rate = self.rate_rps * rate_scale
        shape = 1.0 / self.cv ** 2
        times, total = [], 0.0
        chunk = max(16, int(horizon * rate * 1.2) + 16)
        while total < horizon:
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=chunk)
            t = total + np.cumsum(gaps)
            times.append(t)
            total = float(t[-1])
        tau = np.concatenate(times) if times else np.zeros(0)
        tau = tau[tau < horizon]
        if period is not None:
            tau = (tau // on) * period + tau % on        # on-time -> wall time: skip the off-periods
        return self.start_s + tau


def make_stream(spec, index: int) -> TenantStream:
    if isinstance(spec, TenantStream):
        return spec
    if not isinstance(spec, Mapping):
        raise ValueError(f"workload.streams[{index}] must be a mapping (tenant, rate_rps, ...), got {spec!r}")
    allowed = {f.name for f in fields(TenantStream)} - {"where"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"workload.streams[{index}] has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for key in ("tenant", "rate_rps"):
        if key not in spec:
            raise ValueError(f"workload.streams[{index}].{key} is missing (each stream needs tenant and rate_rps)")
    return TenantStream(**spec, where=f"workload.streams[{index}]")


def tenant_mix_workload(streams, duration_s: float, prompt_len=None, output_len=None, *, rate_scale: float = 1.0,
                        options: TraceOptions | None = None, **kwargs) -> Workload:
    """The requests of every stream over [0, duration_s), merged in arrival order (TraceOptions keywords
    apply as to any workload). rate_scale multiplies every stream's rate (a load sweep's knob)."""
    opts = make_options(options, kwargs)
    _check_positive("workload", "duration_s", duration_s)
    _check_positive("workload", "rate_scale", rate_scale)
    if not streams:
        raise ValueError("workload.streams is empty; give at least one stream (tenant, rate_rps, ...)")
    made = [make_stream(s, i) for i, s in enumerate(streams)]
    cols = {k: [] for k in ("arrival", "prompt", "output", "tenant", "ttft", "tpot")}
    for i, st in enumerate(made):
        p_len, o_len = st.prompt_len or prompt_len, st.output_len or output_len
        if p_len is None or o_len is None:
            raise ValueError(f"workload.streams[{i}] has no prompt_len / output_len, and the workload gives none")
        arr_ss, p_ss, o_ss = np.random.SeedSequence([int(opts.seed), i]).spawn(3)
        t = st.arrivals(float(duration_s), np.random.default_rng(arr_ss), float(rate_scale))
        n = len(t)
        cols["arrival"].append(t)
        cols["prompt"].append(p_len.sample(n, np.random.default_rng(p_ss)) if n else np.zeros(0, np.int64))
        cols["output"].append(o_len.sample(n, np.random.default_rng(o_ss)) if n else np.zeros(0, np.int64))
        cols["tenant"].append(np.full(n, st.tenant, dtype=object))
        for key, v in (("ttft", st.ttft_slo_s), ("tpot", st.tpot_slo_s)):
            cols[key].append(np.full(n, np.nan if v is None else float(v)))
    merged = {k: np.concatenate(v) for k, v in cols.items()}
    n = len(merged["arrival"])
    if n == 0:
        raise ValueError(f"the streams send no request in duration_s={duration_s}; raise duration_s or the rates")
    names = ",".join(dict.fromkeys(st.tenant for st in made))
    stats = WorkloadStats(source=f"tenant_mix({names})", num_rows_read=n)
    # Streams are listed one after another: sorting by arrival merges them (not a reordering of a file).
    order = np.argsort(merged["arrival"], kind="stable")
    merged = {k: v[order] for k, v in merged.items()}
    classes = {"tenant": merged["tenant"], "ttft_slo_s": merged["ttft"], "tpot_slo_s": merged["tpot"]}
    return finalize(merged["arrival"], merged["prompt"], merged["output"], opts, stats, classes=classes)
