"""KV swap speed on a GPU: engine/swap_space.py against the staged design it replaced, same run.

Qwen3-0.6B blocks (28 layers x 16 tokens x 8 KV heads x 128, bf16: 1.75 MiB per block, K and V).
For n blocks per step, the median and max wall time of a swap-out (GPU -> pinned CPU cache) and of a
swap-in, each ending with a device synchronize as a step's tokens do, and the host seconds the call
itself takes (what an engine step records as copy_host_s):
  * swap_space: SwapSpace.swap (a block-major pinned CPU cache; the device gathers and scatters, one
    cudaMemcpyAsync per run of consecutive CPU blocks, the host only launches)
  * staged: the previous design, a CPU cache in the GPU cache's layout copied through pinned staging
    buffers of 64 blocks, with a host-side index_select / index_copy_ per chunk
CPU blocks are scattered (every 7th) or consecutive (one run), the two ends of what the block manager hands out.

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


class StagedSwap:
    """The replaced design (engine/swap_space.py before the block-major layout), kept as the baseline."""

    def __init__(self, num_blocks, block_shape, dtype, device, staging_blocks=64):
        import torch
        self.torch, self.device = torch, device
        self.cpu_cache = torch.zeros(2, block_shape[0], num_blocks, *block_shape[1:], dtype=dtype, pin_memory=True)
        self.chunk_blocks = max(1, min(staging_blocks, num_blocks))
        numel = self.cpu_cache[:, :, :1].numel() * self.chunk_blocks
        self._staging = {d: torch.empty(numel, dtype=dtype, pin_memory=True) for d in ("out", "in")}

    def _view(self, direction, n):
        shape = list(self.cpu_cache.shape)
        shape[2] = n
        return self._staging[direction][:self.cpu_cache[:, :, :1].numel() * n].view(shape)

    def swap(self, kv_cache, swap_out, swap_in):
        torch = self.torch
        gathered = None
        if swap_out:
            src = torch.tensor([s for s, _ in swap_out], dtype=torch.int64, device=self.device)
            gathered = kv_cache[:, :, src]
        for i in range(0, len(swap_in), self.chunk_blocks):
            part = swap_in[i:i + self.chunk_blocks]
            if i:
                torch.cuda.current_stream(self.device).synchronize()
            staged = self._view("in", len(part))
            torch.index_select(self.cpu_cache, 2, torch.tensor([s for s, _ in part], dtype=torch.int64), out=staged)
            dst = torch.tensor([d for _, d in part], dtype=torch.int64, device=self.device)
            kv_cache[:, :, dst] = staged.to(self.device, non_blocking=True)
        for i in range(0, len(swap_out), self.chunk_blocks):
            part = swap_out[i:i + self.chunk_blocks]
            host = self._view("out", len(part))
            host.copy_(gathered[:, :, i:i + len(part)], non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
            self.cpu_cache.index_copy_(2, torch.tensor([d for _, d in part], dtype=torch.int64), host)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="8,32,128,512")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    from engine.swap_space import SwapSpace

    dev = torch.device("cuda")
    shape = (28, 16, 8, 128)
    dtype = torch.bfloat16
    gpu_blocks, cpu_blocks = 1024, 2048
    kv = torch.randn(2, shape[0], gpu_blocks, *shape[1:], dtype=dtype, device=dev)
    block_bytes = kv[:, :, 0].numel() * kv.element_size()
    spaces = {"swap_space": SwapSpace(cpu_blocks, shape, dtype, dev),
              "staged": StagedSwap(cpu_blocks, shape, dtype, dev)}

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        return time.perf_counter() - t, host

    rows = []
    for layout in ("scattered", "consecutive"):
        for n in (int(x) for x in args.blocks.split(",")):
            cpu_ids = [(7 * i) % cpu_blocks for i in range(n)] if layout == "scattered" else list(range(100, 100 + n))
            out = [(i, c) for i, c in zip(range(n), cpu_ids)]
            back = [(c, g) for g, c in out]
            r = {"cpu_blocks": layout, "blocks": n, "mib": n * block_bytes / 2**20}
            for name, space in spaces.items():
                for direction, fn in (("out", lambda: space.swap(kv, out, [])),
                                      ("in", lambda: space.swap(kv, [], back))):
                    fn()                                                      # warm-up
                    ts = [timed(fn) for _ in range(args.reps)]
                    wall = [t for t, _ in ts]
                    r[f"{name}_{direction}_ms_median"] = 1e3 * statistics.median(wall)
                    r[f"{name}_{direction}_ms_max"] = 1e3 * max(wall)
                    r[f"{name}_{direction}_host_ms_median"] = 1e3 * statistics.median(h for _, h in ts)
                    r[f"{name}_{direction}_us_per_block"] = 1e6 * statistics.median(wall) / n
            for direction in ("out", "in"):
                r[f"speedup_{direction}_median"] = (r[f"staged_{direction}_ms_median"]
                                                    / r[f"swap_space_{direction}_ms_median"])
            rows.append(r)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    # correctness: a round trip through the swap space is exact, and so is a same-step exchange
    space = spaces["swap_space"]
    ref = kv[:, :, :64].clone()
    space.swap(kv, [(i, 3 * i) for i in range(64)], [])
    kv[:, :, :64] = 0
    space.swap(kv, [], [(3 * i, i) for i in range(64)])
    torch.cuda.synchronize()
    exact = bool(torch.equal(kv[:, :, :64], ref))
    result = {"gpu": torch.cuda.get_device_name(dev), "block_bytes": block_bytes, "round_trip_exact": exact,
              "rows": rows, "command": "python " + " ".join(sys.argv)}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not exact:
        sys.exit("swap round trip not exact")


if __name__ == "__main__":
    main()
