"""Triton kernel: overlap scheduling's placeholder input ids replaced by the sampled tokens they stand for.

With overlap scheduling an input id PLACEHOLDER_BASE + k (engine/core/in_flight.py) stands for row k of the
tokens the step launched before sampled on the device. One program per BLOCK ids reads them, gathers the
previous step's row for each placeholder and writes it back in place. The PyTorch form (where, index, clamp:
six small kernels) cost ~11 us of device time in every overlapped decode step on an H200, 0.5-0.7% of a step
of 8-32 sequences (benchmarks/decode_live_gap.py, `placeholder` against `profile`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from engine.core.in_flight import PLACEHOLDER_BASE

BLOCK = 256


@triton.jit(do_not_specialize=["num_ids", "num_prev"])      # both change with every step's batch
def _resolve_kernel(
    ids_ptr,                       # [T] int64, in place
    prev_ptr,                      # [num_prev] int64, the previous step's sampled tokens
    num_ids, num_prev,
    BASE: tl.constexpr,            # PLACEHOLDER_BASE
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_ids
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    ph = ids < 0
    rows = tl.minimum(tl.maximum(ids - BASE, 0), num_prev - 1)       # a real id's row is clamped and unused
    prev = tl.load(prev_ptr + rows, mask=mask & ph, other=0)
    tl.store(ids_ptr + offs, tl.where(ph, prev, ids), mask=mask & ph)


def resolve_placeholders(input_ids: Tensor, prev: Tensor) -> None:
    """input_ids [T] int64 (contiguous): each PLACEHOLDER_BASE + k becomes prev[k] (prev: [num_prev] int64,
    num_prev >= 1); real ids (>= 0) are left as they are. In place. The reference (and the CPU path):
    engine.model_runner.resolve_placeholders_torch."""
    n = input_ids.numel()
    if n == 0:
        return
    if prev.dtype != torch.int64 or input_ids.dtype != torch.int64:
        raise TypeError(f"resolve_placeholders needs int64 ids and tokens, got {input_ids.dtype} / {prev.dtype}")
    _resolve_kernel[(triton.cdiv(n, BLOCK),)](input_ids, prev, n, prev.numel(), BASE=PLACEHOLDER_BASE, BLOCK=BLOCK)
