"""Fitting the `calibrated` cost model: its design matrix and a weighted, robust non-negative least squares.

    x = design_matrix(table, knee_tokens=4096, block_size=16)      # [rows, len(FEATURES)], one column per term
    fit = fit_coefficients(table)    # Fit: coefficients (seconds per unit of each feature), knee, offsets, walk ratio

The design matrix is the step-time formula of sim/cost_model/calibrated.py
written per table row; `CalibratedCostModel.predict_table` and
`step_time_from_shape` compute the same numbers (tested).

Which columns a table needs: sim.cost_model.base.STEP_TABLE_COLUMNS. Two
optional columns refine it:
  * `num_swap_out_blocks` / `num_swap_in_blocks`: the swap direction of each
    step's blocks (the two directions copy over the host link each way, gather
    before or scatter after the copy). Where a row lacks them
    (NaN or no column), the direction comes from the recorder's
    `num_swapped_out` / `num_swapped_in` sequence counts (blocks split in
    proportion), else from `kind` (a profile's swap_out / swap_in rows), else
    half and half.
  * `num_offload_blocks` / `num_cpu_hit_blocks`: the prefix cache's CPU-tier copies of
    each step (GPU -> host offloads, host -> GPU loads; engine.core.recorder writes
    them); 0 where absent.
  * `serving_loop`: 1 when the row's time includes the serving loop's own host
    work (schedule(), postprocess, arrivals: a real run's steps table), 0 when
    it is `ModelRunner.execute` alone (a profile). Default: 0 for a table with
    a `kind` column (experiments.profile writes one), else 1.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from engine.core.graph_sizes import decode_graph_sizes, prefill_graph_sizes
from sim.cost_model.base import STEP_TABLE_COLUMNS
from sim.cost_model.prefill_span import PrefillSpanGrid, table_makespan_keys, table_riding_walk_keys

# the engine's smallest decode CUDA graph sizes: a batch pads to the next (none above 32 is priced apart)
DECODE_GRAPH_BUCKETS = tuple(b for b in decode_graph_sizes(512) if b <= 32)
FEATURES = ("step", "eager_step", "num_seqs", "prefill_tokens", "prefill_attention_pairs", "decode_context_sum",
            "lm_head_rows", "tokens_over_knee", "swap_step", "swap_out_blocks", "swap_in_blocks", "loop_step",
            "loop_seqs", "loop_prefill_tokens", "prefill_context_tokens", "loop_prefill_step", "mixed_decode_tail_keys",
            "tier_step", "tier_out_blocks", "tier_in_blocks", "decode_tail_keys", "decode_split_keys",
            *(f"decode_graph_{b}" for b in DECODE_GRAPH_BUCKETS), "prefill_attention_span",
            "prefill_attention_span_alone", "prefill_small_tokens", "decode_step", "loop_hit_step", "loop_hit_blocks",
            "lm_head_step", "cold_step", "mixed_decode_rest_keys", "mixed_decode_rest_over")
SMALL_PREFILL_TOKENS = 256   # prefill_small_tokens: min(run prefill tokens, this) of a step with prefill entries
COLD_IDLE_S = 0.02           # cold_step: a run row scheduled after the loop sat idle at least this long
KNEE_CANDIDATES = (None, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
# The keys of a chunk's riding decodes other than the longest: the first RIDING_REST_KNEE_KEYS of them a step read
# under the chunk's own work (fitted on an H100, with a replay whose chunks carry 44-59 decodes: ~1e-8 s a key), the
# rest at about a pure decode's price (3.2e-8 against 3.6e-8). One linear price fitted 14-16% below a decode's and
# left chunks carrying 9-55 decodes 6-8% high (benchmarks/results/generalize/h100_1206n/README.md)
RIDING_REST_KNEE_KEYS = 8192
WALK_RATIO_MAX_RIDING = 8   # the walk ratio is chosen on the rows it describes: chunks with at most this many decodes
OBJECTIVES = ("relative", "sqrt", "absolute")    # row weight 1/y, 1/sqrt(y), 1 on the residual
HUBER_REL = 0.25          # relative residual beyond which a row's weight is cut (host hiccups, compile stalls)


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None, tol: float = 1e-12) -> np.ndarray:
    """argmin_x ||a x - b||_2 subject to x >= 0 (Lawson-Hanson active set).

    a: [m, n], b: [m]. Columns should be of comparable scale (the caller normalizes).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    max_iter = max_iter or 3 * n + 30
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            if not passive.any():
                break
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                break
            # Step from x toward z until the first passive coefficient hits 0; drop it from the set.
            neg = passive & (z <= 0)
            den = x[neg] - z[neg]                 # 0 when a coefficient sits at 0 in both (collinear columns)
            alpha = np.min(np.where(den > 0, x[neg] / np.where(den > 0, den, 1.0), 0.0))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        w = a.T @ (b - a @ x)
    return x


def _col(steps, name: str, default: float | None = None) -> np.ndarray:
    if name in steps:
        return np.asarray(steps[name], dtype=np.float64)
    n = len(np.asarray(steps["num_prefill_seqs"]))
    return np.full(n, float(default))


def copy_blocks(steps) -> np.ndarray:
    """[rows] blocks each step copies (swaps, CPU-tier offloads and loads): device work the forward pass waits for."""
    return sum(np.nan_to_num(_col(steps, c, 0.0)) for c in ("num_swap_blocks", "num_offload_blocks",
                                                           "num_cpu_hit_blocks"))


