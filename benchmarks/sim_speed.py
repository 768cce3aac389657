"""Simulator speed: wall time per simulated request and step, on one core.

Three scenarios (default: all, each in a fresh Python process so start-up is counted):
  azure     the Azure LLM conversation trace (19,366 requests, native arrival times) on one
            H200 replica with Qwen3-8B and the vllm policy (KV blocks from memory,
            max_model_len 16384, chunked prefill off, max_num_batched_tokens 16384).
  poisson   N synthetic Poisson requests (ShareGPT-like lognormal lengths, or lengths drawn
            from the ShareGPT length file) across R replicas behind a router.
  coldstart python start + imports to the first simulated event.

It prints requests/s, steps/s, the share of steps taken by the decode fast path, wall times,
and ratios against Vidur's speed on the same trace (VIDUR_RPS requests per wall-second on a
2-core machine). The traces are read from ../shared/traces/ beside the repository root
(SERVELAB_TRACES=DIR reads them from DIR instead).

    python benchmarks/sim_speed.py                                  # all three scenarios
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


class LogNormal:
    """Integer lengths exp(N(mu, sigma)), clipped to [lo, hi] (ShareGPT-like by default: median ~245/150)."""

    def __init__(self, mu: float, sigma: float, lo: int, hi: int):
        self.mu, self.sigma, self.lo, self.hi = mu, sigma, lo, hi

    def sample(self, n, rng):
        import numpy as np
        return np.clip(rng.lognormal(self.mu, self.sigma, n).astype(np.int64), self.lo, self.hi)


def build_replicas(n: int, policy: str, model: str, max_model_len: int, batched_tokens: int, prefix: bool,
                   overhead_s: float, max_num_seqs: int):
    from engine.core.scheduler import Scheduler, SchedulerConfig
    from policies.registry import make_scheduling_policy
    from sim.cost_model import RooflineCostModel
    from sim.replica import Replica
    from sim.specs import get_hardware_spec, get_model_spec, num_kv_blocks
    spec, hw = get_model_spec(model), get_hardware_spec("H200")
    blocks = num_kv_blocks(spec, hw, 16)
    reps = []
    for _ in range(n):
        cfg = SchedulerConfig(num_kvcache_blocks=blocks, block_size=16, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=batched_tokens, max_model_len=max_model_len,
                              enable_chunked_prefill=False, enable_prefix_caching=prefix)
        cm = RooflineCostModel(spec, hw, overhead_s=overhead_s, max_model_len=max_model_len)
        reps.append(Replica(Scheduler(cfg, make_scheduling_policy(policy)), cm))
    return reps, blocks


def report(name: str, res, t_start: float, t_sim0: float, extra: str = "", record_steps: str = "all") -> None:
    wall_total = time.perf_counter() - t_start
    cpu_total = time.process_time()
    sim_wall = res.wall_s
    t = time.perf_counter()
    res.fraction_of_physical_limit          # builds the tables and the roofline bound (not in wall_total)
    print(f"[{name}] tables + roofline bound built in {time.perf_counter() - t:.2f} s")
    rps = res.num_requests / sim_wall
    print(f"[{name}] {res.summary()}")
    print(f"[{name}] wall: {wall_total:.2f} s total from process start ({t_sim0 - t_start:.2f} s start-up, "
          f"imports and workload; {sim_wall:.2f} s simulating); process CPU {cpu_total:.2f} s; "
          f"per-step rows: {record_steps}")
    print(f"[{name}] {rps:,.0f} requests/s, {res.num_steps / sim_wall:,.0f} steps/s, "
          f"{100 * res.fast_step_fraction:.1f}% of steps by the fast path, "
          f"{res.num_requests / wall_total:,.0f} requests/s including start-up")
    print(f"[{name}] vs Vidur ({VIDUR_RPS:.0f} requests/s): {rps / VIDUR_RPS:.1f}x simulating, "
          f"{res.num_requests / wall_total / VIDUR_RPS:.1f}x including start-up{extra}")


def run_azure(args) -> None:
    from experiments.workloads import read_azure_trace
    from sim.simulator import Simulator
    wl = read_azure_trace(AZURE_CONV, max_model_len=16384)
    reps, blocks = build_replicas(1, args.policy, "Qwen3-8B", 16384, 16384, args.prefix_caching, args.overhead_s,
                                  args.max_num_seqs)
    sim = Simulator(reps, fast_path=not args.no_fast_path, record_steps=args.record_steps)
    t0 = time.perf_counter()
    res = profiled(args, lambda: sim.run(wl))
    report("azure", res, T_PROCESS, t0, extra=f"; {blocks} KV blocks", record_steps=args.record_steps)
    bound_line(res)


def run_poisson(args) -> None:
    from experiments.workloads import FromFile, Poisson, synthetic_workload
    from sim.simulator import Simulator
    if args.lengths == "sharegpt":
        prompt, output = FromFile(str(SHAREGPT), "num_prefill_tokens"), FromFile(str(SHAREGPT), "num_decode_tokens")
    else:
        prompt, output = LogNormal(5.5, 1.0, 4, 3072), LogNormal(5.0, 1.0, 1, 1024)
    wl = synthetic_workload(args.requests, Poisson(args.rate_rps), prompt, output, seed=args.seed,
                            max_model_len=4096)
    reps, _ = build_replicas(args.replicas, args.policy, "Qwen3-8B", 4096, 8192, args.prefix_caching,
                             args.overhead_s, args.max_num_seqs)
    sim = Simulator(reps, args.router, fast_path=not args.no_fast_path, record_steps=args.record_steps)
    t0 = time.perf_counter()
    res = profiled(args, lambda: sim.run(wl))
    report(f"poisson x{args.replicas}", res, T_PROCESS, t0,
           extra=f"; at this rate 1M requests take {1e6 * res.wall_s / args.requests:.0f} s",
           record_steps=args.record_steps)
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
    print(f"[coldstart] imports + first simulated event: {time.perf_counter() - T_PROCESS:.2f} s after interpreter "
          "start-up")


def profiled(args, fn):
    if not args.profile:
        return fn()
    import cProfile
    import pstats
    prof = cProfile.Profile()
    res = prof.runcall(fn)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("all", "azure", "poisson", "coldstart"), default="all")
    ap.add_argument("--requests", type=int, default=100_000, help="poisson: number of requests")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rate-rps", type=float, default=80.0, help="poisson: offered load, whole cluster")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--lengths", choices=("lognormal", "sharegpt"), default="lognormal")
    ap.add_argument("--policy", default="vllm")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--overhead-s", type=float, default=2e-3, help="roofline per-step overhead")
    ap.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--no-fast-path", action="store_true")
    ap.add_argument("--record-steps", choices=("all", "none"), default="all",
                    help="per-step table rows (engine.core.recorder.Recorder); 'none' keeps only the request table")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.scenario == "all":
        passthrough = [a for a in sys.argv[1:] if not a.startswith("--scenario")]
        for sc in ("coldstart", "azure", "poisson"):
            t = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--scenario", sc, *passthrough], check=True)
            print(f"[{sc}] process wall incl. interpreter start: {time.perf_counter() - t:.2f} s\n")
        return
    {"azure": run_azure, "poisson": run_poisson, "coldstart": run_coldstart}[args.scenario](args)


if __name__ == "__main__":
    main()
