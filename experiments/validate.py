"""Sim vs real: one workload and policy through the real engine and through the simulator, compared per request.

    python -m experiments.validate --model CKPT --trace AzureLLMInferenceTrace_conv.csv --target-rate-rps 8 \
        --max-requests 400 --policies fcfs,vllm,vllm_swap --num-kvcache-blocks 1024 --num-cpu-blocks 1024 \
        --device cuda --profile profile.json --out-dir benchmarks/results --name azure_conv

For each policy: the engine replays the workload in real time
(experiments.runner_engine), then the simulator runs the same requests (same
ids, prompts, lengths, arrival times) with the same SchedulerConfig under each
cost model (`roofline`, and `calibrated` when --profile is given). Both sides
build the policy, its victim and the eviction policy from the config groups of
conf/, composed as `servelab scheduler=NAME OVERRIDES` would compose them
(experiments.policy_conf; `--override victim=most_blocks --override eviction=lfu`), and
`--cost-model NAME` adds a cost model of conf/backend/cost_model/ as `servelab` builds it
(`--override backend.cost_model.KEY=VALUE` sets its parameters). Per-request
rows are joined on request_id; the report (validation_<name>.json, written
atomically) gives per policy and cost model: throughput error, median / p90 of
|sim - real| / real for TTFT, TPOT and E2E (and the signed error of their p50 /
p90 / p99 over the requests), preemption and swap counts side by
side, and the cost model's error on the real run's own steps (each real step
priced from its shape: a check that does not depend on the two schedules
staying in step). validation_<name>.png overlays latency CDFs and output
throughput over time (one row per policy). docs/validation.md explains how to
read it.

The real side can also be any OpenAI-compatible server (servelab-serve, vLLM, SGLang), replayed over HTTP
(experiments.runner_http):

    python -m experiments.validate --real-url http://127.0.0.1:8000 --model CKPT --num-kvcache-blocks 1024 \
        --max-model-len 8192 --policies vllm --hardware H200 --trace AzureLLMInferenceTrace_conv.csv ... --out-dir DIR

The server schedules with its own policy and KV cache: --policies names that one policy, and --num-kvcache-blocks,
--max-model-len and the other engine flags must be what the server was started with (the simulator is given them);
--model is a folder holding the served checkpoint's config.json (the roofline's dimensions, the prompt vocabulary).
The real side then has no step table (the step-time check is left out).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from experiments.compose import compose_config
from experiments.config import ServelabConfig
from experiments.metrics import summary
from experiments.policy_conf import make_eviction, make_policy, parse_label, policy_names, swaps
from experiments.profile import set_threads
from experiments.results import atomic_write_text, write_json, write_parquet
from experiments.runner_engine import EngineReplayer, EngineRunConfig, RunResult, make_sequences, note_compiles
from experiments.runner_sim import make_cpu_cache_eviction
from experiments.saved_runs import SavedReplays, save_real_meta, save_real_run, saved_argv
from experiments.step_tables import priced_steps, run_was_overlapped
from experiments.validation_plot import LATENCIES, overlay_plot
from sim.cost_model.calibrated import CalibratedCostModel, relative_errors
from sim.cost_model.envelope import coverage, coverage_warning
from sim.cost_model.fit_trust import fit_concerns, fit_warning

FORMAT = "servelab.validation/v1"
# A nominal CPU for roofline pricing of CPU smoke runs (the roofline is a GPU model; on a CPU it is only a lower bound).
CPU_NOMINAL = dict(name="CPU-nominal", peak_bf16_tflops=0.1, hbm_bandwidth_gbps=20.0, memory_gib=16.0,
                   host_link_gbps=20.0, interconnect_gbps=20.0,
                   source="nominal CPU rates for smoke runs (0.1 TFLOP/s, 20 GB/s); not a measurement")


# -- the simulator side -------------------------------------------------------------------
def simulate(requests, policy: str, cost_model, sched_cfg, vocab_size: int, *, temperature: float = 0.6,
             rng_seed: int = 0, record_decisions: bool = False, overrides=(),
             cpu_cache_eviction: str = ServelabConfig.cpu_cache_eviction,
             overlap_scheduling: bool = ServelabConfig.overlap_scheduling) -> RunResult:
    """The same requests under the same SchedulerConfig and policy (a label of experiments.policy_conf, whose
    +chunked / +nochunk the caller has applied to sched_cfg), priced by `cost_model`; the policy and the
    eviction policy composed with the Hydra `overrides` (--override), as the real side builds them;
    cpu_cache_eviction: the prefix cache's CPU-tier policy when sched_cfg has a tier; overlap_scheduling: the
    replica schedules each step while the previous one runs, as the engine does with it (docs/overlap.md)."""
    from engine.core.recorder import Recorder
    from engine.core.scheduler import Scheduler
    from sim.replica import Replica
    from sim.simulator import Simulator

    seqs = make_sequences(requests, vocab_size, temperature=temperature, rng_seed=rng_seed)
    rec = Recorder(record_decisions=record_decisions)
    tier = make_cpu_cache_eviction(cpu_cache_eviction) if sched_cfg.cpu_cache_num_blocks else None
    sched = Scheduler(sched_cfg, policy=make_policy(policy, overrides), eviction=make_eviction(overrides),
                      cpu_cache_eviction=tier)
    sim = Simulator(Replica(sched, cost_model, rec, overlap_scheduling=overlap_scheduling),
                    vocab_size=vocab_size, prompt_seed=rng_seed)
    res = sim.run(seqs)
    return RunResult(rec.requests_frame(), rec.steps_frame(),
                     dict(sim_end_s=float(res.end_time_s), sim_wall_s=float(res.wall_s), num_steps=int(res.num_steps),
                          num_fast_steps=int(res.num_fast_steps), victim=sched.policy.victim.name,
                          eviction=sched.block_manager.eviction.name),
                     rec.decisions_frame() if record_decisions else None)


def policy_scheduler_config(sched_cfg, label: str):
    """sched_cfg with the label's forced chunked-prefill setting (experiments.policy_conf)."""
    chunked = parse_label(label).chunked
    return sched_cfg if chunked is None else replace(sched_cfg, enable_chunked_prefill=chunked)


