"""Why a decode batch runs longer in a live overlapped replay than the profile grid times it: a runner built as
the suite's replays are (overlap scheduling, their max_model_len and KV cache), a few decode shapes, each timed
in several ways, one row per (shape, mode) with the median device seconds.

  profile       as experiments.profile times a shape: a queued pair, the second's device seconds, KV blocks
                0, 1, 2, ..., paced at duty 0.5 (the grid's runner has overlap scheduling off: `profile_sync`
                is that runner's row, from a second runner when --sync-runner)
  back_to_back  the same pair without the idle time (duty 1)
  scattered     the pair on KV blocks drawn across the whole cache (a live block table after churn)
  placeholder   the pair, the second's input ids placeholders of the first's sampled rows: the device resolves
                them (engine/core/in_flight.py), as in every overlapped decode step
  chain         CHAIN steps launched one ahead of their collection (the overlap loop without a scheduler),
                placeholders and scattered blocks: the live loop's device seconds per step, host included where
                the host falls behind (host_s: the launch's host seconds)

    python benchmarks/decode_live_gap.py --model CKPT --out FILE.csv [--device cuda] [--max-model-len 8192]
        [--num-kvcache-blocks 4096] [--repeats 15] [--chain 60] [--sync-runner]

Not part of the suite: a diagnostic for the device model's decode terms (benchmarks/results/generalize/).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the repository root, where servelab is not installed

# (batch size, contexts): uniform batches the busy replays hold, and a ragged one
SHAPES = [(8, 1024), (16, 1024), (32, 512), (32, 1024), (32, 2048), (64, 1024), (32, "ragged")]
SMOKE_SHAPES = [(4, 64), (8, 128), (8, "ragged")]      # the tiny model on CPU (no device seconds: the path only)


def decode_shape(b: int, ctx, rng, hi: int = 2048):
    from experiments.profile import Shape
    contexts = tuple(int(x) for x in rng.integers(64, hi + 1, size=b)) if ctx == "ragged" else (ctx,) * b
    return Shape("decode", (), contexts)


def with_placeholders(batch):
    """The batch's decode inputs as placeholders of the previous launch's sampled rows 0..B-1."""
    from engine.core.in_flight import PLACEHOLDER_BASE
    for k, seq in enumerate(batch.seqs):
        seq.token_ids[-1] = PLACEHOLDER_BASE + k
    return batch


def chain(runner, batch, n: int, sync) -> tuple[np.ndarray, np.ndarray]:
    """(device seconds, launch host seconds) of n steps launched one ahead of their collection."""
    runner.execute(batch)                           # sets last_sampled for the placeholders
    sync()
    dev, host = [], []
    prev = None
    for _ in range(n):
        t0 = time.perf_counter()
        cur = runner.launch(batch)
        host.append(time.perf_counter() - t0)
        if prev is not None:
            runner.collect(prev)
            dev.append(runner.last_device_time_s or np.nan)
        prev = cur
    runner.collect(prev)
    dev.append(runner.last_device_time_s or np.nan)
    sync()
    return np.asarray(dev[5:]), np.asarray(host[5:])     # past the first few (the loop's own start)


def time_runner(runner, label: str, args, rows: list, sync) -> None:
    import copy

    from experiments.profile import build_batch, time_step
    runner.time_device = runner.is_cuda
    bs, vocab = runner.block_size, runner.model.config.vocab_size
    overlap = runner.config.overlap_scheduling
    for b, ctx in SMOKE_SHAPES if args.smoke else SHAPES:
        rng = np.random.default_rng(0)
        shape = decode_shape(b, ctx, rng, 256 if args.smoke else 2048)
        base = build_batch(shape, bs, vocab, 0.6, rng, runner.num_kvcache_blocks)
        scat = build_batch(type(shape)(shape.kind, shape.prefills, shape.decode_ctx, scattered=True), bs, vocab, 0.6,
                           np.random.default_rng(1), runner.num_kvcache_blocks)
        modes = {"profile" if overlap else "profile_sync": (base, 0.5)}
        if overlap:
            modes.update(back_to_back=(base, 1.0), scattered=(scat, 0.5),
                         placeholder=(with_placeholders(copy.deepcopy(base)), 0.5))

        def add(mode: str, dev: np.ndarray, host_s: float = np.nan) -> None:
            rows.append(dict(runner=label, shape=shape.label, batch_size=b, context=str(ctx), mode=mode,
                             device_time_s=float(np.median(dev)), device_time_p10_s=float(np.percentile(dev, 10)),
                             device_time_p90_s=float(np.percentile(dev, 90)), host_s=host_s, n=len(dev)))

        for mode, (batch, duty) in modes.items():
            add(mode, time_step(runner, batch, 2, args.repeats, sync, duty)[1])
        if overlap:
            for mode, batch in (("chain", with_placeholders(copy.deepcopy(scat))),
                                ("chain_contiguous", with_placeholders(copy.deepcopy(base)))):
                dev, host = chain(runner, batch, args.chain, sync)
                add(mode, dev, float(np.median(host)))
        print(" ".join(f"{r['mode']} {r['device_time_s'] * 1e3:.3f}" for r in rows if r["shape"] == shape.label
                       and r["runner"] == label), f"ms  [{label} {shape.label}]", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="output CSV")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--num-kvcache-blocks", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--chain", type=int, default=60)
    ap.add_argument("--sync-runner", action="store_true", help="also a runner with overlap scheduling off, as the "
                    "profile grid's (max_model_len and cache as --profile-max-model-len / derived)")
    ap.add_argument("--profile-max-model-len", type=int, default=16384)
    ap.add_argument("--smoke", action="store_true", help="small shapes for the tiny model on CPU (the path only)")
    args = ap.parse_args(argv)

    import pandas as pd
    import torch

    from engine.config import EngineConfig
    from engine.model_runner import ModelRunner
    from experiments.runner_engine import _device_sync
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("decode_live_gap: no CUDA device", file=sys.stderr)
        return 2
    rows: list[dict] = []
    cfg = EngineConfig(model_path=args.model, device=args.device, max_model_len=args.max_model_len,
                       num_kvcache_blocks=args.num_kvcache_blocks, overlap_scheduling=True)
    runner = ModelRunner(cfg)
    time_runner(runner, "live", args, rows, _device_sync(runner))
    runner.close()
    del runner
    if args.sync_runner:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        cfg = EngineConfig(model_path=args.model, device=args.device, max_model_len=args.profile_max_model_len)
        runner = ModelRunner(cfg)
        time_runner(runner, "profile_runner", args, rows, _device_sync(runner))
    df = pd.DataFrame(rows)
    ref = df[df["mode"] == "profile"].set_index("shape")["device_time_s"]
    df["vs_profile"] = df["device_time_s"] / df["shape"].map(ref)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.pivot_table(index="shape", columns="mode", values="vs_profile").round(3).to_string())
    print(f"decode_live_gap: {len(df)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
