"""Profile the engine's model runner over a grid of step shapes: the training table of `calibrated`.

    python -m experiments.profile --model PATH --out table.csv [--device cuda|cpu] [--grid small|full|tier|layout]

For every shape of the grid (prefill chunks x cached prefix lengths, several
prefills at once, decode batch sizes x context lengths, mixed prefill + decode
steps, swap copies of N blocks, the prefix cache's CPU-tier offloads and loads of N blocks beside a
decode batch, which they overlap) it builds an engine.core.batch.Batch over distinct KV
blocks, runs `ModelRunner.execute` on it `--warmup` times untimed, then
`--repeats` times timed (device synchronized before each clock read), and
writes one row: the shape columns of sim.cost_model.base.STEP_TABLE_COLUMNS
(computed by engine.core.recorder.Recorder, so they mean exactly what they mean in a
run's steps table), `duration_s` = the median, and min / max / repeats. A
sidecar `<out>.meta.json` records the device, model, command and date.

`--grid tier` times only the full grid's CPU-tier shapes (offloads and loads of 4 to 1,024 blocks
beside a 32 x 1,024 decode batch, its context clipped to max_model_len) and that decode batch alone,
which anchors the copies' share of the step: the rows the tier's fit terms need, to be fitted together
with a profile table made elsewhere on the same GPU and model (e.g. the generalization suite's), in
seconds instead of the full grid's minute. `--grid layout` times a few shapes twice, on KV blocks 0, 1, 2, ... and
on blocks drawn at random from the whole cache (layout_shapes): a comparison, not a fit's table.

The KV cache content is whatever the runner holds (timing does not depend on
it). A shape whose blocks exceed the cache is skipped (and logged), since a real
run could never schedule it either.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import sys
import time
from dataclasses import dataclass

import numpy as np

from engine.config import EngineConfig
from engine.core.batch import Batch
from engine.core.recorder import Recorder
from engine.core.sequence import SamplingParams, Sequence
from experiments.gpu_clock import GpuClock
from experiments.results import atomic_write_text, write_json
from sim.cost_model.base import STEP_TABLE_COLUMNS

GRIDS = ("small", "full", "tier", "layout")
# the full grid's CPU-tier copies (blocks) and the decode batch they sit beside (sequences, context tokens)
FULL_TIER_BLOCKS, FULL_TIER_DECODE = (4, 16, 64, 128, 256, 1024), (32, 1024)
TABLE_COLUMNS = ("kind", "label") + STEP_TABLE_COLUMNS + (
    "max_prefill_context_tokens", "max_decode_context_tokens", "max_context_tokens",   # engine.core.recorder
    "num_swap_out_blocks", "num_swap_in_blocks",        # the two directions run different copy paths
    "num_offload_blocks", "num_cpu_hit_blocks",         # CPU-tier copies (GPU -> host, host -> GPU)
    "num_batched_tokens", "block_size", "num_repeats", "duration_min_s", "duration_max_s",
    "device_time_s",    # median device seconds of the timed repeats (CUDA events; NaN on CPU)
    "sm_clock_mhz",     # median SM clock while the repeats ran (NVML; NaN without it)
    "power_capped_share")   # share of the repeats during which a power or thermal limit held the clock down


@dataclass(frozen=True)
class Shape:
    """One step: prefill entries (new tokens, cached tokens before them), decode contexts, swaps."""
    # prefill | chunk (a prompt's intermediate chunk: more of the prompt follows, nothing sampled) | multi_prefill |
    # decode | mixed | swap_out | swap_in | tier_out | tier_in
    kind: str
    prefills: tuple[tuple[int, int], ...] = ()  # (new tokens, cached prefix tokens) per prefill entry
    decode_ctx: tuple[int, ...] = ()            # context length per decode entry (this step's token included)
    swap_blocks: int = 0
    tier_blocks: int = 0                        # CPU-tier blocks offloaded (tier_out) or loaded (tier_in)
    scattered: bool = False                     # KV blocks drawn at random from the whole cache, not 0, 1, 2, ...

    @property
    def label(self) -> str:
        p = "+".join(f"{n}@{c}" for n, c in self.prefills)
        d = ""
        if self.decode_ctx:
            lo, hi = min(self.decode_ctx), max(self.decode_ctx)
            d = f"{len(self.decode_ctx)}x{lo}" + (f"-{hi}" if hi != lo else "")
        parts = [x for x in (p and f"P[{p}]", d and f"D[{d}]", self.swap_blocks and f"S[{self.swap_blocks}]",
                             self.tier_blocks and f"T[{self.tier_blocks}]") if x]
        return f"{self.kind}:" + " ".join(parts) + (" scattered" if self.scattered else "")

    def blocks_needed(self, block_size: int) -> int:
        ctx = [n + c for n, c in self.prefills] + list(self.decode_ctx)
        return sum(-(-x // block_size) for x in ctx) + self.tier_blocks + self.swap_blocks


def grid_shapes(grid: str, max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int,
                seed: int = 0) -> list[Shape]:
    """The shapes of a grid, within the engine's limits (context <= max_model_len, tokens <= batch budget).

    The full grid covers its envelope: prefills and contexts up to max_model_len (sampled sparsely past
    4,096 tokens, see long_shapes), chunks with a cached context, mixed chunk + decode steps, uniform,
    ragged and long-tail decode batches and swaps, so that a fit on it interpolates inside the limits
    a run is configured with instead of extrapolating.
    """
    if grid not in GRIDS:
        raise ValueError(f"--grid must be one of {GRIDS}, got {grid!r}")
    rng = np.random.default_rng(seed)
    if grid == "tier":
        b, ctx = min(FULL_TIER_DECODE[0], max_num_seqs), min(FULL_TIER_DECODE[1], max_model_len)
        return [Shape("decode", (), (ctx,) * b)] + [Shape(kind, (), (ctx,) * b, tier_blocks=n)
                                                     for n in FULL_TIER_BLOCKS for kind in ("tier_out", "tier_in")]
    if grid == "layout":
        return layout_shapes(max_model_len, max_num_batched_tokens, max_num_seqs)
    if grid == "small":
        chunks, cached = (8, 32, 64, 128), (0, 64, 192)
        chunk_parts = (64,)
        multi = [(k, n) for k in (2, 4) for n in (16, 64)]
        batch_sizes, contexts = (1, 2, 4, 8, 16), (16, 64, 128, 256)
        mixed = [(4, 64, 32), (8, 128, 64)]
        swaps = (1, 4, 8)
        ragged = [(8, 128), (16, 256)]
        tiers, tier_decode = (1, 4, 8), (4, 64)
    else:
        chunks, cached = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192), (0, 1024, 3072)
        chunk_parts = (128, 512, 2048)
        multi = [(k, n) for k in (2, 4, 8, 16, 32) for n in (128, 512, 1024)]
        batch_sizes = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
        contexts = (64, 256, 512, 1024, 2048, 4096)
        mixed = [(b, ctx, n) for b in (16, 64, 128) for ctx in (512, 2048) for n in (256, 1024)]
        # whole sequences move: ~1k-token contexts are ~64 blocks; per-block cost grows past the host caches
        swaps = (4, 16, 64, 128, 256, 1024)
        ragged = [(b, 2048) for b in (16, 64, 256)]
        # a long prompt evicts (offloads) or hits (loads) hundreds of blocks; beside a decode batch they overlap
        tiers, tier_decode = FULL_TIER_BLOCKS, FULL_TIER_DECODE
    fits = (lambda n, c: n + c <= max_model_len and n <= max_num_batched_tokens)
    shapes = [Shape("prefill", ((n, c),)) for c in cached for n in chunks if fits(n, c)]
    # the same chunks as a prompt's intermediate ones, which sample nothing: no LM-head weight read, no sampler
    # (lm_head_step; chunked prefill runs most chunks so)
    shapes += [Shape("chunk", ((n, c),)) for c in cached for n in chunk_parts if fits(n + n, c)]
    shapes += [Shape("multi_prefill", ((n, 0),) * k) for k, n in multi
               if fits(n, 0) and k * n <= max_num_batched_tokens and k <= max_num_seqs]
    shapes += [Shape("decode", (), (ctx,) * b) for b in batch_sizes for ctx in contexts
               if b <= max_num_seqs and ctx <= max_model_len]
    # ragged decode contexts (real batches are never uniform)
    shapes += [Shape("decode", (), tuple(int(x) for x in rng.integers(16, min(hi, max_model_len) + 1, size=b)))
               for b, hi in ragged if b <= max_num_seqs]
    shapes += [Shape("mixed", ((n, 0),), (ctx,) * b) for b, ctx, n in mixed
               if b + 1 <= max_num_seqs and fits(n, 0) and ctx <= max_model_len and n + b <= max_num_batched_tokens]
    b, ctx = tier_decode
    if b <= max_num_seqs and ctx <= max_model_len:
        # swaps ride on a step that computes (a preemption or a resume beside the running decodes): there the
        # host issues the copies while the device runs them, where a step of copies alone waits for the host
        # (on the H200 0.6-0.75 ms a step alone, 0.1-0.3 ms beside a forward pass)
        shapes += [Shape(kind, (), (ctx,) * b, swap_blocks=s) for s in swaps for kind in ("swap_out", "swap_in")]
        shapes += [Shape(kind, (), (ctx,) * b, tier_blocks=n) for n in tiers for kind in ("tier_out", "tier_in")]
    else:
        shapes += [Shape(kind, swap_blocks=s) for s in swaps for kind in ("swap_out", "swap_in")]
    if grid == "full":
        shapes += long_shapes(max_model_len, max_num_batched_tokens, max_num_seqs, rng)
    return list(dict.fromkeys(shapes))        # each shape once (the long end may repeat one at small limits)


def layout_shapes(max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int) -> list[Shape]:
    """`--grid layout`: a few of the full grid's shapes twice, on blocks 0, 1, 2, ... (as the grid times every
    shape) and on blocks drawn at random from the whole cache (as a serving run's block tables end up after
    some churn), to measure whether the KV layout moves a step's time. Not a fit's table: the comparison's.
    On the H200 the replays' fresh 3-6k-token prompts ran 2-4% longer than the fit (whose grid times them on
    contiguous blocks) priced them, while their chunks of 512 tokens on the same contexts came out right."""
    base = [Shape("prefill", ((n, 0),)) for n in (2048, 3072, 4096, 6144)]
    base += [Shape("prefill", ((512, 3072),)), Shape("chunk", ((512, 3072),)),
             Shape("multi_prefill", ((1024, 0),) * 4)]
    base += [Shape("decode", (), (c,) * b) for b, c in ((32, 2048), (128, 1024), (8, 8192))]
    fits = [sh for sh in base if max((n + c for n, c in sh.prefills), default=0) <= max_model_len
            and max(sh.decode_ctx, default=0) <= max_model_len and len(sh.prefills) + len(sh.decode_ctx) <= max_num_seqs
            and sum(n for n, _ in sh.prefills) + len(sh.decode_ctx) <= max_num_batched_tokens]
    return [Shape(sh.kind, sh.prefills, sh.decode_ctx, scattered=x) for sh in fits for x in (False, True)]


LONG_CONTEXTS = (6144, 8192, 12288, 16384, 24576, 32768)   # plus max_model_len itself
DECODE_KV_TOKENS = 1 << 20      # largest uniform decode batch profiled, in keys (120 GB of Qwen3-0.6B KV; an
                                # H200 holds ~1.15M tokens); shapes beyond the runner's cache are skipped


def long_shapes(max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int,
                rng: np.random.Generator) -> list[Shape]:
    """The full grid's long end and the shapes a sum hides, sparse (a few per context length).

    * prefills of up to max_num_batched_tokens new tokens on an empty cache, and chunks of 128 / 512 / 1,024 /
      4,096 tokens whose context (cached prefix + chunk) reaches each long context: a prefix-cache hit or
      a late chunk of a long prompt (512: the sarathi scheduler's token budget, conf/scheduler/sarathi.yaml);
    * several long prefills in one step;
    * mixed chunked steps: a chunk with a cached context plus a decode batch (chunked prefill);
    * uniform decode batches at each long context, up to DECODE_KV_TOKENS keys in all;
    * long-tail decode batches: many short contexts and a few long ones (one long sequence's keys take
      one program through the whole context, which the sum of contexts does not show);
    * ragged decode batches with contexts spread up to the long end.
    """
    L, T = max_model_len, max_num_batched_tokens
    ctxs = sorted({c for c in LONG_CONTEXTS if c < L} | ({L} if L > 4096 else set()))
    shapes = [Shape("prefill", ((n, 0),)) for n in (6144, 8192, 12288, 16384, 24576, 32768) if n <= min(L, T)]
    # fresh prompts between the powers of two: a serving run's prompts pad to every 256-token graph size
    shapes += [Shape("prefill", ((n, 0),)) for n in (2560, 3072, 3584, 5120, 7168) if n <= min(L, T) and L > 4096]
    if L > 8192 and L <= T:
        shapes.append(Shape("prefill", ((L, 0),)))
    shapes += [Shape("prefill", ((n, c - n),)) for c in ctxs for n in (128, 512, 1024, 4096) if n <= T and n < c]
    shapes += [Shape("chunk", ((512, c - 512),)) for c in ctxs if 512 <= T and 512 + c <= L]
    shapes += [Shape("multi_prefill", ((n, 0),) * k) for k, n in ((2, 4096), (2, 8192), (4, 4096), (3, 5000))
               if n <= L and k * n <= T and k <= max_num_seqs]
    mixed = [(n, c, b, d) for n, c in ((512, 2048), (2048, 2048), (512, 8192), (2048, 16384), (512, 32768))
             for b, d in ((16, 1024), (128, 1024), (32, 8192))]
    shapes += [Shape("mixed", ((n, c),), (d,) * b) for n, c, b, d in mixed
               if n + c <= L and d <= L and n + b <= T and b + 1 <= max_num_seqs]
    # a chunk at a short context beside a few long decodes (chunked prefill on a long-output workload): in a
    # padded prefill graph every decode is a varlen entry whose one program per head reads its whole context
    # (decodes clipped to the window rather than dropped: with one decode alone its keys and their sum coincide)
    shapes += [Shape("mixed", ((n, c),), (min(d, L),) * b) for n, c in ((128, 0), (512, 0), (512, 1024))
               for b, d in ((1, 4096), (2, 8192), (4, 6144), (1, L)) if n + c <= L and n + b <= T]
    # a chunk beside one decode whose context L runs from below to above the chunk's context c, and the same with
    # two short decodes riding too: a decode entry's one program per KV head walks its keys alone, and becomes the
    # step's critical path before L reaches c (measured on an H100's replays, 0.9 c; the mixed rows of the replays
    # alone could not tell that ratio from the per-key cost of short decodes in such steps). The step holds 512
    # tokens, decodes included, as the sarathi scheduler fills it: 512 + 1 tokens would run the 576-token graph,
    # whose GEMMs take one more 128-row tile (on an H100 such shapes sat 2-7% above the replays' same steps)
    shapes += [Shape("mixed", ((511 - k, c - 511 + k),), (int(f * c),) + (256,) * k) for c in (2048, 4096, 6144)
               for f in (0.7, 0.85, 0.95, 1.0, 1.1, 1.5) for k in (0, 2)
               if c <= L and int(f * c) <= L and 512 <= T and 1 + k <= max_num_seqs]
    # fresh prompts at odd multiples of 64 tokens between 256 and 2,048 (graph sizes the grid's other prompts, even
    # multiples, leave out): whether a half-filled 128-row GEMM tile costs what a full one does
    shapes += [Shape("prefill", ((n, 0),)) for n in (320, 384, 448, 576, 640, 1088, 1152) if n <= min(L, T)]
    shapes += [Shape("decode", (), (c,) * b) for c in ctxs for b in (1, 8, 32, 128)
               if b <= max_num_seqs and b * c <= DECODE_KV_TOKENS]
    # either side of the batch size where the decode kernel stops splitting keys (num_seqs * kv_heads vs the
    # SM count: 33 sequences for 8 KV heads on 132 SMs)
    shapes += [Shape("decode", (), (c,) * b) for b in (12, 24, 40) for c in (256, 2048, 8192)
               if b <= max_num_seqs and c <= L]
    tails = [(64, 8, 256, 4000), (128, 16, 256, 4000), (256, 32, 256, 4000), (32, 2, 1024, 16384),
             (128, 4, 1024, 16384), (256, 8, 2048, 8192), (32, 1, 512, L), (128, 2, 512, L)]
    for b, n_long, short, long in tails:
        long = min(long, L)
        if b > max_num_seqs or long <= short:
            continue
        ctx = [int(x) for x in rng.integers(16, short + 1, size=b - n_long)] + [long] * n_long
        shapes.append(Shape("decode", (), tuple(ctx)))
    shapes += [Shape("decode", (), tuple(int(x) for x in rng.integers(16, hi + 1, size=b)))
               for b, hi in ((16, L), (64, min(L, 16384)), (256, min(L, 8192))) if b <= max_num_seqs and hi > 4096]
    return shapes


def build_batch(shape: Shape, block_size: int, vocab_size: int, temperature: float,
                rng: np.random.Generator, num_blocks: int | None = None) -> Batch:
    """A Batch over distinct KV blocks 0, 1, 2, ... (prefills first, then decodes); a `scattered` shape's blocks
    drawn at random from range(num_blocks) (the runner's cache) instead."""
    if shape.scattered and not num_blocks:
        raise ValueError(f"{shape.label}: a scattered shape needs the cache's num_blocks")
    order = rng.permutation(num_blocks) if shape.scattered else None
    params = SamplingParams(temperature=temperature, max_tokens=1, ignore_eos=True)
    seqs, new, ctx = [], [], []
    cursor = 0
    entries = [(n, n + c) for n, c in shape.prefills] + [(1, c) for c in shape.decode_ctx]
    for i, (n, c) in enumerate(entries):
        # an intermediate chunk's prompt runs on past this step's tokens (Batch.samples: no LM-head row)
        tail = n if shape.kind == "chunk" and i < len(shape.prefills) else 0
        seq = Sequence(f"p{i}", rng.integers(0, vocab_size, size=c + tail).tolist(), params)
        nb = -(-c // block_size)
        seq.block_table = list(range(cursor, cursor + nb)) if order is None else order[cursor:cursor + nb].tolist()
        cursor += nb
        seqs.append(seq)
        new.append(n)
        ctx.append(c)
    b = Batch(seqs=seqs, num_new_tokens=new, num_prefill_seqs=len(shape.prefills), block_size=block_size,
              context_lens=ctx)
    if shape.kind == "swap_out":        # blocks past the batch's own: a preempted sequence's
        b.swap_out = [(cursor + i, i) for i in range(shape.swap_blocks)]
    elif shape.kind == "swap_in":
        b.swap_in = [(i, cursor + i) for i in range(shape.swap_blocks)]
    elif shape.kind == "tier_out":      # blocks past the batch's own: evicted ones a new owner takes
        b.offload = [(cursor + i, i) for i in range(shape.tier_blocks)]
    elif shape.kind == "tier_in":
        b.load = [(i, cursor + i) for i in range(shape.tier_blocks)]
    return b


def time_step(runner, batch: Batch, warmup: int, repeats: int, sync, duty_cycle: float = 1.0, clock=None,
              sleep=time.sleep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(wall seconds, device seconds, SM clock MHz, power capped) of each timed repeat; device seconds are NaN
    where the runner does not time the device (CPU), the clock NaN and the cap False without `clock`
    (experiments.gpu_clock.GpuClock, read while the queued launches run).

    The device seconds come from a second launch queued behind the first, as overlap scheduling runs steps:
    alone, a step's timing events would also span the host's input copies and graph launch, during which the
    device waits (the same batch twice writes the same bytes, so the second launch may refill the host
    buffers the first one's copies read). Steps with block copies are timed alone: their copies wait for the
    host anyway.

    duty_cycle: the share of time the device is kept busy; after every execute() or queued pair the profiler
    idles (1 / duty_cycle - 1) times as long, so a loop of large steps stays out of the GPU's power cap as a
    serving loop does (experiments/gpu_clock.py)."""
    if not 0 < duty_cycle <= 1:
        raise ValueError(f"duty_cycle must be in (0, 1], got {duty_cycle}")
    idle = 1.0 / duty_cycle - 1.0

    def pace(t0: float) -> float:
        busy = time.perf_counter() - t0
        if idle:
            sleep(idle * busy)
        return busy

    for _ in range(warmup):
        t0 = time.perf_counter()
        runner.execute(batch)
        sync()
        pace(t0)
    timed = getattr(runner, "time_device", False)
    queued = timed and not (batch.swap_out or batch.swap_in or batch.offload or batch.load)
    out, dev = np.empty(repeats), np.full(repeats, np.nan)
    mhz, capped = np.full(repeats, np.nan), np.zeros(repeats, dtype=bool)
    for r in range(repeats):
        t0 = time.perf_counter()
        runner.execute(batch)
        sync()
        out[r] = pace(t0)
        if queued:
            t0 = time.perf_counter()
            first, second = runner.launch(batch), runner.launch(batch)
            if clock is not None:                  # read while the device runs the two launches
                mhz[r], capped[r] = clock.sm_mhz(), clock.power_capped()
            runner.collect(first)
            runner.collect(second)
            pace(t0)
        elif clock is not None:
            mhz[r], capped[r] = clock.sm_mhz(), clock.power_capped()
        d = runner.last_device_time_s if timed else None
        if d is not None:
            dev[r] = d
    return out, dev, mhz, capped


def profile(runner, shapes: list[Shape], *, warmup: int = 2, repeats: int = 5, temperature: float = 0.6,
            seed: int = 0, log=print, duty_cycle: float = 1.0, clock=None):
    """Times every shape on `runner` (an engine.model_runner.ModelRunner); returns the table (DataFrame).
    duty_cycle, clock: see time_step."""
    import pandas as pd

    from experiments.runner_engine import _device_sync

    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    sync = _device_sync(runner)
    runner.time_device = getattr(runner, "is_cuda", False)     # device seconds per step too (CUDA events)
    rng = np.random.default_rng(seed)
    bs = runner.block_size
    vocab = runner.model.config.vocab_size
    rows = []
    t_start = time.perf_counter()
    for k, shape in enumerate(shapes):
        need = shape.blocks_needed(bs)
        if (need > runner.num_kvcache_blocks or shape.swap_blocks > runner.num_cpu_blocks
                or shape.tier_blocks > getattr(runner, "cpu_cache_num_blocks", 0)):
            log(f"skip {shape.label}: needs {need} KV blocks / {shape.swap_blocks} swap blocks / {shape.tier_blocks} "
                f"CPU-tier blocks, the runner has {runner.num_kvcache_blocks} / {runner.num_cpu_blocks} / "
                f"{getattr(runner, 'cpu_cache_num_blocks', 0)}")
            continue
        batch = build_batch(shape, bs, vocab, temperature, rng, runner.num_kvcache_blocks)
        times, device_times, mhz, capped = time_step(runner, batch, warmup, repeats, sync, duty_cycle, clock)
        rec = Recorder()
        rec.on_step(0.0, float(np.median(times)), batch, 0, 0, 0)
        row = rec.steps_frame().iloc[0].to_dict()
        row.update(kind=shape.kind, label=shape.label, block_size=bs, num_repeats=repeats,
                   num_swap_out_blocks=len(batch.swap_out), num_swap_in_blocks=len(batch.swap_in),
                   duration_min_s=float(times.min()), duration_max_s=float(times.max()),
                   device_time_s=float(np.median(device_times)) if np.isfinite(device_times).all() else np.nan,
                   sm_clock_mhz=float(np.median(mhz)) if np.isfinite(mhz).all() else np.nan,
                   power_capped_share=float(capped.mean()) if clock is not None else np.nan)
        rows.append({c: row[c] for c in TABLE_COLUMNS})
        if k % 20 == 0 or k == len(shapes) - 1:
            log(f"[{k + 1}/{len(shapes)}] {shape.label}: {1e3 * row['duration_s']:.3f} ms "
                f"({time.perf_counter() - t_start:.1f} s so far)")
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def _clock_summary(table) -> dict:
    """Min / median / max of the rows' SM clocks (MHz) and the share of rows timed under a power cap."""
    c = table["sm_clock_mhz"].dropna()
    return {"min": float(c.min()), "median": float(c.median()), "max": float(c.max()),
            "rows_power_capped": float((table["power_capped_share"] > 0).mean())} if len(c) else {}


def device_name(runner) -> str:
    if getattr(runner, "is_cuda", False):
        import torch
        return torch.cuda.get_device_name(runner.device)
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def set_threads(threads: int | None, device: str) -> int | None:
    """torch.set_num_threads(threads), defaulting to 1 on cpu; returns the number set (None: untouched)."""
    if threads is None and device == "cpu":
        threads = 1
    if threads is not None:
        import torch
        torch.set_num_threads(int(threads))
    return threads


def estimate_seconds(shapes: list[Shape], cost_model, warmup: int, repeats: int, block_size: int = 16,
                     duty_cycle: float = 1.0) -> float:
    """Seconds the timed loop of `profile` would take, the steps priced by `cost_model`: each shape's warmups,
    its timed runs and the pair queued behind each (time_step), stretched by the duty cycle's idle time."""
    rng = np.random.default_rng(0)
    return sum((warmup + 3 * repeats) * cost_model.step_time_s(build_batch(sh, block_size, 1000, 0.0, rng))
               for sh in shapes) / duty_cycle


def dry_run(args) -> int:
    if args.max_model_len is None:
        raise SystemExit("--dry-run needs --max-model-len (the runner would otherwise take it from the model)")
    shapes = grid_shapes(args.grid, args.max_model_len, args.max_num_batched_tokens, args.max_num_seqs, args.seed)
    for sh in shapes:
        print(sh.label if len(sh.label) <= 100 else sh.label[:97] + "...")
    line = f"{len(shapes)} shapes (grid {args.grid}, max_model_len {args.max_model_len})"
    if args.estimate_with:
        from sim.cost_model.calibrated import CalibratedCostModel
        cm = CalibratedCostModel(args.estimate_with)
        secs = estimate_seconds(shapes, cm, args.warmup, args.repeats, duty_cycle=args.duty_cycle)
        line += (f"; the timed loop takes about {secs:.0f} s "
                 f"priced by {args.estimate_with} (plus the runner's start-up)")
    print(line)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--out", required=True, help="output CSV (a <out>.meta.json sidecar is written beside it)")
    ap.add_argument("--device", default=EngineConfig.device, help="cuda | cuda:N | cpu | auto (default)")
    ap.add_argument("--grid", default="full", choices=GRIDS)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per shape (the median is kept)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs per shape before timing")
    ap.add_argument("--duty-cycle", type=float, default=0.5, help="share of the time the device is kept busy: "
                    "after each run the profiler idles (1 / duty - 1) times as long, so a loop of large steps stays "
                    "out of the GPU's power cap as a serving loop does (default 0.5; 1: back to back)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs)
    ap.add_argument("--num-kvcache-blocks", type=int, default=None, help="default: derived from device memory")
    ap.add_argument("--num-cpu-blocks", type=int, default=None, help="swap space in blocks (default: the grid's "
                    "largest swap)")
    ap.add_argument("--attention-backend", default=EngineConfig.attention_backend)
    ap.add_argument("--dtype", default=EngineConfig.dtype)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=EngineConfig.seed)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: 1 on cpu, where "
                    "several threads make timings erratic on a shared machine; torch's default elsewhere)")
    ap.add_argument("--dry-run", action="store_true", help="list the grid's shapes and estimate the profiling "
                    "time (no model loaded, no torch); needs --max-model-len")
    ap.add_argument("--estimate-with", default=None, metavar="FIT.json", help="with --dry-run: a calibrated cost "
                    "model file whose step times price the estimate (default: only the shape count)")
    args = ap.parse_args(argv)
    if not 0 < args.duty_cycle <= 1:
        ap.error(f"--duty-cycle must be in (0, 1], got {args.duty_cycle}")
    if args.dry_run:
        return dry_run(args)
    set_threads(args.threads, args.device)

    from engine.model_runner import ModelRunner

    max_swap = 1024 if args.grid in ("full", "tier") else 8
    # each EngineConfig field from the flag of the same name; a CPU tier as large as the grid's largest copy
    cfg = EngineConfig.from_attributes(args, model_path=args.model, num_cpu_blocks=args.num_cpu_blocks
                                       if args.num_cpu_blocks is not None else max_swap,
                                       cpu_cache_num_blocks=max_swap)
    t0 = time.perf_counter()
    runner = ModelRunner(cfg)
    print(f"runner ready in {time.perf_counter() - t0:.1f} s: {device_name(runner)}, {runner.dtype}, attention "
          f"{runner.attn_backend.name}, {runner.num_kvcache_blocks} KV blocks, {len(runner.graphs)} CUDA graphs",
          flush=True)
    shapes = grid_shapes(args.grid, runner.max_model_len, cfg.max_num_batched_tokens, cfg.max_num_seqs, args.seed)
    clock = GpuClock.open(runner.device)
    table = profile(runner, shapes, warmup=args.warmup, repeats=args.repeats, temperature=args.temperature,
                    seed=args.seed, log=lambda m: print(m, flush=True), duty_cycle=args.duty_cycle, clock=clock)
    atomic_write_text(args.out, table.to_csv(index=False))
    mc = runner.model.config
    meta = dict(
        command="python -m experiments.profile " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=device_name(runner), dtype=str(runner.dtype).replace("torch.", ""),
        attention_backend=runner.attn_backend.name, cuda_graphs=bool(runner.graphs), grid=args.grid,
        prefill_graph_max_tokens=runner.prefill_graphs.sizes[-1] if runner.prefill_graphs is not None else 0,
        threads=__import__("torch").get_num_threads(),
        repeats=args.repeats, warmup=args.warmup, duty_cycle=args.duty_cycle, block_size=runner.block_size,
        sm_clock_mhz=_clock_summary(table) if clock is not None else None,
        max_model_len=runner.max_model_len, num_kvcache_blocks=runner.num_kvcache_blocks,
        model_path=str(args.model),
        model=dict(num_layers=mc.num_hidden_layers, hidden_size=mc.hidden_size, num_q_heads=mc.num_attention_heads,
                   num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim, vocab_size=mc.vocab_size,
                   intermediate_size=mc.intermediate_size),
        num_rows=len(table), seconds=round(time.perf_counter() - t0, 1))
    try:
        import torch
        meta["torch"] = torch.__version__
        if runner.device.type == "cuda":     # the decode kernel's split rule reads it (engine/kernels/paged_decode)
            meta["num_sms"] = torch.cuda.get_device_properties(runner.device).multi_processor_count
    except ImportError:
        pass
    write_json(str(args.out) + ".meta.json", meta)
    print(f"wrote {args.out} ({len(table)} shapes) and {args.out}.meta.json", flush=True)
    return 0


if __name__ == "__main__":
    from experiments.user_errors import run_main
    sys.exit(run_main(main))
