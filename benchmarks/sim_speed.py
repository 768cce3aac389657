"""Simulator speed: wall time per simulated request and step, on one core, with the settings users get.

Every scenario runs with servelab's defaults (DEFAULTS below: the values of conf/ and
experiments/config.py, which tests/experiments/test_conf.py checks against the composed
config) unless a flag changes one: prefix caching on (LRU), max_model_len the model's context
window (40,960 for Qwen3-8B: no Azure request is clipped), max_num_batched_tokens derived
(engine/core/token_budget.py: max(max_model_len, 8192) with chunked prefill off), chunked prefill off,
KV blocks from 90% of GPU memory, the roofline cost model with conf/backend/cost_model/roofline.yaml's
efficiencies and overheads, the vllm policy, Qwen3-8B on H200, the model's vocabulary.

Scenarios (`--scenario all`, the default, runs each in a fresh Python process so start-up is
counted, then prints one table of them with their commands):
  azure     the Azure LLM conversation trace (19,366 requests, native arrival times), one replica;
            also with prefix caching off, without step rows, with overlap scheduling, and at the former
            4,096-token default (max_model_len = 4096, max_num_batched_tokens = 8192: long prompts clipped)
  poisson   N synthetic Poisson requests (ShareGPT-like lognormal lengths, or lengths drawn
            from the ShareGPT length file) across R replicas behind a router
  coldstart python start + imports to the first simulated event

It prints requests/s, steps/s, the share of steps taken by the decode fast path, wall and CPU
times, and ratios against Vidur's speed on the same trace (VIDUR_RPS requests per wall-second
on a 2-core machine). The traces are read from ../shared/traces/ beside the repository root
(SERVELAB_TRACES=DIR reads them from DIR instead).

    python benchmarks/sim_speed.py                                  # every scenario, one table
    python benchmarks/sim_speed.py --scenario azure [--no-prefix-caching] [--record-steps none] [--overlap-scheduling]
    python benchmarks/sim_speed.py --scenario poisson --requests 100000
    python benchmarks/sim_speed.py --scenario azure --profile       # cProfile top functions
"""
from __future__ import annotations

import time

T_PROCESS = time.perf_counter()     # as early as possible: start-up is part of the figures

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACES = Path(os.environ.get("SERVELAB_TRACES", ROOT.parent / "shared" / "traces"))
AZURE_CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"
SHAREGPT = TRACES / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
VIDUR_RPS = 400.0                   # Vidur on the Azure conversation trace, requests per wall-second, 2 cores

# servelab's defaults (conf/config.yaml, experiments/config.py ServelabConfig, conf/eviction/lru.yaml,
# conf/scheduler/vllm.yaml, conf/backend/cost_model/roofline.yaml); tests/experiments/test_conf.py
# checks them against the composed config.
DEFAULTS = dict(
    model="Qwen3-8B", hardware="H200", policy="vllm", eviction="lru", seed=0,
    block_size=16, max_num_seqs=256, max_num_batched_tokens=None, max_model_len=None,
    enable_chunked_prefill=False, enable_prefix_caching=True, gpu_memory_utilization=0.9,
    activation_reserve_gib=1.0,
    roofline=dict(matmul_efficiency=0.7, attention_efficiency=0.5, memory_efficiency=0.8, overhead_s=0.003,
                  per_seq_overhead_s=1.0e-05, allreduce_latency_s=5.0e-06, use_measured=True,
                  latency_floors=False),
)
# (name, flags) of `--scenario all`, each in its own process
ALL = (("coldstart", ["--scenario", "coldstart"]),
       ("azure, defaults", ["--scenario", "azure"]),
       ("azure, prefix caching off", ["--scenario", "azure", "--no-prefix-caching"]),
       ("azure, no step rows", ["--scenario", "azure", "--record-steps", "none"]),
       ("azure, overlap scheduling", ["--scenario", "azure", "--overlap-scheduling"]),
       ("azure, max_model_len 4096", ["--scenario", "azure", "--max-model-len", "4096",
                                      "--max-num-batched-tokens", "8192"]),
       ("poisson, defaults", ["--scenario", "poisson"]))


class LogNormal:
    """Integer lengths exp(N(mu, sigma)), clipped to [lo, hi] (ShareGPT-like by default: median ~245/150)."""

    def __init__(self, mu: float, sigma: float, lo: int, hi: int):
        self.mu, self.sigma, self.lo, self.hi = mu, sigma, lo, hi

    def sample(self, n, rng):
        import numpy as np
        return np.clip(rng.lognormal(self.mu, self.sigma, n).astype(np.int64), self.lo, self.hi)