def checkpoint_specs(model_path, hardware: str | None, device: str, max_model_len: int):
    """(ModelSpec of the checkpoint's config.json, HardwareSpec: --hardware, else H200 on cuda and a
    nominal CPU otherwise): what the simulated side prices."""
    from engine.hf_config import load_hf_config
    from sim.specs.hardware import HardwareSpec, get_hardware_spec
    from sim.specs.models import ModelSpec

    spec = ModelSpec.from_hf_config(load_hf_config(model_path), name=Path(model_path).name,
                                    max_model_len=max_model_len)
    if hardware is None:
        hardware = "H200" if device.startswith("cuda") else "cpu-nominal"
    return spec, HardwareSpec(**CPU_NOMINAL) if hardware.lower() == "cpu-nominal" else get_hardware_spec(hardware)


def roofline_model(model_path, hardware: str | None, device: str, max_model_len: int, latency_floors: bool = False):
    from sim.cost_model.roofline import RooflineCostModel

    spec, hw = checkpoint_specs(model_path, hardware, device, max_model_len)
    return RooflineCostModel(spec, hw, max_model_len=max_model_len, latency_floors=latency_floors)


def conf_cost_model(name: str, overrides, model_path, hardware: str | None, device: str, max_model_len: int):
    """The cost model of conf/backend/cost_model/<name>.yaml (with the `backend.cost_model.*` overrides), for
    the checkpoint and hardware of checkpoint_specs, as `servelab backend/cost_model=<name>` builds it."""
    from experiments.runner_sim import build_cost_model

    node = compose_config([f"backend/cost_model={name}", *overrides]).backend.cost_model
    spec, hw = checkpoint_specs(model_path, hardware, device, max_model_len)
    return build_cost_model(node, spec, hw, 1, max_model_len)


# -- comparison -------------------------------------------------------------------------------
QUANTILES = (50, 90, 99)


def _rel_stats(sim: np.ndarray, real: np.ndarray) -> dict:
    ok = np.isfinite(sim) & np.isfinite(real) & (real > 0)
    if not ok.any():
        return {"median_rel_err": None, "p90_rel_err": None, "mean_signed_rel_err": None, "num_requests": 0}
    e = relative_errors(sim[ok], real[ok])
    # The distributions' percentiles (what a comparison of policies reads), signed: (sim - real) / real. A
    # per-request error also carries where in a step each arrival landed, which the two clocks cannot share.
    q_sim, q_real = np.percentile(sim[ok], QUANTILES), np.percentile(real[ok], QUANTILES)
    # ... and how far each simulated percentile sits from the real one in the real distribution, in percentile points:
    # on a steep stretch of the CDF a large relative error is a request or two. A value tied with several real
    # requests spans their shares; its rank there is the one nearest q
    r = np.sort(real[ok])
    target = np.asarray(QUANTILES) / 100

    def rank(x):
        return np.clip(target, np.searchsorted(r, x, "left") / len(r), np.searchsorted(r, x, "right") / len(r))
    at = rank(q_sim) - rank(q_real)
    return {"median_rel_err": float(np.median(e)), "p90_rel_err": float(np.percentile(e, 90)),
            "mean_signed_rel_err": float(np.mean((sim[ok] - real[ok]) / real[ok])), "num_requests": int(ok.sum()),
            "quantile_rel_err": {f"p{q}": float((a - b) / b) if b > 0 else None
                                 for q, a, b in zip(QUANTILES, q_sim, q_real)},
            "quantile_rank_pts": {f"p{q}": float(100 * f) for q, f in zip(QUANTILES, at)}}