def swap_directions(steps) -> tuple[np.ndarray, np.ndarray]:
    """(swap-out blocks, swap-in blocks) per row; see the module docstring for the rules."""
    total = _col(steps, "num_swap_blocks")
    frac_out = np.full(len(total), 0.5)
    if "kind" in steps:
        kind = np.asarray(steps["kind"]).astype(str)
        frac_out = np.where(kind == "swap_out", 1.0, np.where(kind == "swap_in", 0.0, frac_out))
    if "num_swapped_out" in steps and "num_swapped_in" in steps:
        so, si = _col(steps, "num_swapped_out"), _col(steps, "num_swapped_in")
        known = np.isfinite(so) & np.isfinite(si) & (so + si > 0)
        frac_out = np.where(known, so / np.where(known, so + si, 1.0), frac_out)
    out, inn = total * frac_out, total * (1.0 - frac_out)
    if "num_swap_out_blocks" in steps and "num_swap_in_blocks" in steps:
        # explicit counts win where present (NaN: a concatenated table whose rows lacked them)
        e_out, e_in = _col(steps, "num_swap_out_blocks"), _col(steps, "num_swap_in_blocks")
        has = np.isfinite(e_out) & np.isfinite(e_in)
        if np.any(np.abs(e_out + e_in - total)[has] > 0.5):
            raise ValueError("num_swap_out_blocks + num_swap_in_blocks must equal num_swap_blocks in every row; "
                             "fix the table or drop the two direction columns")
        out, inn = np.where(has, e_out, out), np.where(has, e_in, inn)
    return out, inn


def serving_loop_flags(steps) -> np.ndarray:
    """1.0 where a row's time includes the serving loop's host work, 0.0 where it is execute() alone."""
    flags = _col(steps, "serving_loop", 0.0 if "kind" in steps else 1.0)
    if not np.all((flags == 0) | (flags == 1)):
        raise ValueError("column serving_loop must hold 0 (a profile row: execute() alone) or 1 (a real run's "
                         "step: schedule + execute + postprocess)")
    return flags


# candidates for mixed_walk_ratio, chosen by training error at the chosen knee (fit_coefficients)
MIXED_WALK_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


def mixed_decode_tail_keys(steps, walk_ratio: float = 1.0, grid: PrefillSpanGrid | None = None,
                           graph_max_tokens: int | None = None) -> np.ndarray:
    """Per row: keys by which a step's longest decode context exceeds walk_ratio times its longest prefill context,
    in steps with prefill entries (0 otherwise, and 0 for a table without the recorder's max_*_context_tokens
    columns). walk_ratio < 1: a decode entry's one program per KV head walks its keys alone, slower per key than
    the chunk's programs, which share theirs 16 a head, so the decode's walk becomes the step's critical path
    before it is as long as the chunk's (on an H100's replays from about 0.9 of it: docs/validation.md).

    With grid and graph_max_tokens (fits made since: CalibratedCostModel's mixed_walk_makespan), the steps run from
    a padded prefill graph price instead the keys by which their decodes lengthen the prefill kernel's makespan
    (PrefillSpanGrid.riding_walk_keys, a decode's key at 1 / walk_ratio of a prefill program's). Where every program
    is resident that is the rule above, scaled; where the decodes outnumber the free program slots (tens of them
    beside a chunk) they queue behind the chunk's programs, which the longest decode alone does not show: an H100's
    512-token chunks carrying 9-64 decodes were priced 1.032 of their device seconds with the rule above, 1.012 with
    this (benchmarks/results/generalize/h100_1207t/)."""
    p_seqs, d_seqs = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    if "max_decode_context_tokens" not in steps or "max_prefill_context_tokens" not in steps:
        return np.zeros_like(p_seqs)
    tail = _col(steps, "max_decode_context_tokens") - float(walk_ratio) * _col(steps, "max_prefill_context_tokens")
    tail = np.where((p_seqs > 0) & (d_seqs > 0), np.maximum(np.nan_to_num(tail), 0.0), 0.0)
    if grid is None or not graph_max_tokens:
        return tail
    riding = (p_seqs > 0) & (d_seqs > 0) & (_col(steps, "num_prefill_tokens") + d_seqs <= graph_max_tokens)
    return np.where(riding, table_riding_walk_keys(steps, grid, riding, 1.0 / float(walk_ratio)), tail)


