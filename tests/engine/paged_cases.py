"""Random paged-attention problems with a dense reference, for the kernel tests and the GPU check.

make_paged_case builds one step: for each entry, keys/values of all its positions [0, context_len)
are drawn densely; the cached prefix [0, context_len - num_new) is written into a paged cache whose
blocks are handed out in shuffled order, and the remaining positions become this step's k, v.
Every cache element no sequence owns (including block 0, the block-table padding target) is
poisoned, so a kernel that reads outside a context or fails to write a slot produces NaN.
dense_attention recomputes the expected output per sequence without paging.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.layers.attention_metadata import AttentionMetadata


@dataclass
class PagedCase:
    q: Tensor                  # [num_tokens, Hq, D]  (prefill tokens, then decode tokens, then padding)
    k: Tensor                  # [num_tokens, Hkv, D] this step's new keys
    v: Tensor                  # [num_tokens, Hkv, D]
    k_cache: Tensor            # [num_blocks, block_size, Hkv, D] holding only the cached prefixes
    v_cache: Tensor
    meta: AttentionMetadata
    dense_k: list[Tensor]      # per entry [context_len, Hkv, D]: every key the entry attends to
    dense_v: list[Tensor]
    num_new_tokens: list[int]
    context_lens: list[int]
    scale: float
    num_pad_tokens: int        # trailing tokens with slot -1 (must not be stored; output rows zero)


def make_paged_case(num_new_tokens: list[int], context_lens: list[int], num_prefill_seqs: int,
                    num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", seed: int = 0,
                    num_pad_tokens: int = 0, spare_blocks: int = 3, poison: float = float("nan")) -> PagedCase:
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    n_blocks = [math.ceil(c / block_size) for c in context_lens]
    num_blocks = 1 + sum(n_blocks) + spare_blocks                 # block 0 stays unowned (padding target)
    ids = (torch.randperm(num_blocks - 1, generator=gen, device=device) + 1).tolist()
    tables, at = [], 0
    for nb in n_blocks:
        tables.append(ids[at:at + nb])
        at += nb
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), poison, dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, poison)
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    dense_k, dense_v, new_k, new_v = [], [], [], []
    for n, ctx, table in zip(num_new_tokens, context_lens, tables):
        kd, vd = randn(ctx, num_kv_heads, head_dim), randn(ctx, num_kv_heads, head_dim)
        dense_k.append(kd)
        dense_v.append(vd)
        pos = torch.arange(ctx - n, device=device)                 # the cached prefix
        slots = torch.tensor(table, dtype=torch.int64, device=device)[pos // block_size] * block_size + pos % block_size
        k_flat[slots] = kd[:ctx - n]
        v_flat[slots] = vd[:ctx - n]
        new_k.append(kd[ctx - n:])
        new_v.append(vd[ctx - n:])
    new_k.append(randn(num_pad_tokens, num_kv_heads, head_dim))
    new_v.append(randn(num_pad_tokens, num_kv_heads, head_dim))
    num_tokens = sum(num_new_tokens) + num_pad_tokens
    q = randn(num_tokens, num_q_heads, head_dim)
    meta = AttentionMetadata.build(num_new_tokens, context_lens, tables, num_prefill_seqs, block_size, device)
    if num_pad_tokens:
        pad = torch.full((num_pad_tokens,), -1, dtype=torch.int64, device=device)
        meta.slot_mapping = torch.cat([meta.slot_mapping, pad])
    return PagedCase(q=q, k=torch.cat(new_k), v=torch.cat(new_v), k_cache=k_cache, v_cache=v_cache, meta=meta,
                     dense_k=dense_k, dense_v=dense_v, num_new_tokens=list(num_new_tokens),
                     context_lens=list(context_lens), scale=head_dim ** -0.5, num_pad_tokens=num_pad_tokens)


def dense_attention(case: PagedCase, query_chunk: int = 1024) -> Tensor:
    """Expected output [num_tokens, Hq, D] in float32: explicit softmax per entry, no paging, no SDPA."""
    q = case.q.float()
    out = torch.zeros_like(q)
    group = q.shape[1] // case.dense_k[0].shape[1] if case.dense_k else 1
    start = 0
    for n, ctx, kd, vd in zip(case.num_new_tokens, case.context_lens, case.dense_k, case.dense_v):
        k = kd.float().repeat_interleave(group, dim=1).transpose(0, 1)       # [Hq, ctx, D]
        v = vd.float().repeat_interleave(group, dim=1).transpose(0, 1)
        key_pos = torch.arange(ctx, device=q.device)
        for c0 in range(0, n, query_chunk):
            c1 = min(c0 + query_chunk, n)
            qi = q[start + c0:start + c1].transpose(0, 1)                      # [Hq, c, D]
            scores = qi @ k.transpose(1, 2) * case.scale                        # [Hq, c, ctx]
            q_pos = torch.arange(ctx - n + c0, ctx - n + c1, device=q.device)
            scores = scores.masked_fill(key_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
            out[start + c0:start + c1] = (scores.softmax(-1) @ v).transpose(0, 1)
        start += n
    return out