def _rel(sim: float, real: float):
    return (sim - real) / real if real and np.isfinite(real) and np.isfinite(sim) else None


SUMMARY_KEYS = ("num_requests", "num_finished", "num_rejected", "makespan_s", "request_throughput_rps",
                "output_throughput_tps", "total_throughput_tps", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99",
                "tpot_s_p50", "tpot_s_p90", "tpot_s_p99", "e2e_s_p50", "e2e_s_p90", "e2e_s_p99", "num_preemptions",
                "num_preempted_requests", "num_swaps", "prefix_cache_hit_rate", "prefix_cache_hit_rate_cpu",
                "num_steps", "mean_batch_size", "kv_usage_mean", "kv_usage_max", "busy_time_s")


# ... and for runs with several tenants or latency targets (experiments.tenant_metrics)
TENANT_KEYS = ("num_tenants", "num_rejected_by_policy", "slo_attainment_targets", "goodput_targets_rps", "jain_index",
               "service_diff_rate_max", "service_diff_rate_mean")


def run_summary(run: RunResult) -> dict:
    s = summary(run.requests, run.steps)
    out = {k: s.get(k) for k in SUMMARY_KEYS}
    if s.get("num_tenants", 1) > 1 or "num_with_slo" in s:
        out.update({k: s[k] for k in TENANT_KEYS if k in s})
    return out


def compare(real: RunResult, sim: RunResult, cost_model=None) -> dict:
    """Errors of one simulated run against the real one (see the module docstring)."""
    r, s = real.requests, sim.requests
    ids_r, ids_s = list(r["request_id"]), list(s["request_id"])
    joined = r.merge(s, on="request_id", suffixes=("_real", "_sim"), how="inner")
    one_to_one = (len(ids_r) == len(set(ids_r)) == len(ids_s) == len(set(ids_s)) == len(joined)
                  and set(ids_r) == set(ids_s))
    both = joined[(joined["status_real"] == "finished") & (joined["status_sim"] == "finished")]
    sr, ss = run_summary(real), run_summary(sim)
    out = {
        "join": {"num_real": len(ids_r), "num_sim": len(ids_s), "num_joined": int(len(joined)),
                 "num_finished_both": int(len(both)), "one_to_one": bool(one_to_one)},
        "throughput": {"output_tps_real": sr["output_throughput_tps"], "output_tps_sim": ss["output_throughput_tps"],
                       "rel_err": _rel(ss["output_throughput_tps"], sr["output_throughput_tps"]),
                       "request_rps_real": sr["request_throughput_rps"],
                       "request_rps_sim": ss["request_throughput_rps"],
                       "makespan_s_real": sr["makespan_s"], "makespan_s_sim": ss["makespan_s"],
                       "makespan_rel_err": _rel(ss["makespan_s"], sr["makespan_s"])},
        "preemptions": {"real": sr["num_preemptions"], "sim": ss["num_preemptions"],
                        "real_preempted_requests": sr["num_preempted_requests"],
                        "sim_preempted_requests": ss["num_preempted_requests"],
                        "real_swaps": sr["num_swaps"], "sim_swaps": ss["num_swaps"]},
        "steps": {"real": sr["num_steps"], "sim": ss["num_steps"], "mean_batch_size_real": sr["mean_batch_size"],
                  "mean_batch_size_sim": ss["mean_batch_size"], "busy_s_real": sr["busy_time_s"],
                  "busy_s_sim": ss["busy_time_s"]},
        "summary_sim": ss,
    }
    for m in LATENCIES:
        out[m] = _rel_stats(both[f"{m}_sim"].to_numpy(dtype=float), both[f"{m}_real"].to_numpy(dtype=float))
    out["step_time"] = None
    if cost_model is not None and hasattr(cost_model, "predict_table") and len(real.steps):
        # Targets are cycle times (step + host gap to the next step): what the simulator's clock advances by.
        st, pred = priced_steps(real.steps, cost_model, run_was_overlapped(real.info))
        true = st["duration_s"].to_numpy()
        out["step_time"] = {"median_rel_err": float(np.median(relative_errors(pred, true))),
                            "p90_rel_err": float(np.percentile(relative_errors(pred, true), 90)),
                            "sum_pred_over_real": float(pred.sum() / true.sum()), "num_steps": int(len(true)),
                            "target": "cycle time (duration + host gap to the next step)"}
    envelope = getattr(cost_model, "envelope", None)
    if envelope is not None:
        # steps outside the envelope the model was fitted on: extrapolated (sim.cost_model.envelope)
        out["coverage"] = {"sim": coverage(sim.steps, envelope), "real": coverage(real.steps, envelope)}
    return out


