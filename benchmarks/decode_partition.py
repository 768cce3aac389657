"""Time paged decode attention's two key-partition schemes by batch size and block-table width (CUDA; one JSON).

    python benchmarks/decode_partition.py --out benchmarks/results/decode_partition_h200.json

In a CUDA graph the block table is as wide as max_model_len. The engine's decode kernel splits each
sequence's keys into `choose_num_splits(batch)` partitions of its own context (`per_context`). The
earlier scheme (`width`) cut the table width into 256-key partitions (up to 64 of them) whatever the
contexts, so a batch of short contexts launched mostly empty programs and its cost grew with
max_model_len. For each (batch, contexts, width) case this times both as the engine runs them: LAYERS
calls captured in one CUDA graph (one per layer; a single eager call would time Triton's host-side
launch), replayed under gpu_attention_check.cuda_time_ms (clocks settled, CUDA events, median), per call;
prints width / per_context, and checks the outputs agree. Also per-context partitions with splits for
4, 8 and 16 programs per SM at every batch size (pc4, pc8, pc16), to choose the engine's rule from.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_attention_check import cuda_time_ms, layer_graph  # noqa: E402

from engine.kernels.paged_decode import MAX_SPLITS, _num_sms, choose_num_splits, paged_decode_attention  # noqa: E402

HQ, HKV, HEAD_DIM, BLOCK_SIZE, BLOCK_N, LAYERS = 16, 8, 128, 16, 64, 28
PROGRAMS_PER_SM = (4, 8, 16)


def graph_ms(fn, warmup: int, iters: int) -> float:
    """Milliseconds per call of fn, LAYERS calls in one captured CUDA graph."""
    return cuda_time_ms(layer_graph(fn, LAYERS).replay, warmup, iters) / LAYERS


def width_num_splits(num_seqs: int, width_tokens: int, device) -> int:
    """The earlier choice: one split from 2 programs per SM, else 256-key partitions of the whole width."""
    if num_seqs * HKV >= 2 * _num_sms(device):
        return 1
    return max(1, min(math.ceil(width_tokens / 256), MAX_SPLITS))


def cases(rng: torch.Generator) -> list[tuple[str, list[int]]]:
    out = []
    for b in (1, 4, 8, 16, 24, 32, 48, 64, 128, 256):
        out.append((f"{b}x256", [256] * b))
        out.append((f"{b}x1024", [1024] * b))
        if b <= 32:
            out.append((f"{b}x4096", [4096] * b))
        out.append((f"{b}x32-2042", torch.randint(32, 2043, (b,), generator=rng).tolist()))
        if b >= 8:
            out.append((f"{b}x256+{b // 8}x4000", [256] * (b - b // 8) + [4000] * (b // 8)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_partition.json"))
    ap.add_argument("--widths", default="8192,16384", help="block-table widths in tokens (max_model_len in a graph)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_partition.py times CUDA kernels; no CUDA device is visible")
    dev = torch.device("cuda")
    rng = torch.Generator().manual_seed(0)
    rows = []
    for width_tokens in (int(w) for w in args.widths.split(",")):
        width = width_tokens // BLOCK_SIZE
        for name, ctx in cases(rng):
            B = len(ctx)
            # one pool of pages reused by every row (tables may repeat pages: timing only needs valid ids)
            pool = min(B * width, 1 << 16)
            k = torch.randn(pool, BLOCK_SIZE, HKV, HEAD_DIM, device=dev, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            q = torch.randn(B, HQ, HEAD_DIM, device=dev, dtype=torch.bfloat16)
            tables = (torch.arange(B * width, device=dev, dtype=torch.int32) % pool).view(B, width)
            lens = torch.tensor(ctx, device=dev, dtype=torch.int32)
            scale = HEAD_DIM ** -0.5
            sms = _num_sms(dev)
            fits = min(math.ceil(width_tokens / 256), MAX_SPLITS)
            variants = {"per_context": (choose_num_splits(B, HKV, width_tokens, BLOCK_N, dev), False),
                        "width": (width_num_splits(B, width_tokens, dev), True)}
            for per_sm in PROGRAMS_PER_SM:   # per-context partitions, splits for per_sm programs per SM, any batch
                variants[f"pc{per_sm}"] = (max(1, min(math.ceil(per_sm * sms / (B * HKV)), fits)), False)
            ref = paged_decode_attention(q, k, v, lens, tables, scale, num_splits=1).float()
            row = dict(case=name, width_tokens=width_tokens, num_seqs=B, context_max=max(ctx), context_sum=sum(ctx))
            for vname, (splits, fixed) in variants.items():
                def call(splits=splits, fixed=fixed):
                    return paged_decode_attention(q, k, v, lens, tables, scale, num_splits=splits,
                                                  fixed_partition=fixed)
                err = float((call().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                row[f"{vname}_splits"], row[f"{vname}_ms"] = splits, round(graph_ms(call, args.warmup, args.iters), 5)
                row["max_rel_err"] = max(row.get("max_rel_err", 0.0), err)
            row["width_over_per_context"] = round(row["width_ms"] / row["per_context_ms"], 3)
            rows.append(row)
            best = min(variants, key=lambda n: row[f"{n}_ms"])
            cells = " ".join(f"{n}:{row[f'{n}_splits']}/{row[f'{n}_ms'] * 1e3:.1f}us" for n in variants)
            print(f"width {width_tokens:6d} {name:18s} {cells} best {best}", flush=True)
    res = dict(command="python benchmarks/decode_partition.py " + " ".join(argv or sys.argv[1:]),
               device=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version(),
               shape=dict(q_heads=HQ, kv_heads=HKV, head_dim=HEAD_DIM, block_size=BLOCK_SIZE, dtype="bfloat16"),
               rows=rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    names = [n[:-3] for n in rows[0] if n.endswith("_ms")]
    for n in names:     # geometric mean over cases of each variant's time against the best variant's
        rel = [r[f"{n}_ms"] / min(r[f"{m}_ms"] for m in names) for r in rows]
        print(f"{n:12s} geomean {math.exp(sum(map(math.log, rel)) / len(rel)):.3f}x the best, worst {max(rel):.2f}x")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
