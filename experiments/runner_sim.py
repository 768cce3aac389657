"""Build a simulation from a composed config, run it, return its tables (torch-free).

    result = run_sim(cfg)          # cfg: the composed servelab config (DictConfig)
    result.requests, result.steps, result.meta

Per replica: a fresh scheduling policy, eviction policy and Scheduler (policies
keep per-run state, so nothing is shared between replicas or runs), one cost
model, one Recorder. Requests come from `build_workload(cfg)`, which the engine
runner shares. Ctrl-C during the simulation stops it and returns what finished
(`result.complete` False, `meta["interrupted"]` True).
"""
from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from dataclasses import dataclass, field, is_dataclass

import numpy as np
import pandas as pd
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate, to_absolute_path
from omegaconf import DictConfig, ListConfig, OmegaConf

from engine.core.recorder import Recorder, concat_frames
from engine.core.requests import WorkloadFormatError
from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from experiments.ctrl_c import RECORDER_FILES, interruptible
from experiments.user_errors import name_the_key, nearest
from experiments.workloads import Workload, prompt_token_ids
from experiments.workloads.changes import add_input_columns, input_meta, note_changes, warn_if_lossy
from sim.specs.capacity import block_bytes_per_gpu, check_host_blocks, cpu_tier_blocks, num_kv_blocks


# -- a length distribution the synthetic workloads use by default ----------------------
@dataclass(frozen=True)
class LogNormal:
    """Token counts exp(N(mu, sigma^2)) with mean `mean_tokens` (before rounding), clipped to [lo, hi].

    ShareGPT-like defaults (conf/workload/*_len/sharegpt_like.yaml) use the means the
    vLLM paper reports for ShareGPT: 161 prompt and 338 output tokens.
    """
    mean_tokens: float
    sigma: float = 1.0
    lo: int = 1
    hi: int = 4096

    def __post_init__(self):
        if not self.mean_tokens >= 1:
            raise ValueError(f"LogNormal.mean_tokens must be >= 1, got {self.mean_tokens}")
        if not self.sigma > 0:
            raise ValueError(f"LogNormal.sigma must be > 0, got {self.sigma}")
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"LogNormal needs 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        mu = np.log(self.mean_tokens) - self.sigma ** 2 / 2       # so that E[exp(N)] = mean_tokens
        x = rng.lognormal(mu, self.sigma, size=n)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


@dataclass
class RunResult:
    requests: pd.DataFrame
    steps: pd.DataFrame
    token_times: pd.DataFrame | None = None
    meta: dict = field(default_factory=dict)
    complete: bool = True
    # the simulator's own band: [(price scale, the run simulated with every step price that many times as long)]
    # (experiments/sim_band.py; [] without one)
    perturbed: list = field(default_factory=list)


# -- workload -------------------------------------------------------------------------
def _null_paths(node, prefix: str) -> list[str]:
    """Dotted keys named `path` that are null anywhere under node."""
    out = []
    if isinstance(node, DictConfig):
        for k in node:
            v = node._get_node(k)
            key = f"{prefix}.{k}"
            if k == "path" and v._is_none():
                out.append(key)
            elif isinstance(v, (DictConfig, ListConfig)):
                out += _null_paths(v, key)
    return out


def _absolute_paths(node) -> None:
    """Make every `path` string absolute against the directory the command was started in."""
    if isinstance(node, DictConfig):
        for k in node:
            v = node._get_node(k)
            if k == "path" and not v._is_none() and isinstance(node[k], str):
                node[k] = to_absolute_path(node[k])
            elif isinstance(v, DictConfig):
                _absolute_paths(v)


def model_max_model_len(cfg: DictConfig, model=None) -> tuple[int, str]:
    """(max_model_len, where it comes from) for the simulator: cfg.max_model_len if given (checked
    against the model's context window), else the model's own window (sim.specs ModelSpec.max_model_len)."""
    if model is None:
        from experiments.config import ModelConfig
        model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)).to_spec()
    given = cfg.get("max_model_len")
    if given is None:
        return int(model.max_model_len), f"{model.name}'s context window"
    if int(given) > model.max_model_len:
        raise ValueError(f"max_model_len={given} exceeds {model.name}'s {model.max_model_len} positions; "
                         f"set max_model_len <= {model.max_model_len}, or leave it null (the model's)")
    return int(given), "given"


