"""The `servelab` command: compose a config with Hydra, run it, write the results.

    servelab                                   # built-in synthetic workload, Qwen3-8B on one H200, vllm policy
    servelab scheduler=srpt num_kvcache_blocks=2000
    servelab workload=azure workload.path=path/to/AzureLLMInferenceTrace_conv.csv
    servelab -m experiment=fcfs_vs_preemptive  # a sweep (resumable: relaunch to finish it)
    python -m experiments.run --help           # groups and options

Each run writes into Hydra's output dir (outputs/<name>/<time>/ for a single
run, sweeps/<name>/<overrides>/ for a sweep job): requests.parquet,
steps.parquet, config.yaml, plots and summary.json (see experiments/results.py).
A job whose folder already holds a complete summary.json is skipped (resume=true);
a single run never writes into a folder holding results (experiments/output_dirs.py).

A user's mistake (a bad value, an unknown key or option, a missing file) prints one line
`error: ...` and exits with status 2 (experiments/user_errors.py, experiments/config_check.py);
HYDRA_FULL_ERROR=1 shows the traceback instead. Ctrl-C exits with status 130 and says what was written.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments.compose import CONF_DIR  # (registers the schema before Hydra composes)
from experiments.config_check import check_config, null_group_choice, trace_format_hint
from experiments.ctrl_c import held
from experiments.job_record import lost_job_line, record_failure, record_start
from experiments.job_warnings import job_label, named_warnings
from experiments.output_dirs import interrupted_message, remove_unused_run, remove_unused_sweep, sweep_folder
from experiments.rejections import rejection_meta, warn_if_rejected
from experiments.results import config_diff, is_complete, read_summary, save_run, saved_config
from experiments.sweep_stop import NOT_RUN, end_sweep_stop, in_sweep_worker, stop_requested, stopped_by_user
from experiments.user_errors import (
    TRACEBACK_ENV,
    USER_ERRORS,
    MissingExtraError,
    fail,
    is_user_error,
    nearest,
    one_line,
    tracebacks_wanted,
)
from experiments.workloads.changes import describe_input

GROUPS = ("backend", "backend/cost_model", "model", "hardware", "scheduler", "victim", "eviction", "router",
          "workload", "experiment")


# Packages of the `engine` extra (pyproject.toml); a simulator-only install has none of them.
ENGINE_PACKAGES = ("torch", "transformers", "safetensors", "triton")


def get_runner(backend_name: str):
    """run(cfg, desc) -> RunResult for the chosen backend."""
    if backend_name == "sim":
        from experiments.runner_sim import run_sim
        return run_sim
    if backend_name == "engine":
        try:
            # the engine runner imports these only once it builds the engine: probe them first
            import safetensors  # noqa: F401
            import torch  # noqa: F401

            from experiments.runner_engine import run_engine
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] in ENGINE_PACKAGES:
                raise MissingExtraError(f"backend=engine needs the engine extra ({e.name} is not installed): "
                                        "pip install -e '.[engine]' (install the torch build for your machine "
                                        "first), or use backend=sim") from e
            raise
        return run_engine
    if backend_name == "http":
        try:
            import httpx  # noqa: F401  (the replay imports it only once it sends)
        except ModuleNotFoundError as e:
            raise MissingExtraError("backend=http needs httpx: pip install -e '.[http]'") from e
        from experiments.runner_http import run_http
        return run_http
    raise ValueError(f"backend.name must be 'sim', 'engine' or 'http', got {backend_name!r}")


def chose_model(overrides: list) -> list:
    """The command line's overrides that picked or changed the model (then the engine checks it against its
    checkpoint; left at its default, the model is whatever the checkpoint holds)."""
    return [o for o in overrides if (k := o.split("=", 1)[0].lstrip("+~")) == "model" or k.startswith("model.")]


def slo_of(cfg: DictConfig) -> dict | None:
    slo = {k: cfg.get(f"{k}_slo_s") for k in ("ttft", "tpot", "e2e")}
    slo = {f"{k}_s": float(v) for k, v in slo.items() if v is not None}
    return slo or None


def _fmt(x, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}{unit}"
    return f"{x}{unit}"


def format_summary(summary: dict) -> str:
    """A plain-text table of the numbers most runs are judged by."""
    m, meta = summary["metrics"], summary["meta"]
    http = meta.get("backend") == "http"
    rows = [
        ("setup", f"{meta.get('model')} on {meta.get('hardware')} x{meta.get('num_replicas', 1)}, "
                  + (_server_policies(meta.get("server") or {}) if http else
                     f"scheduler={summary.get('choices', {}).get('scheduler')}, "
                     f"eviction={summary.get('choices', {}).get('eviction')}")
                  + (", overlap scheduling on" if meta.get("overlap_scheduling") else "")),
        ("workload", f"{meta.get('num_workload_requests')} requests at {_fmt(meta.get('request_rate_rps'), ' req/s')}"
                     f" ({meta.get('workload_source')})"),
        ("input", describe_input(meta)),
        ("limits", f"max_model_len {meta.get('max_model_len')} ({meta.get('max_model_len_source')}), "
                   + ("max_num_batched_tokens set by the server" if http and meta.get("max_num_batched_tokens") is None
                      else f"max_num_batched_tokens {meta.get('max_num_batched_tokens')} "
                           f"({meta.get('max_num_batched_tokens_source')})")),
        ("KV cache", "set by the server" if http and meta.get("num_kvcache_blocks") is None else
                     f"{meta.get('num_kvcache_blocks')} blocks (+{meta.get('num_cpu_blocks')} CPU swap blocks"
                     + (f", +{meta['cpu_cache_num_blocks']} CPU-tier prefix blocks" if meta.get('cpu_cache_num_blocks')
                        else "")
                     + (f" = cpu_cache_gib {meta['cpu_cache_gib']:g}" if meta.get('cpu_cache_gib') is not None
                        else "") + ")" + (" (the server's)" if http else "")),
        ("finished / rejected", f"{m.get('num_finished')} / {m.get('num_rejected')}"
                                + (f" / {meta['num_failed']} failed" if meta.get("num_failed") else "")
                                + (f" ({meta['num_rejected_by_limits']} by the run's limits: see the WARNING)"
                                   if meta.get("rejected_by_limits_warning") else "")
                                + ("  (INTERRUPTED: partial results)" if not summary["complete"] else "")),
        ("makespan", _fmt(m.get("makespan_s"), " s")),
        ("throughput", f"{_fmt(m.get('request_throughput_rps'), ' req/s')}, "
                       f"{_fmt(m.get('output_throughput_tps'), ' output tok/s')}"),
    ]
    for name, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"),
                        ("normalized_latency_s", "normalized latency")):
        rows.append((f"{label} p50 / p99", f"{_fmt(m.get(name + '_p50'), ' s')} / {_fmt(m.get(name + '_p99'), ' s')}"))
    if "goodput_rps" in m:
        rows.append(("goodput", f"{_fmt(m['goodput_rps'], ' req/s')} (SLO attainment {_fmt(m.get('slo_attainment'))})"))
    if "slo_attainment_targets" in m:
        rows.append(("request targets", f"{m['num_with_slo']} requests with targets: attainment "
                                        f"{_fmt(m['slo_attainment_targets'])}, goodput "
                                        f"{_fmt(m['goodput_targets_rps'], ' req/s')}, rejected by the policy "
                                        f"{m.get('num_rejected_by_policy')}"))
    rows += [
        ("preemptions", "not seen by a client (the server's /metrics has them)" if http else
                        f"{m.get('num_preemptions')} ({m.get('num_preempted_requests')} requests), "
                        f"swaps {m.get('num_swaps')}"),
        ("mean batch / KV use", f"{_fmt(m.get('mean_batch_size'))} / {_fmt(m.get('kv_usage_mean'))} "
                                f"(max {_fmt(m.get('kv_usage_max'))})"),
    ]
    if meta.get("cpu_cache_num_blocks"):
        rows.append(("prefix-cache hits", f"{_fmt(_pct(m.get('prefix_cache_hit_rate')), '%')} of prompt tokens: "
                                          f"GPU {_fmt(_pct(m.get('prefix_cache_hit_rate_gpu')), '%')}, CPU tier "
                                          f"{_fmt(_pct(m.get('prefix_cache_hit_rate_cpu')), '%')}"))
    elif m.get("prefix_cache_hit_rate"):      # any hit at all (several replicas: all of them together)
        rows.append(("prefix-cache hits", f"{_fmt(_pct(m.get('prefix_cache_hit_rate')), '%')} of prompt tokens"))
    rows += replica_rows(summary)
    rows += tenant_rows(summary)
    if "cost_model_coverage" in meta:
        from sim.cost_model.envelope import format_coverage
        rows.append(("cost-model coverage", format_coverage(meta["cost_model_coverage"])))
    if meta.get("cost_model_fit_concerns"):     # sim/cost_model/fit_trust.py: the file's own doubts, counted
        n = len(meta["cost_model_fit_concerns"])
        rows.append(("cost-model doubts", f"{n} (the WARNING above; summary.json meta cost_model_fit_concerns)"))
    if meta.get("cost_model_mismatch"):
        rows.append(("cost-model file", f"made for another model or GPU ({meta['cost_model_mismatch']}); "
                                        "allow_mismatch=true"))
    if summary.get("sim_band"):
        from experiments.sim_band import format_band
        rows.append(("simulator's band", format_band(summary["sim_band"])))
    if meta.get("sim_wall_time_s") is not None:
        rows.append(("simulation wall time", _fmt(meta["sim_wall_time_s"], " s")))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _server_policies(server: dict) -> str:
    """backend=http: the scheduling and eviction policies the server reported (servelab-serve's /v1/models), the
    ones that ran; the run's own scheduler= and eviction= choices do not apply."""
    if server.get("scheduler") is None:
        return "scheduler and eviction set by the server"
    return f"scheduler={server['scheduler']}, eviction={server.get('eviction')} (the server's)"


def replica_rows(summary: dict) -> list[tuple[str, str]]:
    """One line per replica (summary["replicas"], runs with more than one), then a WARNING line when the
    busiest replica carries more than metrics.IMBALANCE_WARN_RATIO times the mean replica's tokens."""
    from experiments.metrics import IMBALANCE_WARN_RATIO

    table, m = summary.get("replicas") or [], summary["metrics"]
    rows = [(f"replica {r['replica']}", f"{r['num_requests']} req ({_fmt(100 * r['request_share'], '%')}), "
                                       f"busy {_fmt(_pct(r.get('busy_fraction')), '%')}, "
                                       f"KV mean/max {_fmt(r.get('kv_usage_mean'))}/{_fmt(r.get('kv_usage_max'))}, "
                                       f"prefix hits {_fmt(_pct(r.get('prefix_cache_hit_rate')), '%')}, "
                                       f"TTFT p50 {_fmt(r.get('ttft_s_p50'), ' s')}") for r in table]
    ratio = m.get("replica_tokens_max_over_mean")
    if ratio is not None and ratio > IMBALANCE_WARN_RATIO:
        busiest = max(table, key=lambda r: r["num_tokens"]) if table else None
        where = f"replica {busiest['replica']} " if busiest else "the busiest replica "
        rows.append(("WARNING", f"load imbalanced: {where}carries {ratio:.3g}x the mean replica's tokens"
                                f" ({m.get('num_idle_replicas')} replicas idle); check the router choice"))
    return rows


def _pct(x):
    return None if x is None else 100 * x


def tenant_tables(requests) -> dict:
    """summary.json's per-tenant and per-class rows (experiments.tenant_metrics), for runs with more than one
    tenant or with latency targets; {} otherwise."""
    from experiments.tenant_metrics import per_class, per_tenant
    if not len(requests) or "tenant" not in requests:
        return {}
    out = {}
    if requests["tenant"].nunique() > 1:
        out["tenants"] = per_tenant(requests).to_dict("records")
    if requests["slo_met"].notna().any():
        out["slo_classes"] = per_class(requests).to_dict("records")
    return out


def tenant_rows(summary: dict) -> list[tuple[str, str]]:
    """One line per tenant and per service class (summary's tenants and slo_classes) and the fairness numbers.

    A tenant's share of the run's service is its demand's once every request finishes (a weight or a fair policy
    moves when a tenant is served, not how much): the fairness line, over the windows where tenants queue, is where
    policies differ."""
    m = summary["metrics"]
    rows = [(f"tenant {r['tenant']}", f"{r['num_requests']} req, {_fmt(r['output_throughput_tps'], ' output tok/s')}, "
                                      f"{_fmt(_pct(r['service_share']), '%')} of the run's service, TTFT p50 / p99 "
                                      f"{_fmt(r['ttft_s_p50'], ' s')} / {_fmt(r['ttft_s_p99'], ' s')}, SLO attainment "
                                      f"{_fmt(r['slo_attainment'])}") for r in summary.get("tenants") or []]
    # named as servelab-report's columns (summary.json metrics), so the line and a sweep's table read alike
    if "jain_index" in m and not m.get("num_backlogged_windows"):
        rows.append(("fairness", no_backlog_line(m)))
    elif "jain_index" in m:
        rows.append(("fairness", f"jain_index {_fmt(m['jain_index'])}, service_diff_rate_mean "
                                 f"{_fmt(m.get('service_diff_rate_mean'), ' tok/s')} (max "
                                 f"{_fmt(m.get('service_diff_rate_max'), ' tok/s')}): Jain's index and service "
                                 f"difference among backlogged tenants over {m.get('num_backlogged_windows')} "
                                 f"backlogged windows; jain_index_overall {_fmt(m.get('jain_index_overall'))}"))
    rows += [(f"class {r['slo_class']}", f"{r['num_requests']} req, attainment TTFT / TPOT / both "
                                         f"{_fmt(r['ttft_attainment'])} / {_fmt(r['tpot_attainment'])} / "
                                         f"{_fmt(r['slo_attainment'])}, goodput {_fmt(r['goodput_rps'], ' req/s')}, "
                                         f"rejected by the policy {r['num_rejected_by_policy']}")
             for r in summary.get("slo_classes") or []]
    return rows


def no_backlog_line(m: dict) -> str:
    """The fairness line of a run without a window in which two tenants were backlogged, and why. Fairness among
    tenants is defined where they compete: a tenant served as it asks gets what it asks, whatever the others' load."""
    head = "jain_index -, service_diff_rate_mean - (among backlogged tenants): no window with two tenants backlogged"
    # how to get the figures: tenants that compete (the fcfs_vs_vtc preset keeps all three backlogged)
    overall = (f"jain_index_overall {_fmt(m.get('jain_index_overall'))} over the whole run (service shares follow "
               "the demand); for the figures give each tenant more than its share, e.g. experiment=fcfs_vs_vtc")
    windows = f"the {m.get('num_windows')} windows of {_fmt(m.get('window_s'), ' s')}"
    if "num_windows_any_backlogged" not in m:          # a summary from before these counts
        return f"{head}; {overall}"
    if not m["num_windows_any_backlogged"]:
        return (f"{head}: no tenant had a request waiting through any of {windows} (the load is below what the "
                f"GPU serves); {overall}")
    return (f"{head}: only one at a time had requests waiting through a whole window ({m.get('backlogged_tenants')} "
            f"of {windows}), the others were served as their requests came (they asked less than their share); "
            f"{overall}")


def _plot(result, label: str, replicas=None, tenant_extra=None):
    def draw(run_dir: Path) -> None:
        from experiments import plots
        fin = result.requests
        if (fin["status"] == "finished").any():
            plots.latency_cdf({label: fin}, run_dir / "latency_cdf.png", metric="ttft_s")
        if len(result.steps):
            steps = result.steps[result.steps["replica"] == result.steps["replica"].min()]
            plots.step_timeline(steps, run_dir / "step_timeline.png", title=label)
        if replicas is not None:
            plots.replica_load(replicas, run_dir / "replica_load.png", title=label)
        if tenant_extra and "tenants" in tenant_extra:
            from experiments.tenant_metrics import service_difference, service_timeline
            timeline = service_timeline(fin)
            plots.tenant_service(timeline, service_difference(timeline), run_dir / "tenant_service.png", title=label)
            plots.tenant_latency(tenant_extra["tenants"], run_dir / "tenant_latency.png", title=label)
        if tenant_extra and "slo_classes" in tenant_extra:
            plots.slo_classes(tenant_extra["slo_classes"], run_dir / "slo_classes.png", title=label)
    return draw


def execute(cfg: DictConfig, out_dir, choices: dict | None = None, overrides: list | None = None,
            label: str | None = None, record_job: bool = False) -> dict:
    """Run one composed config into out_dir (or skip it when already complete); returns its summary.
    record_job: write out_dir/job.json (what runs the job: host, SLURM ids, log) once the job is not skipped."""
    out_dir = Path(out_dir)
    choices = {k: v for k, v in (choices or {}).items() if k in GROUPS}
    label = label or choices.get("scheduler") or "run"
    check_config(cfg)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    if cfg.resume and is_complete(out_dir):
        saved = saved_config(out_dir)
        diff = config_diff(saved, OmegaConf.to_container(cfg, resolve=True)) if saved is not None else []
        if diff:
            raise ValueError(f"{out_dir} holds complete results of a different config (differs in {diff[:5]}); "
                             "give this run another name=..., or delete that folder to run again")
        print(f"[skip] {out_dir} is complete (resume=true)", flush=True)
        return read_summary(out_dir)
    if record_job:
        record_start(out_dir)
    t0 = time.perf_counter()
    runner = get_runner(cfg.backend.name)
    chosen = chose_model(overrides or [])
    if cfg.backend.name == "engine" and chosen:
        from experiments.runner_engine import check_model_matches
        check_model_matches(cfg, chosen)
    with held("stopping once the results so far are written"):     # the runner's loop stops at once
        try:
            result = runner(cfg, desc=label)
        except USER_ERRORS + (InstantiationException,) as e:
            hint = trace_format_hint(cfg)
            if hint is None:
                raise
            raise ValueError(f"{one_line(e)}; {hint}") from e
        if not result.complete and not len(result.requests) and not len(result.steps):
            raise KeyboardInterrupt     # stopped before the run's first step: there is nothing to write
        summary = _summarize_and_save(cfg, out_dir, result, config_yaml, choices, overrides, label, t0)
    if not result.complete:
        raise KeyboardInterrupt
    return summary


def _summarize_and_save(cfg, out_dir: Path, result, config_yaml: str, choices: dict, overrides, label: str,
                        t0: float) -> dict:
    from experiments.metrics import per_replica
    from experiments.metrics import summary as summarize

    result.meta.update(rejection_meta(result.requests))
    result.meta["rejected_by_limits_warning"] = warn_if_rejected(result.meta, len(result.requests))
    num_replicas = int(result.meta.get("num_replicas") or 1)
    metrics = summarize(result.requests, result.steps, slo_of(cfg), result.token_times, num_replicas=num_replicas)
    extra = {"choices": choices, "overrides": list(overrides or []), "name": cfg.name, "seed": int(cfg.seed),
             "wall_time_s": time.perf_counter() - t0}
    if getattr(result, "perturbed", None):       # the simulator's own band (experiments/sim_band.py)
        from experiments.sim_band import band_section
        extra["sim_band"] = band_section(result.meta["price_band"], metrics, [
            (factor, summarize(r.requests, r.steps, slo_of(cfg), num_replicas=num_replicas))
            for factor, r in result.perturbed])
    replicas = per_replica(result.requests, result.steps, num_replicas) if num_replicas > 1 else None
    if replicas is not None:
        extra["replicas"] = replicas.to_dict("records")
    tenants = tenant_tables(result.requests)
    extra.update(tenants)
    plot = _plot(result, label, replicas, tenants) if cfg.plots and len(result.requests) else None
    summary = save_run(out_dir, result, metrics, config_yaml, extra, before_summary=plot)
    if cfg.print_summary:
        print(format_summary(summary), flush=True)
        print(f"results: {out_dir}", flush=True)
    return summary


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    sweep_job = hc.mode == RunMode.MULTIRUN
    try:
        if not sweep_job:
            return execute(cfg, hc.runtime.output_dir, dict(hc.runtime.choices), list(hc.overrides.task),
                           label=hc.job.override_dirname or None)
        if stop_requested(hc.sweep.dir):      # Ctrl-C stopped the sweep before this job started
            record_failure(hc.runtime.output_dir, NOT_RUN)
            return None
        with named_warnings(job_label(hc.runtime.output_dir, hc.sweep.dir, hc.overrides.task)):
            return execute(cfg, hc.runtime.output_dir, dict(hc.runtime.choices), list(hc.overrides.task),
                           label=hc.job.override_dirname or None, record_job=True)
    except KeyboardInterrupt:
        if sweep_job and in_sweep_worker():
            return None     # what it had is written (complete=false): the launching process stops the sweep
        raise
    except Exception as e:
        if sweep_job:       # servelab-report names the failed job and this line (experiments/job_record.py)
            why = one_line(e) if is_user_error(e) else f"{type(e).__name__}: {one_line(e)}"
            record_failure(hc.runtime.output_dir, why)
        # Hydra would print "Error executing job ..." and a traceback: a user's mistake gets one line.
        if is_user_error(e) and not tracebacks_wanted():
            if os.environ.get("SUBMITIT_EXECUTOR"):
                # A submitit job (SLURM, submitit_local) hands its error back to the submitting `servelab`
                # through its result file, which an exit would not write (and a cluster without accounting then
                # waits for the job forever). The line itself travels: a pickled exception loses its __cause__.
                raise ValueError(one_line(e)) from e
            fail(one_line(e))
        raise


def quote_tilde(arg: str) -> str:
    """`key=~/x` as `key='~/x'`: Hydra's override grammar has no unquoted `~` inside a value (the
    shell leaves it alone after `key.sub=`); the path fields expand it (experiments/config_check.py).
    Hydra's own folders (hydra.run.dir, hydra.sweep.dir) are used before that check: expanded here."""
    key, sep, value = arg.partition("=")
    if arg.startswith("-") or not sep or not value.startswith("~") or any(c in value for c in "'\"[]{}()"):
        return arg
    if key.lstrip("+").startswith("hydra."):
        return key + sep + os.path.expanduser(value)
    return key + sep + ",".join(f"'{v}'" if v.startswith("~") else v for v in value.split(","))


def unknown_option(argv: list[str]) -> str | None:
    """The error line for a command-line option Hydra does not know (it would print its whole usage), else None."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    _, rest = parser.parse_known_args(argv)
    bad = next((a for a in rest if a.startswith("-")), None)
    if bad is None:
        return None
    known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    return f"unknown option {bad}{nearest(bad.split('=')[0], known)} (servelab --help lists the options)"


def main() -> None:
    sys.argv[1:] = [quote_tilde(a) for a in sys.argv[1:]]
    wanted = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ[TRACEBACK_ENV] = "1" if wanted else "0"      # read by the jobs, sweep workers too
    os.environ["HYDRA_FULL_ERROR"] = "1"                    # Hydra raises its composition errors to here
    null_group = None if wanted else null_group_choice(sys.argv[1:])
    if null_group:
        fail(null_group)
    unknown = unknown_option(sys.argv[1:])
    if unknown:
        fail(unknown)
    try:
        try:
            hydra_main()
        except Exception:
            if not stopped_by_user():
                raise
            # a worker killed by the Ctrl-C while it started (joblib's TerminatedWorkerError): the sweep stopped
        if stopped_by_user():       # a parallel sweep's first Ctrl-C let its jobs write what they had
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        end_sweep_stop()
        remove_unused_run()         # a single run stopped while Hydra made its folder, before it wrote anything
        print(interrupted_message(), file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:         # fail(): a refused setting or input
        if e.code not in (0, None):
            remove_unused_run()
        raise
    except Exception as e:
        removed = remove_unused_sweep()     # a launch that failed before any job started leaves no folder behind
        remove_unused_run()         # nor a single run that wrote nothing
        lost = None if wanted else lost_job_line(e)      # submitit: a job (SLURM, submitit_local) left no result
        if lost:
            sweep = sweep_folder() or "the sweep folder"
            fail(f"{lost}. Jobs still running go on and finished ones are kept: servelab-report {sweep} lists the "
                 "jobs without results; the same command again runs only those")
        if wanted or not is_user_error(e):
            raise
        # a launch that failed printed its sweep folder first: say that nothing is there
        announced, gone = sweep_folder(), ""
        if removed:
            gone = f" (no job started: the sweep folder {removed} is removed)"
        elif announced and not Path(announced).exists():
            gone = f" (no job started: the sweep folder {announced} was not created)"
        fail(one_line(e) + gone)


if __name__ == "__main__":
    main()