# -- the command ------------------------------------------------------------------------------
def _length_range(text: str, flag: str) -> tuple[int, int]:
    try:
        lo, _, hi = text.partition(":")
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"{flag} must be LO:HI (tokens, both included) or N, got {text!r}") from None
    return lo, hi


def priority_classes(text: str):
    """'0:0.3,1:0.7' (value:probability, lower value = more important) -> PriorityClasses."""
    from experiments.workloads.options import PriorityClasses
    try:
        pairs = [item.split(":") for item in text.split(",")]
        values, probs = zip(*((int(v), float(p)) for v, p in pairs))
        return PriorityClasses(tuple(values), tuple(probs))
    except ValueError as exc:
        raise ValueError(f"--priority-classes must be VALUE:PROB,... with probabilities summing to 1 (e.g. "
                         f"0:0.3,1:0.7), got {text!r} ({exc})") from None


def conf_workload(args, max_model_len: int | None):
    """--workload NAME: conf/workload/NAME.yaml as `servelab workload=NAME` composes it, with the
    --workload-set overrides (KEY=VALUE under workload.), --seed and --max-requests."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from experiments.run import CONF_DIR
    from experiments.runner_sim import build_workload as build_conf_workload
    if args.trace:
        raise ValueError("give --workload or --trace, not both")
    overrides = [f"workload={args.workload}", f"seed={args.seed}"]
    # KEY=VALUE sets workload.KEY; a group choice (workload/prompt_len=uniform) passes as it is
    overrides += [kv if kv.startswith("workload/") else f"workload.{kv.removeprefix('workload.')}"
                  for kv in args.workload_set]
    if args.max_requests is not None:
        overrides.append(f"workload.max_requests={args.max_requests}")
    if GlobalHydra.instance().is_initialized():
        cfg = compose("config", overrides=overrides)
    else:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    return build_conf_workload(cfg, max_model_len)


def build_workload(args, max_model_len: int | None = None):
    """The workload the flags describe, clipped to max_model_len (None: --max-model-len)."""
    from experiments.workloads import AllAtOnce, Constant, Gamma, Poisson, Uniform, read_trace, synthetic_workload
    opts = dict(max_requests=args.max_requests, max_model_len=max_model_len or args.max_model_len, seed=args.seed,
                skip_requests=args.skip_requests)
    if args.target_rate_rps is not None:
        opts["target_rate_rps"] = args.target_rate_rps
    if args.time_scale is not None:
        opts["time_scale"] = args.time_scale
    if args.priority_classes:
        opts["priorities"] = priority_classes(args.priority_classes)
    if args.workload:
        return conf_workload(args, opts["max_model_len"])
    if args.trace:
        return read_trace(args.trace, format=args.trace_format, **opts)
    arrivals = {"poisson": lambda: Poisson(args.rate_rps), "gamma": lambda: Gamma(args.rate_rps, args.cv),
                "constant": lambda: Constant(args.rate_rps), "all_at_once": AllAtOnce}
    if args.arrival not in arrivals:
        raise ValueError(f"--arrival must be one of {sorted(arrivals)}, got {args.arrival!r}")
    if args.arrival != "all_at_once" and args.rate_rps is None:
        raise ValueError(f"--arrival {args.arrival} needs --rate-rps")
    lo_p, hi_p = _length_range(args.prompt_len, "--prompt-len")
    lo_o, hi_o = _length_range(args.output_len, "--output-len")
    if args.arrival == "all_at_once":
        opts.pop("target_rate_rps", None)
        opts.pop("time_scale", None)
    return synthetic_workload(args.num_requests, arrivals[args.arrival](), Uniform(lo_p, hi_p), Uniform(lo_o, hi_o),
                              **opts)


def engine_run_config(args, num_cpu_blocks: int) -> EngineRunConfig:
    """The engine of the real side: each EngineRunConfig field from the flag of the same name (given or
    its default, which is the field's), the checkpoint from --model, prefix caching off by --no-prefix-caching."""
    return EngineRunConfig.from_attributes(args, model_path=str(args.model), num_cpu_blocks=num_cpu_blocks,
                                           enable_prefix_caching=not args.no_prefix_caching)


def split_overrides(args) -> tuple[list[str], list[str]]:
    """--override values as (those of the policy groups, the backend.cost_model.* ones for --cost-model)."""
    given = list(args.override or [])
    cost_model = [o for o in given if o.lstrip("+~").startswith("backend")]
    return [o for o in given if o not in cost_model], cost_model


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.validate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (required unless --from-real)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--name", default="run", help="report name: validation_<name>.json / .png")
    w = ap.add_argument_group("workload: a trace (--trace) or synthetic (default)")
    w.add_argument("--trace", default=None, help="trace file (Azure / Vidur CSV, Mooncake JSONL)")
    w.add_argument("--trace-format", default="auto")
    w.add_argument("--workload", default=None, help="a conf/workload config instead (e.g. tenants, slo_classes: "
                   "requests with tenants and SLO targets), as `servelab workload=NAME` builds it")
    w.add_argument("--workload-set", action="append", default=[], metavar="KEY=VALUE",
                   help="with --workload: override one of its keys (repeatable), e.g. rate_scale=0.5, or pick "
                   "a length group, e.g. workload/prompt_len=uniform")
    w.add_argument("--num-requests", type=int, default=32, help="synthetic: number of requests")
    w.add_argument("--arrival", default="poisson", help="synthetic: poisson | gamma | constant | all_at_once")
    w.add_argument("--rate-rps", type=float, default=None, help="synthetic: arrival rate")
    w.add_argument("--cv", type=float, default=1.0, help="synthetic gamma arrivals: coefficient of variation")
    w.add_argument("--prompt-len", default="100:1024", help="synthetic: LO:HI tokens, uniform")
    w.add_argument("--output-len", default="100:1024", help="synthetic: LO:HI tokens, uniform")
    w.add_argument("--target-rate-rps", type=float, default=None, help="rescale arrivals to this mean rate")
    w.add_argument("--time-scale", type=float, default=None, help="multiply inter-arrival gaps")
    w.add_argument("--max-requests", type=int, default=None)
    w.add_argument("--skip-requests", type=int, default=0, help="drop the first N requests (after sorting by "
                   "arrival), e.g. a calibration replay on requests 300-599: --skip-requests 300 --max-requests 300")
    w.add_argument("--seed", type=int, default=EngineRunConfig.seed)
    w.add_argument("--priority-classes", default=None, help="random priority per request, VALUE:PROB,... "
                   "(lower value = more important), e.g. 0:0.3,1:0.7 (for the priority policy)")
    e = ap.add_argument_group("engine and scheduler (the same for both backends)")
    e.add_argument("--policies", default="vllm", help="comma-separated conf/scheduler names (fcfs, vllm, vllm_swap, "
                   "sjf, srpt, priority, mlfq, sarathi, ...), each optionally +chunked / +nochunk to force chunked "
                   "prefill for that policy alone (e.g. vllm,vllm+chunked)")
    e.add_argument("--override", action="append", metavar="KEY=VALUE", help="a servelab override of the policy "
                   "groups both backends build the policies from (conf/), e.g. victim=most_blocks, eviction=lfu, "
                   "scheduler.prompt_token_weight=0; repeatable")
    e.add_argument("--device", default=EngineRunConfig.device)
    e.add_argument("--num-kvcache-blocks", type=int, default=None, help="KV blocks (small values force preemption)")
    e.add_argument("--num-cpu-blocks", type=int, default=None, help="swap blocks (default: num_kvcache_blocks "
                   "when vllm_swap runs, else 0)")
    e.add_argument("--cpu-cache-num-blocks", type=int, default=EngineRunConfig.cpu_cache_num_blocks,
                   help="the prefix cache's CPU tier in blocks (default 0: none)")
    e.add_argument("--cpu-cache-gib", type=float, default=EngineRunConfig.cpu_cache_gib,
                   help="the same tier in GiB of host memory instead (converted with the checkpoint's KV block bytes; "
                        "not with --cpu-cache-num-blocks)")
    e.add_argument("--cpu-cache-eviction", default=ServelabConfig.cpu_cache_eviction,
                   help="the CPU tier's eviction policy (lru, fifo, lfu)")
    e.add_argument("--max-model-len", type=int, default=None, help="default: the engine's limit for the checkpoint")
    e.add_argument("--max-num-seqs", type=int, default=EngineRunConfig.max_num_seqs)
    e.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: derived from max_model_len "
                   "(engine/core/token_budget.py)")
    e.add_argument("--enable-chunked-prefill", action="store_true")
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument("--enforce-eager", action="store_true")
    e.add_argument("--overlap-scheduling", action="store_true",
                   help="schedule each step while the previous one runs, engine and simulator (docs/overlap.md)")
    e.add_argument("--attention-backend", default=EngineRunConfig.attention_backend)
    e.add_argument("--temperature", type=float, default=EngineRunConfig.temperature)
    e.add_argument("--threads", type=int, default=None, help="torch threads (default 1 on cpu)")
    e.add_argument("--max-wall-s", type=float, default=None, help="abort a replay that runs longer (seconds)")
    c = ap.add_argument_group("simulator cost models")
    c.add_argument("--profile", default=None, help="calibrated cost model JSON (experiments.calibrate)")
    c.add_argument("--hardware", default=None, help="roofline hardware (default H200 on cuda, cpu-nominal on cpu)")
    c.add_argument("--no-roofline", action="store_true")
    c.add_argument("--cost-model", action="append", metavar="NAME", help="also price with conf/backend/cost_model/"
                   "NAME.yaml as servelab builds it (its parameters by --override backend.cost_model.KEY=VALUE); "
                   "repeatable")
    ap.add_argument("--no-plot", action="store_true", help="skip validation_<name>.png (seconds per policy)")
    ap.add_argument("--save-tables", action="store_true", help="also write per-request and per-step CSVs")
    ap.add_argument("--real-dir", default=None, help="keep the real runs (parquet tables + engine facts) in this "
                    "directory, for a later --from-real")
    ap.add_argument("--real-url", default=None, help="the real side is the OpenAI-compatible server at this URL "
                    "(replayed over HTTP) instead of the engine in this process; see the module docstring")
    ap.add_argument("--served-model", default=None, help="with --real-url: the model name to request (default: the "
                    "server's first /v1/models entry)")
    ap.add_argument("--from-real", default=None, help="replay nothing: load the real runs a --real-dir run kept "
                    "there (same --name) and simulate against them; the kept command's workload and scheduler "
                    "flags are the defaults, flags given here win")
    ap.add_argument("--traces-dir", default=None, help="with --from-real: where the traces the kept run read are "
                    "here (its --trace path is re-rooted there)")
    ap.add_argument("--repeats", type=int, default=1, help="replay every policy this many times (the real-vs-real "
                    "floor); repeat k > 0 is kept in REAL_DIR/repeat<k> (needs --real-dir) and simulated by nothing")
    ap.add_argument("--record-decisions", action="store_true", help="keep the scheduler's decisions per step in "
                    "both backends (experiments.divergence)")
    ap.add_argument("--steps-out", default=None, help="write each real run's steps table to this parquet (with "
                    "several policies: <stem>_<policy>.parquet), a calibration input for experiments.calibrate")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    kept = saved_argv(args.from_real, args.name, args.traces_dir) if args.from_real else []
    if kept:        # the kept command's workload and scheduler flags first, so the ones given here win
        args = parse_args([*kept, *(sys.argv[1:] if argv is None else argv)])
    if args.from_real and args.trace and not Path(args.trace).is_file():
        raise ValueError(f"--trace {args.trace}: no such file here (the kept run read it on its own machine); "
                         f"give --traces-dir DIR, the folder holding {Path(args.trace).name} on this machine")
    if not args.model and not args.from_real and not args.real_url:
        raise ValueError("--model CHECKPOINT_DIR is required (or --from-real DIR to reuse saved real runs)")
    policies = [parse_label(p).label for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ValueError(f"--policies must be a comma-separated list of {policy_names()}, got {args.policies!r}")
    if args.repeats < 1 or (args.repeats > 1 and not args.real_dir):
        raise ValueError(f"--repeats must be >= 1 and needs --real-dir when > 1, got {args.repeats}")
    overrides, cost_model_overrides = split_overrides(args)
    swapping = {p: swaps(p, overrides) for p in policies}
    set_threads(args.threads, args.device)
    out_dir = Path(args.out_dir)
    cpu_blocks = args.num_cpu_blocks
    if cpu_blocks is None:
        cpu_blocks = (args.num_kvcache_blocks or 4096) if any(swapping.values()) else 0
    if args.real_url:           # the real side is a server (experiments/runner_http.py)
        rep = http_replayer(args, policies, cpu_blocks)
        cfg, device, model_dir = rep.config, f"server at {args.real_url}", args.model
        load_s, warm_s, runner_device = 0.0, 0.0, "http"
    elif args.from_real:        # the real side as measured before (experiments/saved_runs.py)
        rep = SavedReplays(args.from_real, args.name)
        rep.check_policies(policies)
        cfg, device, model_dir = rep.config, rep.device, rep.model_dir
        load_s, warm_s, runner_device = rep.meta["engine_load_s"], rep.meta["warmup_s"], rep.meta["runner_device"]
    else:
        cfg = engine_run_config(args, cpu_blocks)
        t0 = time.perf_counter()
        rep = EngineReplayer(cfg)
        load_s = time.perf_counter() - t0
        warm_s = rep.warmup()
        device, model_dir, runner_device = _device_name(rep.runner), args.model, str(rep.runner.device)
    # Clipped to the limit the engine settled on (a given --max-model-len was checked against the checkpoint).
    try:
        workload = build_workload(args, rep.max_model_len)
    except ValueError as e:
        if args.from_real and not kept:
            raise ValueError(f"{e} ({args.from_real}/{args.name}_real.json keeps no command, from before commands "
                             f"were kept: give the workload flags of the run that kept it)") from None
        raise
    specs = workload.specs()
    if args.from_real:
        rep.check_workload(specs, policies[0])
    print(f"engine ready: load {load_s:.1f} s, warm-up {warm_s:.1f} s, {rep.num_kvcache_blocks} KV blocks, "
          f"{rep.num_cpu_blocks} swap blocks{tier_note(rep, cfg)}; workload {workload.stats.source}: "
          f"{len(specs)} requests over "
          f"{workload.duration_s:.1f} s", flush=True)
    cost_models = {}
    if not args.no_roofline:
        cost_models["roofline"] = roofline_model(model_dir, args.hardware, runner_device, rep.max_model_len)
        if cost_models["roofline"].hardware.latency_floors_s:     # the same with the card's measured latency floors
            cost_models["roofline_floors"] = roofline_model(model_dir, args.hardware, runner_device,
                                                            rep.max_model_len, latency_floors=True)
    if args.profile:
        cost_models["calibrated"] = CalibratedCostModel.load(args.profile)
    for name in args.cost_model or []:
        if name in cost_models:
            raise ValueError(f"--cost-model {name}: the name is taken by the built-in {name}; drop it (--no-roofline "
                             f"drops the built-in roofline)")
        cost_models[name] = conf_cost_model(name, cost_model_overrides, model_dir, args.hardware, runner_device,
                                            rep.max_model_len)

    report = {
        "format": FORMAT, "name": args.name,
        "command": "python -m experiments.validate " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device, "engine": asdict(cfg), "engine_load_s": load_s, "warmup_s": warm_s,
        "real_side": (f"measured earlier, loaded from {args.from_real}" if args.from_real else
                      f"the server at {args.real_url}, replayed over HTTP" if args.real_url else
                      "measured in this run"),
        "workload": {"source": workload.stats.source, "summary": workload.stats.summary(), "num_requests": len(specs),
                     "duration_s": workload.duration_s, "mean_rate_rps": workload.mean_rate_rps,
                     "prompt_tokens_mean": float(np.mean(workload.num_prompt_tokens)),
                     "output_tokens_mean": float(np.mean(workload.num_output_tokens))},
        "cost_models": {k: (v.to_dict() if hasattr(v, "to_dict") else repr(v)) for k, v in cost_models.items()},
        # what each fitted file's own metadata says against trusting it (sim/cost_model/fit_trust.py)
        "cost_model_fit_concerns": {k: fit_concerns(getattr(v, "metadata", None), cfg.overlap_scheduling)
                                    for k, v in cost_models.items() if hasattr(v, "envelope")},
        "policies": {},
    }
    for name, concerns in report["cost_model_fit_concerns"].items():
        line = fit_warning(concerns, name)
        if line:
            print(line, file=sys.stderr, flush=True)
    runs_by_policy, real_infos = {}, {}
    argv_list = list(argv if argv is not None else sys.argv[1:])

    def replay(policy):
        kw = dict(num_cpu_blocks=cpu_blocks if swapping[policy] else 0, max_wall_s=args.max_wall_s)
        if args.from_real or args.real_url:
            return rep.replay(specs, policy, **kw)
        from engine.core.recorder import Recorder
        run = rep.replay(specs, make_policy(policy, overrides), eviction=make_eviction(overrides),
                         cpu_cache_eviction=make_cpu_cache_eviction(args.cpu_cache_eviction),
                         enable_chunked_prefill=parse_label(policy).chunked,
                         recorder=Recorder(record_decisions=args.record_decisions), **kw)
        run.info["policy"] = policy
        return run

    for policy in policies:
        entry = report["policies"][policy] = {}
        try:
            real = replay(policy)
        except Exception as exc:        # one failing policy must not lose the others' results
            entry["error"] = f"{type(exc).__name__}: {exc}"
            print(f"[{policy}] real run failed: {entry['error']}", flush=True)
            continue
        note_compiles(real.info)
        entry["real"] = {"summary": run_summary(real), "info": real.info}
        if args.real_dir:
            save_real_run(args.real_dir, args.name, policy, real)
            real_infos[policy] = real.info
            save_real_meta(args.real_dir, args.name, rep, device, runner_device, load_s, warm_s, real_infos,
                           argv_list)
        if args.steps_out:
            path = steps_out_path(args.steps_out, policy, len(policies))
            write_parquet(real.steps, path)
            entry["real"]["steps_file"] = str(path)
        runs = {"real": real}
        sched_cfg = policy_scheduler_config(rep.scheduler_config(num_cpu_blocks=cpu_blocks if swapping[policy] else 0),
                                            policy)
        entry["sims"] = {}
        for name, cm in cost_models.items():
            try:
                sim = simulate(specs, policy, cm, sched_cfg, rep.vocab_size, temperature=cfg.temperature,
                               rng_seed=cfg.seed, record_decisions=args.record_decisions, overrides=overrides,
                               cpu_cache_eviction=args.cpu_cache_eviction,
                               overlap_scheduling=cfg.overlap_scheduling)
            except Exception as exc:
                entry["sims"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            runs[name] = sim
            entry["sims"][name] = compare(real, sim, cm)
            entry["sims"][name]["info"] = sim.info
            warning = coverage_warning((entry["sims"][name].get("coverage") or {}).get("sim"), f"{name} ({policy})")
            if warning:
                print(warning, file=sys.stderr, flush=True)
            if args.save_tables:
                for kind in ("requests", "steps"):
                    atomic_write_text(out_dir / f"validation_{args.name}_{policy}_{name}_{kind}.csv",
                                 getattr(sim, kind).to_csv(index=False))
        if args.save_tables:
            for kind in ("requests", "steps"):
                atomic_write_text(out_dir / f"validation_{args.name}_{policy}_real_{kind}.csv",
                             getattr(real, kind).to_csv(index=False))
        runs_by_policy[policy] = runs
        print(_one_line(policy, entry), flush=True)
    # Repeats: the same replays again, interleaved by policy, kept for experiments.real_vs_real (not simulated).
    for k in range(1, args.repeats if not args.from_real else 1):
        repeat_dir, repeat_infos = Path(args.real_dir) / f"repeat{k}", {}
        for policy in policies:
            try:
                real = replay(policy)
            except Exception as exc:
                report["policies"][policy].setdefault("repeat_errors", {})[k] = f"{type(exc).__name__}: {exc}"
                print(f"[{policy}] repeat {k} failed: {exc}", flush=True)
                continue
            save_real_run(repeat_dir, args.name, policy, real)
            repeat_infos[policy] = real.info
            save_real_meta(repeat_dir, args.name, rep, device, runner_device, load_s, warm_s, repeat_infos,
                           argv_list)
            report["policies"][policy].setdefault("repeats", {})[k] = run_summary(real)
            print(f"[{policy}] repeat {k}: {run_summary(real)['e2e_s_p50']:.3f} s E2E p50", flush=True)
    if runs_by_policy and not args.no_plot:
        png = overlay_plot(runs_by_policy, out_dir / f"validation_{args.name}.png",
                           title=f"{args.name}: real vs simulated ({report['device']})")
        report["plot"] = png.name
    path = write_json(out_dir / f"validation_{args.name}.json", report)
    print(f"wrote {path}", flush=True)
    return 0


def http_replayer(args, policies: list[str], cpu_blocks: int):
    """The real side of --real-url: experiments.runner_http.HttpReplayer with the engine flags the server runs."""
    from engine.hf_config import load_hf_config
    from experiments.runner_http import HttpReplayer, target_of

    missing = [flag for flag, value in (("--model", args.model), ("--num-kvcache-blocks", args.num_kvcache_blocks),
                                        ("--max-model-len", args.max_model_len)) if value is None]
    if missing:
        raise ValueError(f"--real-url needs {', '.join(missing)}: the simulated side is given what the server runs "
                         "(--model: a folder with the served checkpoint's config.json)")
    if len(policies) != 1:
        raise ValueError(f"--real-url: the server runs one policy; give it alone as --policies, got {policies}")
    if args.repeats > 1:
        raise ValueError("--real-url replays once (--repeats 1)")
    cfg = engine_run_config(args, cpu_blocks)
    target = target_of({"url": args.real_url, "model": args.served_model, "temperature": args.temperature})
    return HttpReplayer(target, cfg, load_hf_config(args.model)["vocab_size"], args.max_model_len,
                        args.num_kvcache_blocks, cpu_blocks)


def tier_note(rep, cfg) -> str:
    """', N CPU-tier blocks (G GiB)' for the engine ready line, or '' without a tier."""
    blocks = getattr(rep, "cpu_cache_num_blocks", 0)
    if not blocks:
        return ""
    gib = getattr(cfg, "cpu_cache_gib", None)
    return f", {blocks} CPU-tier blocks" + (f" (cpu_cache_gib={gib:g})" if gib is not None else "")


def steps_out_path(path, policy: str, num_policies: int) -> Path:
    """--steps-out as given for one policy; <stem>_<policy><suffix> for several."""
    p = Path(path)
    return p if num_policies == 1 else p.with_name(f"{p.stem}_{policy}{p.suffix or '.parquet'}")


def _one_line(policy: str, entry: dict) -> str:
    r = entry["real"]["summary"]
    parts = [f"[{policy}] real: {r['output_throughput_tps']:.0f} out tok/s, {r['num_preemptions']} preemptions"]
    for name, e in entry["sims"].items():
        if "error" in e:
            parts.append(f"{name}: {e['error']}")
            continue
        med = e["e2e_s"]["median_rel_err"]
        tp = e["throughput"]["rel_err"]
        cov = (e.get("coverage") or {}).get("sim")
        parts.append(f"{name}: throughput err {_pct(tp)}, median |E2E| err {_pct(med)}, "
                     f"{e['preemptions']['sim']} preemptions"
                     + (f", {100 * cov['share_steps_outside']:.1f}% of steps outside its envelope" if cov else ""))
    return "; ".join(parts)


def _pct(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def _device_name(runner) -> str:
    from experiments.profile import device_name
    return device_name(runner)


if __name__ == "__main__":
    from experiments.user_errors import run_main
    sys.exit(run_main(main))