def build_replicas(n: int, args):
    from engine.core.scheduler import Scheduler, SchedulerConfig
    from policies.eviction.lru import LRUEviction
    from policies.registry import make_scheduling_policy
    from sim.cost_model import RooflineCostModel
    from sim.replica import Replica
    from sim.specs import get_hardware_spec, get_model_spec, num_kv_blocks
    d = DEFAULTS
    spec, hw = get_model_spec(d["model"]), get_hardware_spec(d["hardware"])
    blocks = num_kv_blocks(spec, hw, d["block_size"], d["gpu_memory_utilization"], 1, d["activation_reserve_gib"])
    roofline = dict(d["roofline"], overhead_s=args.overhead_s)
    reps = []
    for _ in range(n):
        cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=d["block_size"], max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                              enable_chunked_prefill=d["enable_chunked_prefill"],
                              enable_prefix_caching=args.prefix_caching)
        cm = RooflineCostModel(spec, hw, max_model_len=args.max_model_len, **roofline)
        reps.append(Replica(Scheduler(cfg, make_scheduling_policy(args.policy), LRUEviction()), cm,
                            overlap_scheduling=args.overlap_scheduling))
    return reps, blocks, spec.vocab_size


def settings(args) -> str:
    return (f"prefix caching {'on' if args.prefix_caching else 'off'}, max_model_len {args.max_model_len}, "
            f"max_num_batched_tokens {args.max_num_batched_tokens}, per-step rows: {args.record_steps}, "
            f"overlap scheduling {'on' if args.overlap_scheduling else 'off'}")


def report(name: str, res, t_start: float, t_sim0: float, args, extra: str = "") -> None:
    wall_total = time.perf_counter() - t_start
    cpu_total = time.process_time()
    sim_wall = res.wall_s
    t = time.perf_counter()
    res.fraction_of_physical_limit          # builds the tables and the roofline bound (not in wall_total)
    print(f"[{name}] tables + roofline bound built in {time.perf_counter() - t:.2f} s")
    rps = res.num_requests / sim_wall
    print(f"[{name}] {settings(args)}")
    print(f"[{name}] {res.summary()}")
    print(f"[{name}] wall: {wall_total:.2f} s total from process start ({t_sim0 - t_start:.2f} s start-up, "
          f"imports and workload; {sim_wall:.2f} s simulating); process CPU {cpu_total:.2f} s")
    print(f"[{name}] {rps:,.0f} requests/s, {res.num_steps / sim_wall:,.0f} steps/s, "
          f"{100 * res.fast_step_fraction:.1f}% of steps by the fast path, "
          f"{res.num_requests / wall_total:,.0f} requests/s including start-up")
    print(f"[{name}] vs Vidur ({VIDUR_RPS:.0f} requests/s): {rps / VIDUR_RPS:.1f}x simulating, "
          f"{res.num_requests / wall_total / VIDUR_RPS:.1f}x including start-up{extra}")
    print(f"RESULT total={wall_total:.3f} sim={sim_wall:.3f} cpu={cpu_total:.3f} rps={rps:.0f} "
          f"steps={res.num_steps} fast={100 * res.fast_step_fraction:.1f}")


def run_azure(args) -> None:
    from experiments.workloads import read_azure_trace
    from sim.simulator import Simulator
    wl = read_azure_trace(AZURE_CONV, max_model_len=args.max_model_len)
    reps, blocks, vocab = build_replicas(1, args)
    sim = Simulator(reps, fast_path=not args.no_fast_path, record_steps=args.record_steps, vocab_size=vocab,
                    prompt_seed=DEFAULTS["seed"])
    t0 = time.perf_counter()
    res = profiled(args, lambda: sim.run(wl))
    report("azure", res, T_PROCESS, t0, args,
           extra=f"; {blocks} KV blocks; {wl.stats.num_clipped} requests clipped to max_model_len")
    bound_line(res)


def run_poisson(args) -> None:
    from experiments.workloads import FromFile, Poisson, synthetic_workload
    from sim.simulator import Simulator
    if args.lengths == "sharegpt":
        prompt, output = FromFile(str(SHAREGPT), "num_prefill_tokens"), FromFile(str(SHAREGPT), "num_decode_tokens")
    else:
        prompt, output = LogNormal(5.5, 1.0, 4, 3072), LogNormal(5.0, 1.0, 1, 1024)
    wl = synthetic_workload(args.requests, Poisson(args.rate_rps), prompt, output, seed=args.seed,
                            max_model_len=args.max_model_len)
    reps, _, vocab = build_replicas(args.replicas, args)
    sim = Simulator(reps, args.router, fast_path=not args.no_fast_path, record_steps=args.record_steps,
                    vocab_size=vocab, prompt_seed=DEFAULTS["seed"])
    t0 = time.perf_counter()
    res = profiled(args, lambda: sim.run(wl))
    report(f"poisson x{args.replicas}", res, T_PROCESS, t0, args,
           extra=f"; at this rate 1M requests take {1e6 * res.wall_s / args.requests:.0f} s")
    req = res.requests
    # mean running batch per replica: decode tokens + prefills over steps (no per-step table needed)
    tokens = (req["num_output_tokens"] + 0).groupby(req["replica"]).sum()
    steps = [r.num_steps for r in res.replicas]
    print(f"[poisson x{args.replicas}] mean tokens sampled per step, per replica "
          f"{[round(float(tokens.get(i, 0)) / max(n, 1), 1) for i, n in enumerate(steps)]}, simulated "
          f"{res.end_time_s:.0f} s at {args.rate_rps} req/s offered")
    bound_line(res)