def decode_single_split_min_seqs(num_sms: int | None, num_kv_heads: int | None) -> int | None:
    """Fewest decode sequences for which the engine's decode kernel reads each context in one program per
    (sequence, KV head) instead of splitting it (engine/kernels/paged_decode.choose_num_splits: one split once
    num_seqs * num_kv_heads >= 2 * num_sms). None when either count is unknown."""
    if not num_sms or not num_kv_heads:
        return None
    return -(-2 * int(num_sms) // int(num_kv_heads))


def decode_tail_keys(steps, single_split_min_seqs: int | None) -> np.ndarray:
    """Per row: in a pure-decode step of at least single_split_min_seqs sequences, keys by which the longest
    decode context exceeds the mean one (0 otherwise, for single_split_min_seqs None, and for a table without
    the recorder's max_decode_context_tokens column)."""
    p_seqs, d_seqs = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    if single_split_min_seqs is None or "max_decode_context_tokens" not in steps:
        return np.zeros_like(p_seqs)
    mean = _col(steps, "decode_context_sum") / np.maximum(d_seqs, 1.0)
    tail = np.nan_to_num(_col(steps, "max_decode_context_tokens") - mean)
    return np.where((p_seqs == 0) & (d_seqs >= single_split_min_seqs), np.maximum(tail, 0.0), 0.0)


SPLIT_PARTITION_KEYS = 256   # engine/kernels/paged_decode.MIN_PARTITION (sim imports only engine.core): the fewest
                             # keys a split decode program reads
SPLIT_TILE_KEYS = 64         # engine/kernels/decode_variants.DecodeVariant.block_n: a partition is whole tiles
MAX_DECODE_SPLITS = 64       # engine/kernels/paged_decode.MAX_SPLITS


def split_walk_keys(longest, num_seqs, single_split_min_seqs: int):
    """Keys the longest context's split program reads in a decode batch of num_seqs < single_split_min_seqs
    sequences (arrays or numbers), by the engine's rule (paged_decode.choose_num_splits): enough splits for 8
    programs per SM, ceil(4 * single_split_min_seqs / num_seqs) (single_split_min_seqs is 2 SMs' worth of
    sequences), at most MAX_DECODE_SPLITS; each split reads ctx / splits keys rounded up to whole tiles, at least
    SPLIT_PARTITION_KEYS, never more than the context. Up to 256 keys that is the context; past 256 * splits it
    grows with the longest context: a batch of 16 with one context of 16k and fifteen of 3k has its longest
    program read 1,792 keys while the rest read 384 (the profile's D[16x3083-15935], priced 0.93 of its device
    seconds while this term was capped at 256 keys)."""
    if isinstance(longest, (int, float)) and isinstance(num_seqs, (int, float)):     # the simulator's per-step path
        splits = min(math.ceil(4.0 * single_split_min_seqs / max(num_seqs, 1)), MAX_DECODE_SPLITS)
        part = max(math.ceil(math.ceil(longest / splits) / SPLIT_TILE_KEYS) * SPLIT_TILE_KEYS, SPLIT_PARTITION_KEYS)
        return min(longest, part)
    splits = np.minimum(np.ceil(4.0 * single_split_min_seqs / np.maximum(num_seqs, 1)), MAX_DECODE_SPLITS)
    part = np.maximum(np.ceil(np.ceil(longest / splits) / SPLIT_TILE_KEYS) * SPLIT_TILE_KEYS, SPLIT_PARTITION_KEYS)
    return np.minimum(longest, part)


def decode_split_keys(steps, single_split_min_seqs: int | None) -> np.ndarray:
    """Per row: in a pure-decode step of fewer than single_split_min_seqs sequences, the keys its longest context's
    split program reads (split_walk_keys) (0 otherwise, for single_split_min_seqs None, and for a table without the
    recorder's max_decode_context_tokens column)."""
    p_seqs, d_seqs = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    if single_split_min_seqs is None or "max_decode_context_tokens" not in steps:
        return np.zeros_like(p_seqs)
    longest = np.nan_to_num(_col(steps, "max_decode_context_tokens"))
    split = (p_seqs == 0) & (d_seqs > 0) & (d_seqs < single_split_min_seqs)
    return np.where(split, split_walk_keys(longest, d_seqs, single_split_min_seqs), 0.0)


def prefill_span_pairs_per_key(num_sms: int | None, num_q_heads: int | None, num_kv_heads: int | None) -> float | None:
    """The divisor of the older span rule (max(spread, walk), files without a prefill_span_grid): query-key pairs
    that the prefill kernel's program slots, running side by side, cover while one of them reads one key, i.e. the
    tokens a program owns times the slots, per KV head (PrefillSpanGrid.from_counts). None when a count is unknown."""
    grid = PrefillSpanGrid.from_counts(num_sms, num_q_heads, num_kv_heads)
    return None if grid is None else float(grid.tile_tokens) * grid.slots / grid.num_kv_heads


def prefill_attention_span(steps, pairs_per_key: float | None,
                           grid: PrefillSpanGrid | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row with prefill entries: the keys the prefill kernel's busiest program slot reads, as (rows whose
    programs share SMs, rows whose programs each have an SM to itself: PrefillSpanGrid.runs_alone), the columns
    prefill_attention_span and prefill_attention_span_alone. With grid, the greedy list schedule's makespan of the
    kernel's programs (sim/cost_model/prefill_span.py). Else, in files fitted before it, all in the first column:
    max(prefill_attention_pairs / pairs_per_key, longest prefill context), the work spread over the slots, or one
    program's serial walk over the longest context when there are too few programs to fill them. 0 otherwise
    (neither given; without grid, a table without the recorder's max_prefill_context_tokens)."""
    p_seqs = _col(steps, "num_prefill_seqs")
    if grid is not None:
        longest = _col(steps, "max_prefill_context_tokens") if "max_prefill_context_tokens" in steps else None
        return table_makespan_keys(p_seqs, _col(steps, "num_prefill_tokens"), _col(steps, "prefill_context_sum"), grid,
                                   longest, _col(steps, "prefill_attention_pairs"))
    if pairs_per_key is None or "max_prefill_context_tokens" not in steps:
        return np.zeros_like(p_seqs), np.zeros_like(p_seqs)
    spread = _col(steps, "prefill_attention_pairs") / float(pairs_per_key)
    walk = np.where(p_seqs > 0, np.maximum(spread, np.nan_to_num(_col(steps, "max_prefill_context_tokens"))), 0.0)
    return walk, np.zeros_like(p_seqs)


def padded_step_tokens(tokens: np.ndarray, graph_max_tokens: int | None) -> np.ndarray:
    """Per step with prefill entries: the token count its CUDA graph runs (the next prefill_graph_sizes entry;
    a step above the largest, or without graphs, runs eagerly at its own count)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    sizes = np.asarray(prefill_graph_sizes(int(graph_max_tokens or 0)), dtype=np.float64)
    if not len(sizes):
        return tokens
    i = np.searchsorted(sizes, tokens)
    return np.where(tokens <= sizes[-1], sizes[np.minimum(i, len(sizes) - 1)], tokens)


def design_matrix(steps, knee_tokens: int | None, block_size: int | None = None,
                  single_split_min_seqs: int | None = None, prefill_span_pairs: float | None = None,
                  prefill_graph_max_tokens: int | None = None,
                  prefill_span_grid: PrefillSpanGrid | None = None, mixed_walk_ratio: float = 1.0,
                  mixed_walk_makespan: bool = False) -> np.ndarray:
    """[rows, len(FEATURES)] features of a step table (DataFrame or mapping of STEP_TABLE_COLUMNS columns).

    block_size: the block size the swap coefficients are per (rows with a `block_size` column are scaled
    to it: a block twice as large copies twice the bytes). single_split_min_seqs: see decode_tail_keys and
    decode_split_keys (None: those columns are 0). prefill_span_pairs, prefill_span_grid: see
    prefill_attention_span (both None: 0).
    prefill_graph_max_tokens: the engine's largest prefill CUDA graph; a step with prefill entries pays
    prefill_tokens and tokens_over_knee on its padded token count (padded_step_tokens; None or 0: its own).
    mixed_walk_ratio, mixed_walk_makespan: see mixed_decode_tail_keys (the makespan needs prefill_span_grid).
    """
    missing = [c for c in STEP_TABLE_COLUMNS if c != "duration_s" and c not in steps]
    if missing:
        raise ValueError(f"step table lacks column(s) {missing}; a table needs {list(STEP_TABLE_COLUMNS)} "
                         f"(as experiments.profile and engine.core.recorder write them)")
    p_seqs, d_seqs = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    p_tok = _col(steps, "num_prefill_tokens")
    # the GEMMs run the padded graph: [rows] tokens priced per token, decode entries' own rows apart
    step_tok = np.where(p_seqs > 0, padded_step_tokens(p_tok + d_seqs, prefill_graph_max_tokens), p_tok + d_seqs)
    p_tok_run = np.where(p_seqs > 0, step_tok - d_seqs, p_tok)
    seqs = p_seqs + d_seqs
    forward = (seqs > 0).astype(np.float64)
    eager = (p_seqs > 0).astype(np.float64)
    sw_out, sw_in = swap_directions(steps)
    if block_size is not None and "block_size" in steps:
        bs = _col(steps, "block_size")          # NaN where a concatenated table lacked the column: as fitted
        scale = np.where(np.isfinite(bs), bs / block_size, 1.0)
        sw_out, sw_in = sw_out * scale, sw_in * scale
    tier_out = np.nan_to_num(_col(steps, "num_offload_blocks", 0.0))     # NaN: a concatenated table without them
    tier_in = np.nan_to_num(_col(steps, "num_cpu_hit_blocks", 0.0))
    hits = np.nan_to_num(_col(steps, "num_gpu_hit_blocks", 0.0))     # [rows] GPU prefix-cache hits admitted, blocks
    if block_size is not None and "block_size" in steps:
        tier_out, tier_in = tier_out * scale, tier_in * scale
    nonempty = ((seqs > 0) | (sw_out + sw_in + tier_out + tier_in > 0)).astype(np.float64)
    over = eager * np.maximum(step_tok - knee_tokens, 0.0) if knee_tokens is not None else np.zeros_like(p_tok)
    loop = serving_loop_flags(steps)
    rows_sampled = _col(steps, "num_prefill_samples") + d_seqs       # [rows] LM-head rows
    cold = (np.nan_to_num(_col(steps, "idle_before_s", 0.0)) >= COLD_IDLE_S) & (seqs > 0)
    longest, rest = riding_decode_keys(steps, prefill_graph_max_tokens)
    return np.column_stack([forward, eager, seqs, p_tok_run, _col(steps, "prefill_attention_pairs"),
                            longest, rows_sampled, over,
                            ((sw_out + sw_in) > 0).astype(np.float64), sw_out, sw_in, loop * nonempty, loop * seqs,
                            loop * p_tok, _col(steps, "prefill_context_sum"), loop * eager,
                            mixed_decode_tail_keys(steps, mixed_walk_ratio,
                                                   prefill_span_grid if mixed_walk_makespan else None,
                                                   prefill_graph_max_tokens),
                            ((tier_out + tier_in) > 0).astype(np.float64), tier_out,
                            tier_in, decode_tail_keys(steps, single_split_min_seqs),
                            decode_split_keys(steps, single_split_min_seqs),
                            *decode_graph_buckets(steps),
                            *prefill_attention_span(steps, prefill_span_pairs, prefill_span_grid),
                            eager * np.minimum(p_tok_run, SMALL_PREFILL_TOKENS),
                            ((p_seqs == 0) & (d_seqs > 0)).astype(np.float64), loop * (hits > 0), loop * hits,
                            (rows_sampled > 0).astype(np.float64), loop * cold,
                            np.minimum(rest, RIDING_REST_KNEE_KEYS), np.maximum(rest - RIDING_REST_KNEE_KEYS, 0.0)])


def riding_decode_keys(steps, graph_max_tokens: int | None) -> tuple[np.ndarray, np.ndarray]:
    """([rows] decode keys priced at decode_context_sum, [rows] riding keys priced in two pieces): in a step with
    prefill entries and decodes run from a padded prefill CUDA graph, the longest decode's keys and the rest of the
    decodes' (RIDING_REST_KNEE_KEYS); elsewhere all decode keys and 0. A table without max_decode_context_tokens:
    the mean decode's keys stand for the longest."""
    p_seqs, d_seqs = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    dctx = _col(steps, "decode_context_sum")
    if not graph_max_tokens:
        return dctx, np.zeros_like(dctx)
    riding = (p_seqs > 0) & (d_seqs > 0) & (_col(steps, "num_prefill_tokens") + d_seqs <= graph_max_tokens)
    mean = dctx / np.maximum(d_seqs, 1.0)
    longest = np.nan_to_num(_col(steps, "max_decode_context_tokens"), nan=0.0) \
        if "max_decode_context_tokens" in steps else mean
    longest = np.where(longest > 0, np.minimum(longest, dctx), mean)
    return np.where(riding, longest, dctx), np.where(riding, dctx - longest, 0.0)


def decode_graph_buckets(steps) -> list[np.ndarray]:
    """Per bucket of DECODE_GRAPH_BUCKETS: 1 on pure-decode rows whose batch pads to that CUDA graph size."""
    p_seqs, d_seqs = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    dec = (p_seqs == 0) & (d_seqs > 0)
    lo = 0
    out = []
    for b in DECODE_GRAPH_BUCKETS:
        out.append((dec & (d_seqs > lo) & (d_seqs <= b)).astype(np.float64))
        lo = b
    return out


def _weighted_nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NNLS of w * (x c - y) with columns scaled to unit norm (the solver's tolerance is then scale-free)."""
    xw = x * w[:, None]
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    return nnls(xw / scale, y * w) / scale


def robust_nnls(x: np.ndarray, y: np.ndarray, objective: str = "relative", robust: bool = True,
                iterations: int = 6, row_weights: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(coefficients, weighted squared error) of a non-negative fit of x c ~ y.

    objective: "relative" weighs each residual by 1/y (every row counts by its relative error), "sqrt" by
    1/sqrt(y), "absolute" by 1. robust: iteratively reweighted (Huber on the relative residual, threshold
    HUBER_REL), so a few rows hit by a host hiccup or a compile stall do not pull the fit.
    row_weights: an extra factor per row (source balancing, see fit_coefficients).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    rw = np.ones_like(y) if row_weights is None else np.asarray(row_weights, dtype=np.float64)
    base = {"relative": 1.0 / y, "sqrt": 1.0 / np.sqrt(y), "absolute": np.ones_like(y)}[objective] * rw
    w = base.copy()
    # Robust fits start from the relative fit: its residuals are bounded below by -1, so a few stalled steps
    # cannot pull it far, and the Huber weights then single them out.
    coef = _weighted_nnls(x, y, rw / y if robust else w)
    for _ in range(iterations if robust else 0):
        rel = np.abs(x @ coef - y) / y
        huber = np.where(rel <= HUBER_REL, 1.0, np.sqrt(HUBER_REL / np.maximum(rel, 1e-300)))
        new = _weighted_nnls(x, y, base * huber)
        done = np.allclose(new, coef, rtol=1e-6, atol=0.0)
        coef, w = new, base * huber
        if done:
            break
    return coef, float(np.sum((w * (x @ coef - y)) ** 2))


# Terms a joint fit leaves at 0. loop_seqs: a replay's batches are small (the calibration replay's held at most
# 17 sequences), where the loop's per-sequence host cost cannot be told apart from the forward's, and a joint
# fit put there what the small-batch decode kernels cost (28 us per sequence): +8 ms per step at 256 sequences,
# a 33% throughput error on nano-vllm's workload. Where the run rows keep their measured step duration, the
# loop terms are fitted on the host gap alone instead (fit_loop_terms), which the forward's cost cannot leak into.
UNFITTED = ("loop_seqs",)
LOOP_TERMS = ("loop_step", "loop_seqs")


def fit_loop_terms(steps) -> np.ndarray | None:
    """(loop_step, loop_seqs) fitted on the host gap between steps, or None when no row shows it.

    A real run's row (serving_loop 1) with `measured_duration_s` (experiments.step_tables) has a cycle
    time `duration_s` = the measured step (schedule + forward + sampling) + the gap to the next step
    (postprocess, finished requests, arrivals). The gap is host work only, so its per-sequence slope
    is measurable even from small batches: fitted on an H200 replay of <= 17 sequences it is ~2 us per
    sequence, and nano-vllm's batches of up to 256 show a slope of the same size (~1-2 us).
    Robust (Huber) absolute least squares."""
    if "measured_duration_s" not in steps:
        return None
    loop = serving_loop_flags(steps)
    measured = _col(steps, "measured_duration_s")
    seqs = _col(steps, "num_prefill_seqs") + _col(steps, "num_decode_seqs")
    rows = (loop == 1) & np.isfinite(measured) & (seqs > 0)
    if rows.sum() < 2:
        return None
    gap = np.maximum(np.asarray(steps["duration_s"], dtype=np.float64)[rows] - measured[rows], 0.0)
    x = np.column_stack([np.ones(int(rows.sum())), seqs[rows]])
    coef, _ = robust_nnls(x, np.maximum(gap, 1e-7), "absolute", True)
    return coef


# The host's share of a step where a device model prices the rest: launch, sampler sync and input copies per step,
# a prefill step's graph inputs, admissions and first-token work (eager_step: on the serving loop's rows the same
# column as loop_prefill_step, which stays 0), and the scheduler's block allocation and prefix hashing per prefill
# token (the loop terms come from the gap between steps, fit_loop_terms)
HOST_FIT_TERMS = ("step", "eager_step", "num_seqs", "loop_prefill_tokens", "loop_hit_step", "loop_hit_blocks",
                  "cold_step")


def fit_host_terms(steps, x: np.ndarray, device_s: np.ndarray) -> np.ndarray | None:
    """Coefficients in FEATURES order (0 outside HOST_FIT_TERMS and LOOP_TERMS) of the host's share of the serving
    loop's steps: a real run's synchronous rows (serving_loop 1, with measured_duration_s) less the device model's
    seconds (device_s) and the loop terms, robust absolute least squares; None when no such row has sequences.

    Fitted jointly with the device terms, the host terms took what the synchronous replays' ~1k-token prompts
    showed beyond the profile, and overlap scheduling priced the rest of a step (total minus device) as host
    work before its launch: an 8k-token prompt's 4.2 ms, where the engine took 2.9 (launch_host_s). Fitted on what
    the device model leaves, the host's cost per prefill token is its own (0.23 us on the H200, the
    launch-time slope) and the device model's shape cannot leak into it. Rows with block copies are left out
    (a swap's copies are device work, priced by the device model)."""
    loop_coef = fit_loop_terms(steps)
    if loop_coef is None:
        return None
    seqs = _col(steps, "num_prefill_seqs") + _col(steps, "num_decode_seqs")
    copies = copy_blocks(steps)
    rows = (serving_loop_flags(steps) == 1) & np.isfinite(_col(steps, "measured_duration_s")) & (seqs > 0) \
        & (copies == 0)
    if not rows.any():
        return None
    loop_cols = [FEATURES.index(name) for name in LOOP_TERMS]
    host_cols = [FEATURES.index(name) for name in HOST_FIT_TERMS]
    y = np.asarray(steps["duration_s"], dtype=np.float64) - device_s - x[:, loop_cols] @ loop_coef
    coef = np.zeros(len(FEATURES))
    coef[host_cols], _ = robust_nnls(x[rows][:, host_cols], np.maximum(y[rows], 1e-7), "absolute", True)
    coef[loop_cols] = loop_coef
    return coef


STEP_KINDS = ("decode", "prefill", "chunk", "mixed")


def step_kind_codes(steps) -> np.ndarray:
    """Each row's step kind (STEP_KINDS index): 0 decode (no prefill entry), 1 prefill entries alone of which one
    samples (a whole prompt or a last chunk), 2 prefill entries alone that sample nothing (intermediate chunks),
    3 mixed (prefill entries and decodes)."""
    npf, nd = _col(steps, "num_prefill_seqs"), _col(steps, "num_decode_seqs")
    return np.where(npf == 0, 0, np.where(nd > 0, 3, np.where(_col(steps, "num_prefill_samples") > 0, 1, 2)))


def source_weights(steps, run_share: float = 0.5, kind_floor: float = 0.0) -> np.ndarray:
    """Per-row weights giving the real runs' rows (serving_loop 1) run_share of the total weight and the profile
    rows (0) the rest (default: equal shares).

    A replay has ~100x the rows of a profile grid; unweighted, it decides every shared coefficient alone and
    the grid's large batches (a replay at a few req/s never reaches them) stop counting. A `fit_group` column
    (0 profile, 1 run), where present, names the sources instead of serving_loop: a device-time table has no
    serving-loop share in any row (experiments.calibrate.device_table).

    kind_floor: each step kind of the runs' rows (step_kind_codes) gets at least this share of the runs' weight,
    the others theirs in proportion to their rows. A replay holds a kind it rarely makes in a few rows among
    thousands of decodes (on one H100 34 intermediate chunks alone among 10k rows), so without a floor the fit
    trades that kind's price for the common ones' last tenth of a percent (experiments.calibrate:
    DEVICE_KIND_FLOOR)."""
    if not 0.0 < run_share < 1.0:
        raise ValueError(f"run_share must be in (0, 1), got {run_share}")
    if not 0.0 <= kind_floor < 1.0 / len(STEP_KINDS):
        raise ValueError(f"kind_floor must be in [0, {1 / len(STEP_KINDS):g}), got {kind_floor}")
    loop = _col(steps, "fit_group") if "fit_group" in steps else serving_loop_flags(steps)
    n_run, n_prof = float(loop.sum()), float(len(loop) - loop.sum())
    if n_run == 0 or n_prof == 0:
        w = np.ones(len(loop))
    else:
        w = np.where(loop == 1, run_share * len(loop) / n_run, (1 - run_share) * len(loop) / n_prof)
    run = loop == 1
    if kind_floor > 0 and run.any():
        kind = step_kind_codes(steps)[run].astype(np.int64)
        counts = np.bincount(kind, minlength=len(STEP_KINDS))             # [kinds] run rows of each kind
        shares = np.where(counts > 0, np.maximum(counts / n_run, kind_floor), 0.0)
        w[run] = (w[run].sum() * shares / shares.sum() / np.maximum(counts, 1))[kind]
    return w


class Fit(NamedTuple):
    coefficients: np.ndarray        # seconds per unit, in FEATURES order
    knee: int | None
    profile_offset_s: float | None  # the profile harness's own cost per step (not a model term); None: not fitted
    profile_offset_per_key_s: float | None          # ... and per key its prefill entries read (prefill_context_sum)
    mixed_walk_ratio: float = 1.0                   # mixed_decode_tail_keys' walk ratio (chosen by training error)
    walk_ratio_errors: tuple = ()                   # ((ratio, weighted training error), ...) of the ratio search


def profile_offset_columns(steps) -> np.ndarray | None:
    """[rows, 4]: +1 and -1 on profile rows that run something, then + and - their prefill_context_sum (keys their
    prefill entries read), or None unless the table mixes profile and run rows.

    A profile times execute() alone in a tight loop, at another moment than the calibration replay, whose
    steps are timed inside the serving loop. The same shapes differ by a constant between the two: +0.04 ms
    and -0.13 ms per step in two H200 runs (decode steps of 4-8 sequences: 1.97 ms in one profile, 1.86 ms
    in the replay after it). Left to the shared `step` term, that offset made the calibrated simulator
    2-3% slow on every replay step. A signed nuisance term (a +/- column pair, as NNLS needs) on the
    profile rows takes it, so `step` is the serving loop's; the profile still fixes every slope (batch
    size, context, prefill tokens, swaps). It is not a model term: the simulator prices steps as the
    serving loop runs them. Without run rows it would duplicate `step`.

    The per-key pair: the profile launches each shape after an idle half-cycle (its duty cycle), the serving
    loop runs steps back to back. On the H200 the profile's 512-token prefills on 1.5-8k keys took 1.5-3% longer
    than the replays' back-to-back chunks of the same shape (4.74 ms against 4.65 at 3,584 keys); most of that
    is the LM head and sampler the profile's prompts run and intermediate chunks skip (lm_head_step, 0.1-0.15 ms),
    what is left grows with the keys: 5.3 ns a key goes to the pair (8.2 before lm_head_step). Without the pair
    the same fit had 28 of 30 cells within 3% instead of 29, the shared-prefix sarathi cell 4.7% instead of 3.0%
    (benchmarks/results/generalize/h200_1204/)."""
    loop = _col(steps, "fit_group") if "fit_group" in steps else serving_loop_flags(steps)
    if loop.all() or not loop.any():
        return None
    seqs = _col(steps, "num_prefill_seqs") + _col(steps, "num_decode_seqs")
    runs = ((seqs > 0) | (_col(steps, "num_swap_blocks") > 0)).astype(np.float64)
    h = (1.0 - loop) * runs
    keys = (1.0 - loop) * _col(steps, "prefill_context_sum")
    return np.column_stack([h, -h, keys, -keys])


def profile_mixed_offset_columns(steps, offset_cols: np.ndarray | None) -> np.ndarray | None:
    """[rows, 2]: +1 and -1 on the profile rows (offset_cols', profile_offset_columns) with prefill entries and
    decodes, or None without offset_cols: a level of their own for the profile's mixed shapes in the walk ratio's
    fits (fit_coefficients), which the final fit does not have.

    On an H100 (machine N) the profile's chunks beside 1-3 decodes sat 2-7% above the fit at every ratio of the
    decode's context to the chunk's, 0.7 included, where the walk costs nothing. At the common level a lower ratio
    took part of that offset: the ratio's fits chose 0.8 (weighted errors 0.9: 66.8, 0.85: 65.8, 0.8: 65.5); with
    the level their own, 0.9 (62.8, 63.1, 64.1), the ratio the families' replays need (at 0.85 prefill-heavy
    sarathi cells miss by 4-5%). In the final fit the level stays common: given to it there, prefill-heavy sarathi
    steps came out 2.1% fast (benchmarks/results/generalize/h100_1206n/README.md)."""
    if offset_cols is None:
        return None
    m = offset_cols[:, 0] * ((_col(steps, "num_prefill_seqs") > 0) & (_col(steps, "num_decode_seqs") > 0))
    return np.column_stack([m, -m])


def fit_coefficients(steps, knee_candidates: Sequence[int | None] = KNEE_CANDIDATES, block_size: int = 16,
                     objective: str = "relative", robust: bool = True,
                     single_split_min_seqs: int | None = None, run_share: float = 0.5,
                     prefill_span_pairs: float | None = None, prefill_graph_max_tokens: int | None = None,
                     prefill_span_grid: PrefillSpanGrid | None = None,
                     mixed_walk_ratios: Sequence[float] = (1.0,), kind_floor: float = 0.0,
                     mixed_walk_makespan: bool = False) -> Fit:
    """Coefficients in FEATURES order, the knee with the least weighted error over the knee candidates,
    and the profile offset (profile_offset_columns) where the table mixes profile rows and run rows that
    keep their measured duration (the loop terms are then known; a joint fit's loop_step takes the offset),
    or a device-time table (a `fit_group` column) that mixes them: the runs' device seconds set the level.
    run_share: the real runs' share of the row weights, kind_floor each step kind's least share of it
    (source_weights). mixed_walk_makespan: see mixed_decode_tail_keys.

    steps: a table with STEP_TABLE_COLUMNS whose duration_s are all finite and > 0 (the caller filters).
    """
    y = np.asarray(steps["duration_s"], dtype=np.float64)
    eager_tokens = np.where(_col(steps, "num_prefill_seqs") > 0,
                            _col(steps, "num_prefill_tokens") + _col(steps, "num_decode_seqs"), 0.0)
    weights = source_weights(steps, run_share, kind_floor)
    loop_coef = fit_loop_terms(steps)
    loop_cols = [FEATURES.index(name) for name in LOOP_TERMS]
    target, row_weights, dropped = y, weights, [FEATURES.index(name) for name in UNFITTED]
    if loop_coef is not None:
        # The loop terms are known: fit the rest on what they leave (the relative weights stay those of y).
        rest = y - design_matrix(steps, None, block_size)[:, loop_cols] @ loop_coef
        target, row_weights, dropped = np.maximum(rest, 1e-3 * y), weights * rest / y, loop_cols
    if not (step_kind_codes(steps) == STEP_KINDS.index("chunk")).any():
        # every step samples (no intermediate chunk): lm_head_step is step's twin, and step keeps it all
        dropped = [*dropped, FEATURES.index("lm_head_step")]
    # Without the measured step, loop_step is fitted jointly and already takes the run-minus-profile difference;
    # a device-time table has no loop share, so the offset is fitted there too.
    offset_cols = profile_offset_columns(steps) if (loop_coef is not None or "fit_group" in steps) else None
    mixed_offset_cols = profile_mixed_offset_columns(steps, offset_cols)
    nf = len(FEATURES)

    # The riding keys' two pieces where no row has such keys (past the knee): a pure decode's price, set after the fit
    _, rest = riding_decode_keys(steps, prefill_graph_max_tokens)
    unsupported = [FEATURES.index(f) for f, has in (("mixed_decode_rest_keys", (rest > 0).any()),
                                                    ("mixed_decode_rest_over", (rest > RIDING_REST_KNEE_KEYS).any()))
                   if not has]
    dropped = [*dropped, *unsupported]
    # The walk ratio is chosen by fits without the chunks carrying more than WALK_RATIO_MAX_RIDING decodes (their
    # longest decode walks far past a fresh chunk's context beside many others, a critical path the ratio does not
    # describe) and without the riding keys' two pieces (a cheap first piece and a lower ratio explain the same
    # 1-8-decode chunks: fitted jointly the ratio went 0.9 -> 0.8 on an H100 and every 1-2-decode chunk then paid
    # 1.4-2.8% more, h100_1206n/README.md), with the profile's mixed shapes at a level of their own
    # (profile_mixed_offset_columns); the coefficients then come from all rows at that ratio
    i_dctx, i_rest, i_over = (FEATURES.index(f) for f in ("decode_context_sum", "mixed_decode_rest_keys",
                                                          "mixed_decode_rest_over"))
    ratio_rows = ~((step_kind_codes(steps) == STEP_KINDS.index("mixed"))
                   & (_col(steps, "num_decode_seqs") > WALK_RATIO_MAX_RIDING))

    def fit(knee, ratio=1.0, rows=None):
        x = design_matrix(steps, knee, block_size, single_split_min_seqs, prefill_span_pairs, prefill_graph_max_tokens,
                          prefill_span_grid, ratio, mixed_walk_makespan)
        x[:, dropped] = 0.0
        if offset_cols is not None:
            x = np.column_stack([x, offset_cols])
        if rows is None:
            coef, err = robust_nnls(x, target, objective, robust, row_weights=row_weights)
        else:           # the ratio's fits: riding keys at a decode's price (the pieces would trade keys with the ratio)
            x[:, i_dctx] += x[:, i_rest] + x[:, i_over]
            x[:, [i_rest, i_over]] = 0.0
            if mixed_offset_cols is not None:        # the profile's mixed shapes at a level of their own
                x = np.column_stack([x, mixed_offset_cols])
            coef, err = robust_nnls(x[rows], target[rows], objective, robust, row_weights=row_weights[rows])
        offset = (float(coef[nf] - coef[nf + 1]), float(coef[nf + 2] - coef[nf + 3])) if offset_cols is not None \
            else (None, None)
        coef = coef[:nf]
        if loop_coef is not None:
            coef[loop_cols] = loop_coef
        return coef, err, offset
    # the knee at the first walk ratio, then the ratio at that knee (the two bend different rows: tokens past the
    # knee in eager steps, a riding decode's keys in mixed ones), so a few more fits rather than their product
    best = None
    ratios = tuple(mixed_walk_ratios) or (1.0,)
    for knee in knee_candidates:
        if knee is not None and knee >= eager_tokens.max(initial=0.0):
            continue                      # no row above the knee: the hinge would be an all-zero column
        coef, err, offset = fit(knee, ratios[0])
        if best is None or err < best[0] * (1 - 1e-9):
            best = (err, knee, coef, offset, ratios[0])
    if best is None:
        coef, err, offset = fit(None, ratios[0])
        best = (err, None, coef, offset, ratios[0])
    errors = [(float(ratios[0]), float(best[0]))]
    if len(ratios) > 1:
        errors = [(float(r), fit(best[1], r, ratio_rows)[1]) for r in ratios]
        chosen = min(errors, key=lambda e: e[1] * (1 + 1e-9 * ratios.index(e[0])))[0]    # ties: the earlier
        if chosen != ratios[0] or not ratio_rows.all():
            coef, err, offset = fit(best[1], chosen)
            best = (err, best[1], coef, offset, chosen)
    _, knee, coef, offset, ratio = best
    if knee is None:
        coef[FEATURES.index("tokens_over_knee")] = 0.0
    for i in unsupported:
        coef[i] = coef[FEATURES.index("decode_context_sum")]
    return Fit(canonical_step_base(coef), knee, *offset, float(ratio), tuple(errors) if len(ratios) > 1 else ())


def canonical_step_base(coef: np.ndarray) -> np.ndarray:
    """coef with the base every forward step shares moved into `step`. A forward step has prefill entries
    (eager_step) or is pure decode (decode_step), so step, eager_step and decode_step price two bases with three
    coefficients: the fit's choice among the equal-priced ones is made unique (the smaller of eager_step and
    decode_step 0). decode_step exists so a prefill step's base can sit below a decode step's: the H200's
    prefills of 16-256 tokens took 1.27-2.25 ms, below a 90-sequence decode step's base (prefill_small_tokens)."""
    coef = np.array(coef, dtype=np.float64)
    i_step, i_eager, i_dec = (FEATURES.index(f) for f in ("step", "eager_step", "decode_step"))
    shift = min(coef[i_eager], coef[i_dec])
    coef[i_step] += shift
    coef[i_eager] -= shift
    coef[i_dec] -= shift
    return coef


MIN_LAUNCH_ROWS = 20     # prefill-only rows with a measured launch (launch_host_s) needed to split the host's share


def prefill_host_after_share(tables, host_prefill_token_s: float) -> float | None:
    """The share of the host's seconds per prefill token (host_prefill_token_s, fitted on synchronous steps)
    spent after the step's tokens (CalibratedCostModel's prefill_host_after_share): 1 - the slope in prefill
    tokens of the host's seconds before the launch (launch_host_s: schedule to launch, measured with overlap
    scheduling) on the tables' prefill-only rows without block copies, over host_prefill_token_s, in [0, 1].
    None with fewer than MIN_LAUNCH_ROWS such rows or no host cost per token.

    The synchronous steps fix the host's total per prefill token, not when it is spent: the engine prepares a
    prompt's inputs before the launch and hashes and publishes its full blocks in the prefix cache in the
    postprocess after its tokens, where the next step's device time hides it. On the H200 calibration replays
    the launch took 0.20 us a prefill token of the 0.46 us the synchronous steps show; priced all before the
    launch, a fresh 8k-token prompt scheduled on an idle device waited 4.5 ms for its launch where the
    replays show 2.3-2.5 ms beyond its device seconds (benchmarks/results/generalize/h200_1203/)."""
    if not host_prefill_token_s > 0:
        return None
    xs, ys = [], []
    for t in tables:
        if "launch_host_s" not in t:
            continue
        launch = _col(t, "launch_host_s")
        rows = (_col(t, "num_prefill_seqs") > 0) & (_col(t, "num_decode_seqs") == 0) & (copy_blocks(t) == 0) \
            & np.isfinite(launch) & (launch > 0)
        # a prefix hit's admission (lookups over the whole prompt) is host work before the launch, not per token
        hits = np.nan_to_num(_col(t, "num_gpu_hit_blocks", 0.0))[rows]
        xs.append(np.column_stack([np.ones(int(rows.sum())), _col(t, "num_prefill_seqs")[rows],
                                   _col(t, "num_prefill_tokens")[rows], hits > 0, hits]))
        ys.append(launch[rows])
    if not xs or sum(len(y) for y in ys) < MIN_LAUNCH_ROWS:
        return None
    coef, _ = robust_nnls(np.concatenate(xs), np.concatenate(ys), "absolute", True)
    return float(np.clip(1.0 - coef[2] / host_prefill_token_s, 0.0, 1.0))
