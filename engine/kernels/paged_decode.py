"""Triton kernels: paged decode attention with split-K and GQA packing.

Each decode entry has one query token per q head and `context_len` cached keys (including its own).
Pass 1 (_decode_split_kernel), grid (num_seqs, num_kv_heads, num_splits): program (b, h, s) loads
the GROUP query heads that share kv head h as one [BLOCK_G, D] tile (so each KV page is read once
per kv head, not once per q head) and runs the online softmax over keys
[s * partition, (s + 1) * partition) of sequence b, writing the normalised partial output and its
log-sum-exp. Pass 2 (_decode_reduce_kernel), grid (num_seqs, num_q_heads), merges the splits.
With a single split pass 1 writes the output directly and pass 2 is skipped.

The number of splits is chosen on the host from the batch size alone (no device sync, fixed for a
batch size so CUDA graphs can capture it): about 8 programs per SM when the batch gives fewer than 2.
Each sequence's keys are partitioned on the device by its own context: split s of sequence b
reads [s * P_b, (s + 1) * P_b) with P_b = ctx_b / num_splits rounded up to a tile (at least
MIN_PARTITION keys), so the work and the number of programs do not grow with the block-table width
(max_model_len in a CUDA graph). Partitions sized from the width made a step of 24 short decodes
cost 3.5 ms at max_model_len 16,384 against 2.5 ms at 8,192: most programs were empty splits.
Measured on an H200 (benchmarks/results/decode_partition_h200.json, 28 calls per CUDA graph): over
88 batches of 1-256 sequences, uniform, ragged and long-tail contexts, at widths 8,192 and 16,384, this
rule's time is 1.11x the best variant's (geometric mean) against 1.27x for width partitions (worst
3.6x) and 1.16x for 2 programs per SM. Its worst case, 2.3x, is a long tail in a batch of >= 33
sequences (one program per sequence and KV head), where splitting too would cost uniform batches.

Variants (engine/kernels/decode_variants.py, timed by benchmarks/decode_tune.py) change the tiles, the
launch options, the kv heads per program, the grid order, the inner loop (paged_decode_tile.py) and the
split rule; the card's table (decode_variants.table_for_device) picks one per batch size, by default the kernel
described above.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from engine.kernels.decode_variants import DecodeVariant, variant_for_batch
from engine.kernels.paged_attention_tile import contiguous_q_and_out, dot_precision, paged_attention_tile_loop
from engine.kernels.paged_decode_tile import decode_tile_loop, decode_tile_loop_fma

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["partition", "min_partition", "num_splits", "stride_tb"])   # vary with the batch
def _decode_split_kernel(
    q_ptr,                         # [B, Hq, D]
    k_cache_ptr, v_cache_ptr,      # [num_blocks, BLOCK_SIZE, Hkv, D]
    tables_ptr,                    # [B, max_blocks] int32
    lens_ptr,                      # [B] int32, keys per entry
    order_ptr,                     # [B] int32 entries longest first (read when LONGEST_FIRST)
    out_ptr,                       # [B, Hq, D]                 (written when SINGLE_SPLIT, or DIRECT_SINGLE)
    mid_o_ptr,                     # [B, Hq, num_splits, D] f32 (written otherwise)
    mid_lse_ptr,                   # [B, Hq, num_splits] f32, log2-sum-exp of each split
    qk_scale, partition, min_partition, num_splits,   # partition > 0: fixed keys per split; 0: per context
    stride_qb, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_tb,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_HEADS: tl.constexpr,        # kv heads per program (engine/kernels/decode_variants.py)
    USE_DOT: tl.constexpr,         # False: paged_decode_tile.decode_tile_loop_fma (KV_HEADS 1)
    MASK_TAIL_ONLY: tl.constexpr,  # whole tiles unmasked, then one masked tile
    HEADS_FASTEST: tl.constexpr,   # grid (head programs, B, splits) instead of (B, head programs, splits)
    DIRECT_SINGLE: tl.constexpr,   # several splits: a context that fits in one writes out directly
    LONGEST_FIRST: tl.constexpr,   # program b serves entry order[b]: the longest contexts start first
):
    if HEADS_FASTEST:
        head_prog = tl.program_id(0)
        b = tl.program_id(1)
        num_head_progs = tl.num_programs(0)
    else:
        b = tl.program_id(0)
        head_prog = tl.program_id(1)
        num_head_progs = tl.num_programs(1)
    split = tl.program_id(2)
    if LONGEST_FIRST:
        b = tl.load(order_ptr + b)
    ctx = tl.load(lens_ptr + b)
    part = _split_keys(ctx, partition, min_partition, num_splits, BLOCK_N)
    start = split * part
    end = tl.minimum(start + part, ctx)

    ROWS: tl.constexpr = GROUP * KV_HEADS
    offs_g = tl.arange(0, BLOCK_G)
    gmask = offs_g < ROWS
    heads = head_prog * ROWS + offs_g                                           # [BLOCK_G]
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    qmask = gmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=qmask, other=0.0)
    q = q.to(k_cache_ptr.dtype.element_ty)                                      # [BLOCK_G, BLOCK_D]

    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    table = tables_ptr + b * stride_tb
    head_off = head_prog * KV_HEADS * stride_ch
    if KV_HEADS == 1 and USE_DOT and not MASK_TAIL_ONLY:     # the default: the loop shared with prefill
        q_pos = tl.zeros([BLOCK_G], dtype=tl.int32) + ctx - 1                  # unused: not causal
        acc, m_i, l_i = paged_attention_tile_loop(
            acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, table,
            head_off, stride_cb, stride_cs, offs_d, dmask, start, end, qk_scale,
            BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, CAUSAL=False, DOT_PRECISION=DOT_PRECISION)
    else:
        # whole tiles [start, full_end) (unmasked when MASK_TAIL_ONLY), then the rest masked
        if MASK_TAIL_ONLY:
            full_end = start + (tl.maximum(end - start, 0) // BLOCK_N) * BLOCK_N
        else:
            full_end = start
        if USE_DOT:
            row_head = offs_g // GROUP
            acc, m_i, l_i = decode_tile_loop(
                acc, m_i, l_i, q, row_head, k_cache_ptr, v_cache_ptr, table, head_off,
                stride_cb, stride_cs, stride_ch, offs_d, dmask, start, full_end, qk_scale,
                BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, KV_HEADS=KV_HEADS, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                MASKED=False, DOT_PRECISION=DOT_PRECISION)
            acc, m_i, l_i = decode_tile_loop(
                acc, m_i, l_i, q, row_head, k_cache_ptr, v_cache_ptr, table, head_off,
                stride_cb, stride_cs, stride_ch, offs_d, dmask, full_end, end, qk_scale,
                BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, KV_HEADS=KV_HEADS, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                MASKED=True, DOT_PRECISION=DOT_PRECISION)
        else:
            qf = q.to(tl.float32)
            acc, m_i, l_i = decode_tile_loop_fma(
                acc, m_i, l_i, qf, k_cache_ptr, v_cache_ptr, table, head_off, stride_cb, stride_cs,
                offs_d, dmask, start, full_end, qk_scale,
                BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, MASKED=False)
            acc, m_i, l_i = decode_tile_loop_fma(
                acc, m_i, l_i, qf, k_cache_ptr, v_cache_ptr, table, head_off, stride_cb, stride_cs,
                offs_d, dmask, full_end, end, qk_scale,
                BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, MASKED=True)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)      # empty split / empty context -> zeros, not NaN
    o = acc / l_safe[:, None]
    out_off = b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    if SINGLE_SPLIT:
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=qmask)
    else:
        row = (b * ROWS * num_head_progs + heads) * num_splits + split          # [BLOCK_G] into [B, Hq, S]
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        if DIRECT_SINGLE:
            # per row (a scalar condition in a mask trips the interpreter): split 0 holds every key, or none
            zero = tl.zeros([BLOCK_G], dtype=tl.int32)
            shared = (zero + tl.cdiv(ctx, part)) > 1
            direct = ~shared & ((zero + start) == 0)
            tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=qmask & direct[:, None])
            tl.store(mid_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=qmask & shared[:, None])
            tl.store(mid_lse_ptr + row, lse, mask=gmask & shared)
        else:
            tl.store(mid_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=qmask)
            tl.store(mid_lse_ptr + row, lse, mask=gmask)


@triton.jit
def _split_keys(ctx, partition, min_partition, num_splits, BLOCK_N: tl.constexpr):
    """Keys per split of a context of ctx keys: `partition` when fixed (> 0), else ctx / num_splits rounded
    up to a multiple of BLOCK_N, at least min_partition (a multiple of BLOCK_N)."""
    per_ctx = tl.maximum(tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N, min_partition)
    return tl.where(partition > 0, partition, per_ctx)


@triton.jit(do_not_specialize=["partition", "min_partition", "num_splits"])
def _decode_reduce_kernel(
    mid_o_ptr,                     # [B, Hq, num_splits, D] f32
    mid_lse_ptr,                   # [B, Hq, num_splits] f32
    lens_ptr,                      # [B] int32
    out_ptr,                       # [B, Hq, D]
    partition, min_partition, num_splits,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,         # next power of two >= num_splits
    BLOCK_N: tl.constexpr,
    DIRECT_SINGLE: tl.constexpr,   # rows whose context fit in one split were written by pass 1: skip them
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    ctx = tl.load(lens_ptr + b)
    part = _split_keys(ctx, partition, min_partition, num_splits, BLOCK_N)
    used = tl.minimum(tl.cdiv(ctx, part), num_splits)                          # splits that saw keys
    offs_s = tl.arange(0, BLOCK_S)
    smask = offs_s < used
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    if DIRECT_SINGLE:       # per element (a scalar condition in a mask trips the interpreter)
        smask = smask & ((offs_s * 0 + used) > 1)
        dmask = dmask & ((offs_d * 0 + used) > 1)
    row = (b * tl.num_programs(1) + head) * num_splits + offs_s                 # [BLOCK_S]
    lse = tl.load(mid_lse_ptr + row, mask=smask, other=float("-inf"))
    g_max = tl.max(lse, 0)
    g_max = tl.where(g_max == float("-inf"), 0.0, g_max)
    w = tl.exp2(lse - g_max)                                                    # [BLOCK_S]; 0 for unused splits
    o = tl.load(mid_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                mask=smask[:, None] & dmask[None, :], other=0.0)                # [BLOCK_S, BLOCK_D]
    denom = tl.sum(w, 0)
    denom = tl.where(denom > 0.0, denom, 1.0)
    res = tl.sum(w[:, None] * o, 0) / denom                                     # [BLOCK_D]
    tl.store(out_ptr + b * stride_ob + head * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty), mask=dmask)


@functools.lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


MAX_SPLITS = 64     # bounds the reduce pass's tile and the [B, Hq, splits, D] float32 scratch
MIN_PARTITION = DecodeVariant.min_partition  # 256 keys: a shorter split costs more in partial output than it saves
SPLIT_PROGRAMS_PER_SM = 8   # small batches: ragged and long-tail contexts need the spare programs


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, block_n: int,
                      device: torch.device, min_partition: int = MIN_PARTITION) -> int:
    """Splits per sequence. One split when num_seqs * num_kv_heads already gives >= 2 programs per SM
    (measured fastest on an H200 for full batches). Otherwise enough splits for SPLIT_PROGRAMS_PER_SM
    programs per SM, at most MAX_SPLITS and no more than max_context (the block-table width in keys, which bounds every
    context) holds partitions of min_partition keys. The kernel partitions each sequence by its own
    context, so splits past a short context's end are few and exit at once."""
    programs = max(num_seqs * num_kv_heads, 1)
    sms = _num_sms(device)
    if programs >= 2 * sms:
        return 1
    wanted = math.ceil(SPLIT_PROGRAMS_PER_SM * sms / programs)
    fits = math.ceil(max_context / max(min_partition, block_n))
    return max(1, min(wanted, fits, MAX_SPLITS))


