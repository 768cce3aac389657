"""Triton kernel: temperature sampling (exponential race) and greedy argmax in one pass over the logits.

Sampling index i with probability softmax(l / T)_i is argmax_i(p_i / E_i) for E_i ~ Exp(1); taking
logs, argmax_i(l_i / T - log E_i): the softmax normalisation is a per-row constant and drops out, so
no max or sum pass is needed. Rows with T == 0 take argmax_i(l_i) (greedy). Ties go to the lowest
index, as torch.argmax does.

Grid (rows, splits): program (r, s) scans the vocabulary slice [s * chunk, (s + 1) * chunk) of row r
in BLOCK-wide tiles, keeping a running best per lane, and writes the slice's best score and index;
the host merges the splits (a [rows, splits] argmax). Splitting keeps all SMs busy at small batches;
at 256 rows the kernel reads the logits (bf16) and the noise (f32) once, about 230 MB for Qwen3's
151,936-token vocabulary. engine/layers/sampler.py holds the torch form (race_sample_reference).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit(do_not_specialize=["chunk", "num_splits"])       # vary with the batch
def _race_argmax_kernel(
    logits_ptr,                # [S, V] any float dtype
    noise_ptr,                 # [S, V] f32 ~ Exp(1) (unread on greedy rows)
    temps_ptr,                 # [S] f32, 0 = greedy
    best_val_ptr,              # [S, num_splits] f32
    best_idx_ptr,              # [S, num_splits] int64
    V, chunk, num_splits,
    stride_l, stride_n,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.load(temps_ptr + row)
    sampled = t != 0.0
    t_safe = tl.where(sampled, t, 1.0)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, V)
    noise_hi = tl.where(sampled, hi, lo)                # greedy rows read no noise
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 0, tl.int64) + lo        # a slice of only -inf answers its first index
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < hi
        x = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.load(noise_ptr + row * stride_n + offs, mask=offs < noise_hi, other=1.0)
        # 1e-10: the sampler's NOISE_FLOOR
        score = tl.where(sampled, x / t_safe - tl.log(tl.maximum(e, 1e-10)), x)
        score = tl.where(mask, score, float("-inf"))
        # strict >: a lane keeps its first (lowest) index among equal scores
        better = score > best
        best = tl.where(better, score, best)
        best_i = tl.where(better, offs.to(tl.int64), best_i)
    top = tl.max(best, axis=0)
    top_i = tl.min(tl.where(best == top, best_i, V), axis=0)       # lowest index holding the top score
    tl.store(best_val_ptr + row * num_splits + split, top)
    tl.store(best_idx_ptr + row * num_splits + split, top_i)


def race_sample(logits: Tensor, temperatures: Tensor, noise: Tensor, block: int = 2048,
                min_programs: int = 512) -> Tensor:
    """Token per row: argmax(logits / T - log noise), or argmax(logits) where T == 0.

    logits [S, V] (bf16/f16/f32, last dim contiguous), temperatures [S] f32, noise [S, V] f32 -> [S] int64.
    """
    S, V = logits.shape
    if noise.shape != logits.shape or temperatures.shape != (S,):
        raise ValueError(f"race_sample: logits {tuple(logits.shape)}, noise {tuple(noise.shape)} and "
                         f"temperatures {tuple(temperatures.shape)} must be [S, V], [S, V], [S]")
    if logits.stride(-1) != 1 or noise.stride(-1) != 1:
        raise ValueError("race_sample: logits and noise need a contiguous last dimension")
    if S == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    # enough programs to fill the GPU at small batches, never slices narrower than one tile
    splits = max(1, min(triton.cdiv(min_programs, S), triton.cdiv(V, block)))
    chunk = triton.cdiv(triton.cdiv(V, splits), block) * block
    splits = triton.cdiv(V, chunk)
    best_val = torch.empty(S, splits, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(S, splits, dtype=torch.int64, device=logits.device)
    _race_argmax_kernel[(S, splits)](
        logits, noise, temperatures.to(torch.float32), best_val, best_idx,
        V, chunk, splits, logits.stride(0), noise.stride(0), BLOCK=block, num_warps=8)
    # splits are in vocabulary order and argmax keeps the first maximum: ties still go to the lowest index
    return best_idx.gather(1, best_val.argmax(dim=1, keepdim=True)).squeeze(1)

