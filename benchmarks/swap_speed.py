"""KV swap speed on a GPU: engine/swap_space.py against the copy path it replaced, same run.

Qwen3-0.6B blocks (28 layers x 16 tokens x 8 KV heads x 128, bf16: 1.75 MiB per block, K and V).
For n blocks per step, the median wall time of a swap-out (GPU -> pinned CPU cache) and of a swap-in,
each ending with a device synchronize, as an engine step does:
  * swap_space: SwapSpace.swap (pinned staging buffers allocated once)
  * per_call_pin: the previous path, a swap-in gather pinned afresh every call and a swap-out staging
    buffer grown by doubling from 8 blocks (its first calls pay the growth; reported as the max)

    python benchmarks/swap_speed.py --out benchmarks/results/swap_speed_h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="8,32,128")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    from engine.swap_space import SwapSpace

    dev = torch.device("cuda")
    shape = (28, 16, 8, 128)
    dtype = torch.bfloat16
    gpu_blocks, cpu_blocks = 512, 512
    kv = torch.randn(2, shape[0], gpu_blocks, *shape[1:], dtype=dtype, device=dev)
    block_bytes = kv[:, :, 0].numel() * kv.element_size()
    t0 = time.perf_counter()
    space = SwapSpace(cpu_blocks, shape, dtype, dev, staging_blocks=256)
    setup_s = time.perf_counter() - t0

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    staging = {}

    def old_out(pairs):
        src = torch.tensor([s for s, _ in pairs], device=dev)
        dst = torch.tensor([d for _, d in pairs])
        g = kv[:, :, src]
        buf = staging.get("b")
        if buf is None or buf.shape[2] < len(pairs):
            s = list(space.cpu_cache.shape)
            s[2] = max(len(pairs), 2 * (buf.shape[2] if buf is not None else 8))
            buf = staging["b"] = torch.empty(s, dtype=dtype, pin_memory=True)
        host = buf[:, :, :len(pairs)]
        host.copy_(g, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        space.cpu_cache[:, :, dst] = host

    def old_in(pairs):
        src = torch.tensor([s for s, _ in pairs])
        staged = space.cpu_cache[:, :, src].pin_memory()
        dst = torch.tensor([d for _, d in pairs], device=dev)
        kv[:, :, dst] = staged.to(dev, non_blocking=True)

    rows = []
    for n in (int(x) for x in args.blocks.split(",")):
        pairs = [(i, (7 * i) % cpu_blocks) for i in range(n)]
        back = [(c, g) for g, c in pairs]
        r = {"blocks": n, "mib": n * block_bytes / 2**20}
        new_out = [timed(lambda: space.swap(kv, pairs, [])) for _ in range(args.reps)]
        new_in = [timed(lambda: space.swap(kv, [], back)) for _ in range(args.reps)]
        staging.clear()
        o_out = [timed(lambda: old_out(pairs)) for _ in range(args.reps)]
        o_in = [timed(lambda: old_in(back)) for _ in range(args.reps)]
        for name, ts in (("swap_space_out", new_out), ("swap_space_in", new_in), ("per_call_pin_out", o_out),
                         ("per_call_pin_in", o_in)):
            r[f"{name}_ms_median"] = 1e3 * statistics.median(ts)
            r[f"{name}_ms_max"] = 1e3 * max(ts)
        r["speedup_in_median"] = r["per_call_pin_in_ms_median"] / r["swap_space_in_ms_median"]
        r["speedup_out_max"] = r["per_call_pin_out_ms_max"] / r["swap_space_out_ms_max"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    # correctness: a round trip through the swap space is exact
    ref = kv[:, :, :8].clone()
    space.swap(kv, [(i, i) for i in range(8)], [])
    kv[:, :, :8] = 0
    space.swap(kv, [], [(i, i) for i in range(8)])
    torch.cuda.synchronize()
    result = {"gpu": torch.cuda.get_device_name(dev), "block_bytes": block_bytes, "staging_setup_s": setup_s,
              "round_trip_exact": bool(torch.equal(kv[:, :, :8], ref)), "rows": rows,
              "command": "python " + " ".join(sys.argv)}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