def program_kv_heads(var: DecodeVariant, num_kv_heads: int) -> int:
    """kv heads per program: the variant's, or 1 when it does not divide the model's kv heads."""
    return var.kv_heads_per_program if num_kv_heads % var.kv_heads_per_program == 0 else 1


def split_kernel_constexprs(var: DecodeVariant, num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                            block_n: int, single: bool, direct: bool, precision: str) -> dict:
    """_decode_split_kernel's compile-time arguments for a variant and a model's attention shape."""
    kv_heads = program_kv_heads(var, num_kv_heads)
    group = num_q_heads // num_kv_heads
    rows = triton.next_power_of_2(group * kv_heads)
    # tl.dot needs >= 16 rows; the multiply-add path takes the rows as they are (a power of two)
    return dict(GROUP=group, BLOCK_G=max(16, rows) if var.use_dot else max(2, rows),
                HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size, BLOCK_N=block_n,
                SINGLE_SPLIT=single, DOT_PRECISION=precision, KV_HEADS=kv_heads, USE_DOT=var.use_dot,
                MASK_TAIL_ONLY=var.mask_tail_only, HEADS_FASTEST=var.heads_fastest, DIRECT_SINGLE=direct,
                LONGEST_FIRST=var.longest_first)


def paged_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, context_lens: Tensor,
                           block_tables: Tensor, scale: float, out: Tensor | None = None,
                           num_splits: int | None = None, block_n: int | None = None,
                           num_warps: int | None = None, num_stages: int | None = None,
                           fixed_partition: bool = False, min_partition: int | None = None,
                           variant: DecodeVariant | None = None) -> Tensor:
    """q [B, Hq, D], caches [num_blocks, bs, Hkv, D], context_lens [B] int32 (0 -> zero output),
    block_tables [B, max_blocks] int32 -> out [B, Hq, D] in q's dtype.

    variant (engine/kernels/decode_variants.py): tiles, launch options, code paths and split rule; None: the
    one the card's decode table gives this batch size (decode_variants.table_for_device). num_splits,
    block_n, num_warps, num_stages and min_partition, when given, override the variant's field of that name.
    num_splits None picks it from the batch and the block-table width (max_blocks * bs bounds every
    context); num_stages None: 3 for one split, 2 otherwise (measured on an H200, bf16, head_dim 128).
    fixed_partition: partitions of width / num_splits keys for every sequence (the earlier scheme, kept
    for benchmarks/decode_splits.py to time against) instead of each context / num_splits, with at least
    min_partition keys (rounded up to block_n) per split.
    """
    B, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    q, out = contiguous_q_and_out(q, out)
    if B == 0:
        return out
    var = variant_for_batch(B, device_name=_device_name(q.device)) if variant is None else variant
    block_n = var.block_n if block_n is None else block_n
    num_warps = var.num_warps if num_warps is None else num_warps
    num_stages = var.num_stages if num_stages is None else num_stages
    num_splits = var.num_splits if num_splits is None else num_splits
    min_partition = var.min_partition if min_partition is None else min_partition
    head_progs = num_kv_heads // program_kv_heads(var, num_kv_heads)
    max_context = max(block_tables.shape[1] * block_size, 1)
    if num_splits is None:
        num_splits = choose_num_splits(B, head_progs, max_context, block_n, q.device, min_partition)
    partition = 0
    if fixed_partition:
        # a multiple of block_n so every split starts on a tile boundary
        partition = triton.cdiv(triton.cdiv(max_context, num_splits), block_n) * block_n
        num_splits = triton.cdiv(max_context, partition)
    min_partition = triton.cdiv(max(min_partition, 1), block_n) * block_n
    block_d = triton.next_power_of_2(head_dim)
    single = num_splits == 1
    direct = var.direct_single and not single and not fixed_partition
    if num_stages is None:
        num_stages = 3 if single else 2
    if single:
        mid_o = mid_lse = out    # unused placeholders
    else:
        mid_o = torch.empty(B, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(B, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    grid = (head_progs, B, num_splits) if var.heads_fastest else (B, head_progs, num_splits)
    # longest first: a device-side sort per call (no host sync, so a CUDA graph can capture it)
    order = torch.argsort(context_lens, descending=True).to(torch.int32) if var.longest_first else context_lens
    _decode_split_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens, order, out, mid_o, mid_lse,
        scale * LOG2E, partition, min_partition, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        **split_kernel_constexprs(var, num_q_heads, num_kv_heads, head_dim, block_size, block_n, single, direct,
                                  dot_precision(k_cache)),
        num_warps=num_warps, num_stages=num_stages,
    )
    if not single:
        _decode_reduce_kernel[(B, num_q_heads)](
            mid_o, mid_lse, context_lens, out, partition, min_partition, num_splits,
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_N=block_n, DIRECT_SINGLE=direct, num_warps=4,
        )
    return out