def build_workload(cfg: DictConfig, max_model_len: int | None = None) -> Workload:
    """The run's requests: cfg.workload instantiated with the root seed and the run's max_model_len
    (None: model_max_model_len(cfg))."""
    missing = _null_paths(cfg.workload, "workload")
    if missing:
        example = TRACE_EXAMPLES.get(str(cfg.workload.get("_target_", "")), "trace")
        raise ValueError(f"{missing[0]} is null: this workload reads a file; give it on the command line, e.g. "
                         f"{missing[0]}=path/to/{example}")
    if max_model_len is None:
        max_model_len, _ = model_max_model_len(cfg)
    wcfg = OmegaConf.to_container(cfg.workload, resolve=True)
    wcfg = OmegaConf.create(wcfg)
    check_numbers(wcfg, "workload")
    _absolute_paths(wcfg)
    try:
        wl = instantiate(wcfg, seed=int(cfg.seed), max_model_len=int(max_model_len), _convert_="all")
    except InstantiationException as e:
        raise _keyed_workload_error(e, wcfg) or e
    if not isinstance(wl, Workload):
        raise TypeError(f"workload._target_ {cfg.workload.get('_target_')!r} returned {type(wl).__name__}, "
                        "expected an experiments.workloads.Workload")
    return wl


# the public trace file each reader is written for: the example a missing path's error gives
TRACE_EXAMPLES = {"experiments.workloads.read_azure_trace": "AzureLLMInferenceTrace_conv.csv",
                  "experiments.workloads.read_mooncake_trace": "conversation_trace.jsonl",
                  "experiments.workloads.read_vidur_trace": "splitwise_conv.csv",
                  "experiments.workloads.sharegpt_workload": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"}


def check_numbers(node: DictConfig, prefix: str) -> None:
    """A value given as text, or as a fraction, where the `_target_` it configures takes a number (a whole one)
    is refused naming its key, before the constructor meets it in a comparison (`'>' not supported between
    'str' and 'int'`). Keys a target takes through **kwargs are the readers' TraceOptions."""
    from experiments.workloads.options import TraceOptions
    hints: dict = {}
    defaults: dict = {}
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if target:
        try:
            obj = get_object(str(target))
            # a plain class (a cost model) is typed by its __init__, a dataclass or a function by itself
            hints = typing.get_type_hints(obj.__init__ if isinstance(obj, type) and not is_dataclass(obj) else obj)
            params = inspect.signature(obj).parameters.values()
            takes_kwargs = callable(obj) and not is_dataclass(obj) and any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
            if takes_kwargs:
                hints = {**typing.get_type_hints(TraceOptions), **hints}
            # the example a refusal gives: the constructor's own default, a value it surely takes (an efficiency
            # in (0, 1] would refuse a round 10.0)
            defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        except Exception:             # an unresolvable target or annotation: the constructor says what it says
            hints = {}
    for key, value in node.items():
        name = f"{prefix}.{key}"
        if isinstance(value, DictConfig):
            check_numbers(value, name)
            continue
        kind = _number_kind(hints.get(key))
        if kind is None or value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            default = defaults.get(key)
            example = default if type(default) in (int, float) else 100 if kind is int else 10.0
            raise ValueError(f"{name}={value}: not a number; give {'a whole number' if kind is int else 'a number'}, "
                             f"e.g. {name}={example}")
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{name}={value}: give a whole number, e.g. {name}={int(value)}")


def _number_kind(hint) -> type | None:
    """int or float where a type hint is that number (or it or None), else None."""
    if hint in (int, float):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and args[0] in (int, float):
            return args[0]
    return None


def _keyed_workload_error(exc: InstantiationException, wcfg: DictConfig) -> ValueError | None:
    """A bad workload value (a constructor's ValueError) as a ValueError naming the key as the user types it
    (workload.arrival.rate_rps, not Poisson.rate_rps); None for other errors (a malformed file names its line)."""
    cause = exc.__cause__
    if not isinstance(cause, ValueError) or isinstance(cause, WorkloadFormatError):
        return None
    text = " ".join(str(cause).split())
    if text.startswith("workload."):
        return ValueError(text)
    found = re.search(r"full_key: (\S+)", str(exc))
    sub = found.group(1) if found else ""
    node = OmegaConf.select(wcfg, sub) if sub else wcfg
    keys = list(node.keys()) if isinstance(node, DictConfig) else []
    if not sub:
        from experiments.workloads.options import TraceOptions  # the readers' common options (**kwargs)
        keys += list(TraceOptions.__dataclass_fields__)
    return ValueError(name_the_key(text, "workload" + (f".{sub}" if sub else ""), keys))


def limits_meta(scheduler: Scheduler, max_model_len_source: str) -> dict:
    """The length limits a run used and why (summary.json meta; the printed summary shows them)."""
    return {"max_model_len": scheduler.config.max_model_len, "max_model_len_source": max_model_len_source,
            "max_num_batched_tokens": scheduler.config.max_num_batched_tokens,
            "max_num_batched_tokens_source": scheduler.max_num_batched_tokens_reason}


def check_input(wl: Workload, max_model_len: int, model_max_len: int | None,
                server_max_len: int | None = None) -> dict:
    """The input counts for summary.json meta (experiments.workloads.changes.input_meta); prints the
    WARNING line on stderr now, before the run, when the workload lost too much, and the NOTE line when its
    reader spread, sampled or timed the requests. server_max_len: the server's limit (backend=http)."""
    meta = {"max_model_len": int(max_model_len), **input_meta(wl)}
    warn_if_lossy(meta, model_max_len, server_max_len=server_max_len)
    note_changes(meta)
    return meta


def check_weighted_tenants_exist(cfg: DictConfig, wl: Workload) -> None:
    """A weight for a tenant no request has changes nothing (most often a misspelt name): refused, naming it."""
    weights = cfg.scheduler.get("tenant_weights") if cfg.get("scheduler") is not None else None
    if not weights:
        return
    tenants = sorted({str(spec.tenant) for spec in wl})
    unknown = sorted(str(t) for t in weights if str(t) not in tenants)
    if unknown:
        raise ValueError(f"scheduler.tenant_weights names {unknown}, a tenant no request of the workload has (its "
                         f"tenants: {tenants}); fix the name or leave it out")


def offered_rate_rps(cfg: DictConfig, wl: Workload) -> float | None:
    """The request rate a sweep varies: the arrival process's rate_rps, the trace's target_rate_rps,
    or else the workload's measured mean rate (None for all-at-once)."""
    w = cfg.workload
    arrival = w.get("arrival")
    if isinstance(arrival, DictConfig) and arrival.get("rate_rps") is not None:
        return float(arrival.rate_rps)
    if w.get("target_rate_rps") is not None:
        return float(w.target_rate_rps)
    rate = wl.mean_rate_rps
    return float(rate) if np.isfinite(rate) else None


def make_sequences(wl: Workload, vocab_size: int, seed: int, record_token_times: bool = False) -> list[Sequence]:
    # Prompts are hashed token ids (distinct per request unless a trace lists shared prefix blocks).
    return [Sequence(spec.request_id, prompt_token_ids(spec, vocab_size, seed),
                     SamplingParams(max_tokens=spec.num_output_tokens, ignore_eos=True),
                     arrival_time_s=spec.arrival_time_s, priority=spec.priority,
                     record_token_times=record_token_times, tenant=spec.tenant, ttft_slo_s=spec.ttft_slo_s,
                     tpot_slo_s=spec.tpot_slo_s)
            for spec in wl]


# -- serving setup ----------------------------------------------------------------------
def kv_capacity(cfg: DictConfig, model, hardware) -> tuple[int, int]:
    """(num_kvcache_blocks, num_cpu_blocks) per replica: as given, else what fits."""
    tp = int(cfg.tensor_parallel_size)
    num_kvcache_blocks = cfg.num_kvcache_blocks
    if num_kvcache_blocks is None:
        num_kvcache_blocks = num_kv_blocks(model, hardware, int(cfg.block_size), float(cfg.gpu_memory_utilization), tp,
                            float(cfg.activation_reserve_gib))
    num_cpu_blocks = cfg.num_cpu_blocks
    if num_cpu_blocks is None:
        block_bytes = block_bytes_per_gpu(model, int(cfg.block_size), tp)
        num_cpu_blocks = int(float(cfg.swap_space_gib) * 2 ** 30 // block_bytes)
    check_host_blocks(model, hardware, int(cfg.block_size), tp, int(num_cpu_blocks), cpu_cache_blocks(cfg, model),
                      cfg.get("cpu_cache_gib"))
    return int(num_kvcache_blocks), int(num_cpu_blocks)


def cpu_cache_blocks(cfg: DictConfig, model=None) -> int:
    """The prefix cache's CPU tier per replica in blocks: cfg.cpu_cache_num_blocks, or the blocks of the model's KV
    that fit in cfg.cpu_cache_gib GiB (model: a ModelSpec; None: cfg.model's)."""
    gib = cfg.get("cpu_cache_gib")
    if gib is None:
        return int(cfg.cpu_cache_num_blocks)
    if model is None:
        from experiments.config import ModelConfig
        model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)).to_spec()
    return cpu_tier_blocks(model, int(cfg.block_size), int(cfg.tensor_parallel_size), int(cfg.cpu_cache_num_blocks),
                           float(gib))


