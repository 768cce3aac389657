"""Time paged decode attention by number of key splits, for uniform and ragged contexts (CUDA; one JSON file).

    python benchmarks/decode_splits.py --out benchmarks/results/decode_splits_h200.json

For full batches (num_seqs * kv heads >= 2 programs per SM) `choose_num_splits` runs one program per
(sequence, kv head) over its whole context. With ragged contexts the longest sequences' programs then
finish last; a few key splits (partitions over the block-table width, empty ones exit at once) would
spread them. This times that trade on Qwen3-0.6B's attention shape (16 q / 8 kv heads, head_dim 128,
bf16, 16-token blocks, tables as wide as max_model_len as in a CUDA graph): each (batch, contexts) case
for the automatic choice and 1, 2, 4, 8, 16 splits (gpu_attention_check.cuda_time_ms: clocks settled,
CUDA events, median); ratios are against the automatic choice in the same run; outputs are checked
against it.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_attention_check import cuda_time_ms  # noqa: E402

from engine.kernels.paged_decode import choose_num_splits, paged_decode_attention  # noqa: E402

HQ, HKV, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
SPLITS = [None, 1, 2, 4, 8, 16]


def cases(max_model_len: int, rng: torch.Generator) -> list[tuple[str, list[int]]]:
    out = []
    for b in (64, 128, 256):
        out.append((f"{b}x1024", [1024] * b))
        ragged = torch.randint(32, 2043, (b,), generator=rng).tolist()               # mean ~1037
        out.append((f"{b}x32-2042", ragged))
        long_tail = [256] * (b - b // 8) + [min(4000, max_model_len)] * (b // 8)     # a few long ones
        out.append((f"{b}x256+{b // 8}x4000", long_tail))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_splits.json"))
    ap.add_argument("--max-model-len", type=int, default=4096, help="block-table width in tokens (as in a graph)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_splits.py times CUDA kernels; no CUDA device is visible")
    dev = torch.device("cuda")
    rng = torch.Generator().manual_seed(0)
    width = args.max_model_len // BLOCK_SIZE
    rows = []
    for name, ctx in cases(args.max_model_len, rng):
        B = len(ctx)
        blocks = B * width
        k = torch.randn(blocks, BLOCK_SIZE, HKV, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(B, HQ, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        tables = torch.arange(blocks, device=dev, dtype=torch.int32).view(B, width)
        lens = torch.tensor(ctx, device=dev, dtype=torch.int32)
        ref = paged_decode_attention(q, k, v, lens, tables, HEAD_DIM ** -0.5)
        auto = choose_num_splits(B, HKV, args.max_model_len, 64, dev)
        base = None
        for s in SPLITS:
            out = paged_decode_attention(q, k, v, lens, tables, HEAD_DIM ** -0.5, num_splits=s)
            err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            # the lambda runs inside cuda_time_ms, before the `del k, v` below
            ms = cuda_time_ms(lambda: paged_decode_attention(q, k, v, lens, tables, HEAD_DIM ** -0.5,  # noqa: F821
                                                             num_splits=s),
                              args.warmup, args.iters)
            base = ms if s is None else base
            rows.append(dict(case=name, num_seqs=B, context_sum=sum(ctx), context_max=max(ctx),
                             splits="auto" if s is None else s, auto_splits=auto, ms=round(ms, 4),
                             vs_auto=round(ms / base, 3), rel_err_vs_auto=err))
            print(f"{name:22s} splits {rows[-1]['splits']!s:>4}: {ms:.4f} ms ({ms / base:.3f}x auto), err {err:.1e}")
        del k, v
    res = dict(command="python benchmarks/decode_splits.py " + " ".join(argv or sys.argv[1:]),
               device=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version(),
               shape=dict(q_heads=HQ, kv_heads=HKV, head_dim=HEAD_DIM, block_size=BLOCK_SIZE, dtype="bfloat16",
                          table_width_tokens=args.max_model_len), rows=rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
