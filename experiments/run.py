"""The `servelab` command: compose a config with Hydra, run it, write the results.

    servelab                                   # built-in synthetic workload, Qwen3-8B on one H200, vllm policy
    servelab scheduler=srpt num_kvcache_blocks=2000
    servelab workload=azure workload.path=traces/AzureLLMInferenceTrace_conv.csv
    servelab -m experiment=fcfs_vs_preemptive  # a sweep (resumable: relaunch to finish it)
    python -m experiments.run --help           # groups and options

Each run writes into Hydra's output dir (outputs/<name>/<time>/ for a single
run, sweeps/<name>/<overrides>/ for a sweep job): requests.parquet,
steps.parquet, config.yaml, plots and summary.json (see experiments/results.py).
A job whose folder already holds a complete summary.json is skipped (resume=true).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import experiments.config  # noqa: F401  (registers the schema before Hydra composes)
from experiments.results import config_diff, is_complete, read_summary, save_run, saved_config

GROUPS = ("backend", "backend/cost_model", "model", "hardware", "scheduler", "eviction", "router", "workload",
          "experiment")


def get_runner(backend_name: str):
    """run(cfg, desc) -> RunResult for the chosen backend."""
    if backend_name == "sim":
        from experiments.runner_sim import run_sim
        return run_sim
    if backend_name == "engine":
        contract = ("run_engine(cfg, desc) -> experiments.runner_sim.RunResult, building the engine from "
                    "cfg.backend (model_path, device, attention_backend, enforce_eager, dtype)")
        try:
            import experiments.runner_engine as mod
        except ModuleNotFoundError as e:
            if e.name == "experiments.runner_engine":
                raise NotImplementedError(f"engine backend: experiments/runner_engine.py does not exist yet; it must "
                                          f"define {contract}. Use backend=sim meanwhile") from None
            raise
        if not hasattr(mod, "run_engine"):
            raise NotImplementedError(f"engine backend: experiments/runner_engine.py does not define {contract} yet. "
                                      "Use backend=sim meanwhile")
        return mod.run_engine
    raise ValueError(f"backend.name must be 'sim' or 'engine', got {backend_name!r}")


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
    rows = [
        ("setup", f"{meta.get('model')} on {meta.get('hardware')} x{meta.get('num_replicas', 1)}, "
                  f"scheduler={summary.get('choices', {}).get('scheduler')}, "
                  f"eviction={summary.get('choices', {}).get('eviction')}"),
        ("workload", f"{meta.get('num_workload_requests')} requests at {_fmt(meta.get('request_rate_rps'), ' req/s')}"
                     f" ({meta.get('workload_source')})"),
        ("KV cache", f"{meta.get('num_kvcache_blocks')} blocks (+{meta.get('num_cpu_blocks')} CPU swap blocks)"),
        ("finished / rejected", f"{m.get('num_finished')} / {m.get('num_rejected')}"
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
    rows += [
        ("preemptions", f"{m.get('num_preemptions')} ({m.get('num_preempted_requests')} requests), "
                        f"swaps {m.get('num_swaps')}"),
        ("mean batch / KV use", f"{_fmt(m.get('mean_batch_size'))} / {_fmt(m.get('kv_usage_mean'))} "
                                f"(max {_fmt(m.get('kv_usage_max'))})"),
    ]
    if "cost_model_coverage" in meta:
        from sim.cost_model.envelope import format_coverage
        rows.append(("cost-model coverage", format_coverage(meta["cost_model_coverage"])))
    if meta.get("cost_model_mismatch"):
        rows.append(("cost-model file", f"made for another model or GPU ({meta['cost_model_mismatch']}); "
                                        "allow_mismatch=true"))
    if meta.get("sim_wall_time_s") is not None:
        rows.append(("simulation wall time", _fmt(meta["sim_wall_time_s"], " s")))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _plot(result, label: str):
    def draw(run_dir: Path) -> None:
        from experiments import plots
        fin = result.requests
        if (fin["status"] == "finished").any():
            plots.latency_cdf({label: fin}, run_dir / "latency_cdf.png", metric="ttft_s")
        if len(result.steps):
            steps = result.steps[result.steps["replica"] == result.steps["replica"].min()]
            plots.step_timeline(steps, run_dir / "step_timeline.png", title=label)
    return draw


def execute(cfg: DictConfig, out_dir, choices: dict | None = None, overrides: list | None = None,
            label: str | None = None) -> dict:
    """Run one composed config into out_dir (or skip it when already complete); returns its summary."""
    from experiments.metrics import summary as summarize

    out_dir = Path(out_dir)
    choices = {k: v for k, v in (choices or {}).items() if k in GROUPS}
    label = label or choices.get("scheduler") or "run"
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    if cfg.resume and is_complete(out_dir):
        saved = saved_config(out_dir)
        diff = config_diff(saved, OmegaConf.to_container(cfg, resolve=True)) if saved is not None else []
        if diff:
            raise ValueError(f"{out_dir} holds complete results of a different config (differs in {diff[:5]}); "
                             "give this run another name=..., or delete that folder to run again")
        print(f"[skip] {out_dir} is complete (resume=true)", flush=True)
        return read_summary(out_dir)
    t0 = time.perf_counter()
    result = get_runner(cfg.backend.name)(cfg, desc=label)
    metrics = summarize(result.requests, result.steps, slo_of(cfg), result.token_times)
    extra = {"choices": choices, "overrides": list(overrides or []), "name": cfg.name, "seed": int(cfg.seed),
             "wall_time_s": time.perf_counter() - t0}
    plot = _plot(result, label) if cfg.plots and len(result.requests) else None
    summary = save_run(out_dir, result, metrics, config_yaml, extra, before_summary=plot)
    if cfg.print_summary:
        print(format_summary(summary), flush=True)
        print(f"results: {out_dir}", flush=True)
    if not result.complete:
        raise KeyboardInterrupt
    return summary


# An absolute path: Hydra would read a relative one as the Python package `conf`, which only imports
# when the command runs from the repository root.
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    return execute(cfg, hc.runtime.output_dir, dict(hc.runtime.choices), list(hc.overrides.task),
                   label=hc.job.override_dirname or None)


def main() -> None:
    try:
        hydra_main()
    except KeyboardInterrupt:
        print("interrupted: requests finished so far were written (summary.json complete=false); "
              "relaunch to run it again", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