def make_cost_model(cfg: DictConfig, model, hardware):
    max_model_len, _ = model_max_model_len(cfg, model)
    return build_cost_model(cfg.backend.cost_model, model, hardware, int(cfg.tensor_parallel_size),
                            int(max_model_len))


def build_cost_model(node, model, hardware, tensor_parallel_size: int, max_model_len: int):
    """A conf/backend/cost_model node instantiated; a `_partial_` one gets those of model, hardware,
    tensor_parallel_size and max_model_len its constructor takes (and its YAML does not set)."""
    if isinstance(node, DictConfig):
        check_numbers(node, "backend.cost_model")
    factory = instantiate(node, _convert_="all")
    supplied = {"model": model, "hardware": hardware, "tensor_parallel_size": tensor_parallel_size,
                "max_model_len": max_model_len}
    if not callable(factory) or not hasattr(factory, "func"):
        return factory          # a fully built cost model (no _partial_)
    params = inspect.signature(factory.func).parameters
    return factory(**{k: v for k, v in supplied.items() if k in params and k not in factory.keywords})


def make_scheduler(cfg: DictConfig, num_kvcache_blocks: int, num_cpu_blocks: int,
                   max_model_len: int | None = None, cpu_cache_num_blocks: int | None = None) -> Scheduler:
    """A fresh Scheduler for one replica; max_model_len None: model_max_model_len(cfg);
    max_num_batched_tokens null: derived by the Scheduler (engine.core.token_budget); cpu_cache_num_blocks
    None: cpu_cache_blocks(cfg)."""
    if max_model_len is None:
        max_model_len, _ = model_max_model_len(cfg)
    tier = cpu_cache_blocks(cfg) if cpu_cache_num_blocks is None else int(cpu_cache_num_blocks)
    sched_cfg = SchedulerConfig.from_settings(cfg, num_kvcache_blocks=num_kvcache_blocks,
                                              num_cpu_blocks=num_cpu_blocks, max_model_len=int(max_model_len),
                                              cpu_cache_num_blocks=tier)
    policy = instantiate(cfg.scheduler, _convert_="all")
    eviction = instantiate(cfg.eviction, _convert_="all")
    return Scheduler(sched_cfg, policy, eviction, cpu_cache_eviction_policy(cfg, tier))