def bound_line(res) -> None:
    f = res.fraction_of_physical_limit
    if f is not None:
        print(f"  schedule busy {sum(res.busy_s):.1f} replica-s, roofline limit {res.lower_bound.time_s:.1f} s: "
              f"{100 * f:.1f}% of the physical limit")


def run_coldstart(args) -> None:
    from engine.core.scheduler import Scheduler, SchedulerConfig
    from engine.core.sequence import SamplingParams, Sequence
    from sim.cost_model import RooflineCostModel
    from sim.replica import Replica
    from sim.simulator import Simulator
    sim = Simulator(Replica(Scheduler(SchedulerConfig(num_kvcache_blocks=64)), RooflineCostModel("Qwen3-8B", "H200")))
    sim.run([Sequence(0, [1, 2, 3], SamplingParams(max_tokens=1, ignore_eos=True))])
    total = time.perf_counter() - T_PROCESS
    print(f"[coldstart] imports + first simulated event: {total:.2f} s after interpreter start-up")
    print(f"RESULT total={total:.3f} cpu={time.process_time():.3f}")


def profiled(args, fn):
    if not args.profile:
        return fn()
    import cProfile
    import pstats
    prof = cProfile.Profile()
    res = prof.runcall(fn)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return res


def run_all(argv: list[str]) -> None:
    """Each scenario of ALL in a fresh process (extra flags passed to each), then one table."""
    rows = []
    for name, flags in ALL:
        cmd = [sys.executable, __file__, *flags, *argv]
        shown = " ".join(["python benchmarks/sim_speed.py", *flags, *argv])
        print(f"$ {shown}", flush=True)
        t = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        process_s = time.perf_counter() - t
        print(out, end="")
        print(f"[{name}] process wall incl. interpreter start: {process_s:.2f} s\n", flush=True)
        fields = dict(f.split("=") for line in out.splitlines() if line.startswith("RESULT ")
                      for f in line.split()[1:])
        rows.append((name, shown, process_s, fields))
    print("| scenario | to the end of the simulation | simulating | process CPU | whole process | requests/s "
          "| fast path | command |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, shown, process_s, f in rows:
        sim = f"{float(f['sim']):.2f} s" if "sim" in f else "-"
        rps = f"{int(f['rps']):,}" if "rps" in f else "-"
        fast = f"{f['fast']}%" if "fast" in f else "-"
        print(f"| {name} | {float(f['total']):.2f} s | {sim} | {float(f['cpu']):.2f} s | {process_s:.2f} s | {rps} "
              f"| {fast} | `{shown}` |")


def main():
    d = DEFAULTS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("all", "azure", "poisson", "coldstart"), default="all")
    ap.add_argument("--requests", type=int, default=100_000, help="poisson: number of requests")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rate-rps", type=float, default=80.0, help="poisson: offered load, whole cluster")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--lengths", choices=("lognormal", "sharegpt"), default="lognormal")
    ap.add_argument("--policy", default=d["policy"])
    ap.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"])
    ap.add_argument("--max-model-len", type=int, default=d["max_model_len"])
    ap.add_argument("--max-num-batched-tokens", type=int, default=d["max_num_batched_tokens"])
    ap.add_argument("--overhead-s", type=float, default=d["roofline"]["overhead_s"], help="roofline per-step overhead")
    ap.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=d["enable_prefix_caching"])
    ap.add_argument("--no-fast-path", action="store_true")
    ap.add_argument("--overlap-scheduling", action="store_true",
                    help="schedule each step while the one before runs (docs/overlap.md; servelab's default: off)")
    ap.add_argument("--record-steps", choices=("all", "none"), default="all",
                    help="per-step table rows (engine.core.recorder.Recorder); 'none' keeps only the request table")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--seed", type=int, default=d["seed"], help="poisson: workload seed")
    args = ap.parse_args()
    if args.max_model_len is None:          # the model's context window, as servelab's default
        from sim.specs import get_model_spec
        args.max_model_len = get_model_spec(d["model"]).max_model_len
    if args.max_num_batched_tokens is None:
        from engine.core.token_budget import resolve_max_num_batched_tokens
        args.max_num_batched_tokens, _ = resolve_max_num_batched_tokens(None, args.max_model_len, False)
    if args.scenario == "all":
        argv, rest = [], iter(sys.argv[1:])
        for a in rest:                  # every flag but --scenario (and its value) goes to each scenario
            if a == "--scenario":
                next(rest, None)
            elif not a.startswith("--scenario="):
                argv.append(a)
        run_all(argv)
        return
    {"azure": run_azure, "poisson": run_poisson, "coldstart": run_coldstart}[args.scenario](args)


if __name__ == "__main__":
    main()
