"""Scheduler + block manager speed with a null executor (no model, no simulator).

Drives the torch-free core over N synthetic requests (ShareGPT-like lengths,
Poisson arrivals on a step clock) and prints scheduler steps per second and
microseconds per scheduled sequence per step. The simulator's speed rests on
this number.

    python benchmarks/scheduler_throughput.py --requests 100000
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from engine.core.scheduler import Scheduler, SchedulerConfig
from engine.core.sequence import SamplingParams, Sequence
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.vllm import VLLMPolicy


def run(num_requests: int, policy: str, chunked: bool, prefix: bool, num_blocks: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(5.5, 1.0, num_requests).astype(int), 4, 2048)
    output = np.clip(rng.lognormal(5.0, 1.0, num_requests).astype(int), 1, 1024)
    # arrivals in steps: ~2 requests per step keeps a few hundred sequences running
    arrival_step = np.cumsum(rng.exponential(0.5, num_requests)).astype(int)
    cfg = SchedulerConfig(num_kvcache_blocks=num_blocks, block_size=16, max_num_seqs=256,
                          max_num_batched_tokens=4096, max_model_len=4096,
                          enable_chunked_prefill=chunked, enable_prefix_caching=prefix)
    sched = Scheduler(cfg, FCFSPolicy() if policy == "fcfs" else VLLMPolicy())
    nxt = 0
    step = 0
    scheduled = 0
    t0 = time.perf_counter()
    while nxt < num_requests or sched.has_unfinished():
        while nxt < num_requests and arrival_step[nxt] <= step:
            base = nxt * 4096   # distinct prompts: no accidental prefix sharing
            sched.add(Sequence(nxt, range(base, base + int(prompt[nxt])),
                               SamplingParams(max_tokens=int(output[nxt]), ignore_eos=True), arrival_time_s=step))
            nxt += 1
        batch = sched.schedule(step)
        scheduled += len(batch.seqs)
        sched.postprocess(batch, [0] * len(batch.seqs), step + 1)
        step += 1
    wall = time.perf_counter() - t0
    return dict(policy=policy, chunked=chunked, prefix_caching=prefix, requests=num_requests, steps=step,
                wall_s=wall, steps_per_s=step / wall, us_per_seq_step=1e6 * wall / max(scheduled, 1),
                mean_batch=scheduled / step)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--num-blocks", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="all", choices=["all", "vllm"],
                    help="all four (policy, chunked, prefix) settings, or only vllm without chunking")
    args = ap.parse_args()
    settings = [("vllm", False, True), ("vllm", True, True), ("vllm", False, False), ("fcfs", False, True)]
    for policy, chunked, prefix in settings if args.configs == "all" else settings[:1]:
        r = run(args.requests, policy, chunked, prefix, args.num_blocks, args.seed)
        print(f"{r['policy']:5s} chunked={r['chunked']!s:5s} prefix={r['prefix_caching']!s:5s} "
              f"{r['requests']} requests, {r['steps']} steps in {r['wall_s']:.1f} s: "
              f"{r['steps_per_s']:,.0f} steps/s, {r['us_per_seq_step']:.2f} us per scheduled sequence-step "
              f"(mean batch {r['mean_batch']:.0f})", flush=True)


if __name__ == "__main__":
    main()