def cpu_cache_eviction_policy(cfg: DictConfig, cpu_cache_num_blocks: int | None = None):
    """A fresh eviction policy for the prefix cache's CPU tier (cfg.cpu_cache_eviction names it), or None
    when the run has no tier (cpu_cache_num_blocks blocks; None: cfg.cpu_cache_num_blocks)."""
    tier = int(cfg.cpu_cache_num_blocks) if cpu_cache_num_blocks is None else cpu_cache_num_blocks
    policy = make_cpu_cache_eviction(str(cfg.cpu_cache_eviction))   # checked with a tier or without one
    return policy if tier else None


def make_cpu_cache_eviction(name: str):
    """A fresh eviction policy of policies/eviction named `name` for the CPU tier; ValueError naming
    cpu_cache_eviction and the allowed names unless it is one that keeps blocks."""
    from policies.registry import EVICTION_POLICIES, make_eviction_policy
    if name not in EVICTION_POLICIES or name == "none":
        allowed = ", ".join(sorted(n for n in EVICTION_POLICIES if n != "none"))
        raise ValueError(f"cpu_cache_eviction={name!r} is not an eviction policy that keeps blocks; use one of "
                         f"{allowed}{nearest(name, allowed.split(', '), 'cpu_cache_eviction=')}")
    return make_eviction_policy(name)


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar over requests on stderr. On a terminal it is erased when done; written to a file (a log, or stdout
    and stderr in one file) it updates at most every 30 s and ends with its own newline, so the lines printed after
    it start on a line of their own."""
    from tqdm.auto import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="req", disable=not enabled, leave=not tty,
                mininterval=0.5 if tty else 30.0)


class ProgressRecorder(Recorder):
    """A Recorder that also advances a progress bar when a request leaves the system."""

    def __init__(self, replica: int, bar):
        super().__init__(replica)
        self._bar = bar

    def on_finish(self, seq: Sequence) -> None:
        super().on_finish(seq)
        self._bar.update(1)


# -- the run ------------------------------------------------------------------------------
def run_sim(cfg: DictConfig, desc: str = "simulating") -> RunResult:
    from experiments.config import HardwareConfig, ModelConfig
    from sim.replica import Replica
    from sim.simulator import Simulator

    model = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)).to_spec()
    hardware = HardwareConfig(**OmegaConf.to_container(cfg.hardware, resolve=True)).to_spec()
    if int(cfg.num_replicas) < 1:
        raise ValueError(f"num_replicas must be >= 1, got {cfg.num_replicas}")
    max_len, max_len_source = model_max_model_len(cfg, model)
    wl = build_workload(cfg, max_len)
    in_meta = check_input(wl, max_len, model.max_model_len)
    check_weighted_tenants_exist(cfg, wl)
    num_kvcache_blocks, num_cpu_blocks = kv_capacity(cfg, model, hardware)
    cost_model = make_cost_model(cfg, model, hardware)
    # Specs become Sequences on arrival (prompt ids from the root seed); token times need prebuilt ones.
    requests = (make_sequences(wl, model.vocab_size, int(cfg.seed), True) if cfg.record_token_times else wl)

    tier_blocks = cpu_cache_blocks(cfg, model)

    def simulate(cost_model, requests, desc: str):
        """(recorders, SimResult or None when interrupted, the simulator) of one simulation of the workload."""
        # what can refuse a setting is built before the bar starts, so an error line never runs on after it
        schedulers = [make_scheduler(cfg, num_kvcache_blocks, num_cpu_blocks, max_len, tier_blocks)
                      for _ in range(int(cfg.num_replicas))]
        router = instantiate(cfg.router, _convert_="all")
        bar = progress_bar(len(wl), desc, bool(cfg.progress))
        try:
            recorders = [ProgressRecorder(i, bar) for i in range(len(schedulers))]
            replicas = [Replica(sched, cost_model, rec, index=i, overlap_scheduling=bool(cfg.overlap_scheduling))
                        for i, (sched, rec) in enumerate(zip(schedulers, recorders))]
            sim = Simulator(replicas, router=router, vocab_size=model.vocab_size, prompt_seed=int(cfg.seed),
                            keep_finished=False)
            try:
                with interruptible(protect=RECORDER_FILES):
                    return recorders, sim.run(requests), sim
            except KeyboardInterrupt:          # keep what finished
                return recorders, None, sim
        finally:
            bar.close()

    recorders, res, sim = simulate(cost_model, requests, desc)
    replicas, router = sim.replicas, sim.router
    interrupted = res is None
    num_steps = num_fast_steps = None
    if interrupted:
        end_s, wall_s = float(sim.env.now), float("nan")
    else:
        end_s, wall_s = res.end_time_s, res.wall_s
        num_steps, num_fast_steps = res.num_steps, res.num_fast_steps
    perturbed = []
    band = float(getattr(cost_model, "price_band", 0.0) or 0.0)
    if band > 0 and hasattr(cost_model, "scaled") and not interrupted:
        # the simulator's own band (experiments/sim_band.py); specs, not the main run's Sequences (those are used up)
        for factor in (1 + band, 1 - band):
            recs, res_i, _ = simulate(cost_model.scaled(factor), wl, f"{desc} (prices x{factor:g})")
            if res_i is None:
                interrupted = True
                break
            perturbed.append((factor, RunResult(*concat_frames(recs))))

    req_df, steps_df = concat_frames(recorders)
    token_times = None
    if cfg.record_token_times:
        token_times = pd.concat([r.token_times_frame() for r in recorders], ignore_index=True)
    meta = {
        "backend": "sim", "model": model.name, "hardware": hardware.name, "cost_model": repr(cost_model),
        "router": repr(router), "num_replicas": len(replicas), "num_kvcache_blocks": num_kvcache_blocks,
        "num_cpu_blocks": num_cpu_blocks, "cpu_cache_num_blocks": tier_blocks,
        "cpu_cache_gib": cfg.get("cpu_cache_gib"), "overlap_scheduling": bool(cfg.overlap_scheduling),
        "request_rate_rps": offered_rate_rps(cfg, wl),
        "measured_rate_rps": float(wl.mean_rate_rps) if np.isfinite(wl.mean_rate_rps) else None,
        "sim_end_time_s": float(end_s),
        "sim_wall_time_s": wall_s, "num_steps": num_steps, "num_fast_steps": num_fast_steps,
        "interrupted": interrupted, "num_unfinished": len(wl) - len(req_df),
        **in_meta, **limits_meta(replicas[0].scheduler, max_len_source),
    }
    req_df = add_input_columns(req_df, wl)
    meta.update(fitted_model_meta(cost_model, steps_df, bool(cfg.overlap_scheduling)))
    meta["price_band"] = band if perturbed else None
    return RunResult(req_df, steps_df, token_times, meta, complete=not interrupted, perturbed=perturbed)


def fitted_model_meta(cost_model, steps_df: pd.DataFrame, overlapped: bool = False) -> dict:
    """For a fitted cost model (one with an `envelope`): the run's coverage by its envelope (share of steps and of
    simulated step time outside it; one WARNING line on stderr past envelope.WARN_OUTSIDE_SHARE), the concerns
    the file's own metadata raises (sim/cost_model/fit_trust.py; one WARNING line) and, where the run allowed a
    file made for another model or GPU, what differs. {} for other cost models."""
    from sim.cost_model.envelope import coverage, coverage_warning
    from sim.cost_model.fit_trust import fit_concerns, fit_warning
    if not hasattr(cost_model, "envelope"):
        return {}
    concerns = fit_concerns(getattr(cost_model, "metadata", None), overlapped)
    out = {"cost_model_coverage": coverage(steps_df, cost_model.envelope) if cost_model.envelope else None,
           "cost_model_fit_concerns": concerns}
    if out["cost_model_coverage"] is None:
        out["cost_model_coverage_note"] = "the cost-model file records no envelope (fitted before format v3): refit it"
    for line in (coverage_warning(out["cost_model_coverage"], "the calibrated cost model"),
                 fit_warning(concerns, "the calibrated cost model")):
        if line:
            print(line, file=sys.stderr, flush=True)
    if getattr(cost_model, "allow_mismatch", False):
        out["cost_model_allow_mismatch"] = True
        out["cost_model_mismatch"] = cost_model.mismatch
        if cost_model.mismatch:
            print(f"WARNING: the calibrated cost model was fitted for another model or GPU ({cost_model.mismatch}); "
                  f"used anyway (allow_mismatch=true)", file=sys.stderr, flush=True)
    return out
