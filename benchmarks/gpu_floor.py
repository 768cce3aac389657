"""Latency floors of a GPU that FLOPs and bytes do not show (the roofline cost model's floor terms).

Measured with CUDA graphs, as the engine runs its steps:
  kernel_floor_us   time per kernel of a graph of N dependent small elementwise kernels ([1024] bf16):
                    launch gap + the dependent kernel's start-up and DRAM round trip
  gemv_us           time per kernel of a graph of N dependent [1, H] x [H, H] bf16 matmuls, each on its own
                    weights (H = 1024: 2 MiB read, ~0.5 us at HBM speed): the floor of a weight-bound GEMM
  step_sync_us      one graph launch of a single small kernel + synchronize + a 1-element readback: the
                    host round trip every engine step pays to read its sampled tokens

    python benchmarks/gpu_floor.py --out benchmarks/results/gpu_floor_h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=1000, help="kernels per graph")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch
    dev = torch.device("cuda")
    n = args.kernels

    from gpu_attention_check import layer_graph, replay_us

    def graph_of(body):
        return layer_graph(body, 1)              # one eager call outside the graph, then body captured

    def per_kernel_us(g) -> float:
        return replay_us(g, n, args.reps)

    x = torch.zeros(1024, dtype=torch.bfloat16, device=dev)

    def chain():
        for _ in range(n):
            x.add_(1.0)
    elementwise = per_kernel_us(graph_of(chain))

    h = 1024
    weights = torch.randn(n, h, h, dtype=torch.bfloat16, device=dev) * 0.01
    y = torch.randn(1, h, dtype=torch.bfloat16, device=dev)

    def gemvs():
        v = y
        for i in range(n):
            v = v @ weights[i]
        y.copy_(v)
    gemv = per_kernel_us(graph_of(gemvs))

    t = torch.zeros(1, dtype=torch.int64, device=dev)
    one = graph_of(lambda: t.add_(1))
    syncs = []
    for _ in range(200):
        t0 = time.perf_counter()
        one.replay()
        t.item()
        syncs.append((time.perf_counter() - t0) * 1e6)
    result = {
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "kernel_floor_us": elementwise, "gemv_us": gemv, "gemv_bytes": h * h * 2,
        "step_sync_us": statistics.median(syncs[20:]),
        "kernels_per_graph": n, "reps": args.reps, "command": "python " + " ".join(sys.argv),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
