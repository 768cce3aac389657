"""The rules of the paged KV cache's layout, written once for the scheduler, the engine and the simulator.

    check_block_size(16)                          # tokens per block: a power of two
    kv_heads_per_rank(8, 4) -> 2                   # KV heads each tensor-parallel rank holds
    kv_block_bytes(16, 28, 8, 128, 2) -> bytes     # one block across all layers, K and V
    cpu_cache_blocks(0, 28.0, block_bytes)         # the CPU tier's blocks from a size in GiB

KV heads are split evenly across tensor-parallel ranks when tp <= num_kv_heads; a larger tp must be a
multiple of them, and each rank then holds a replica of the one KV head its query heads use (vLLM's
layout). Every rank holds the same block ids, so a block's bytes are per rank (per GPU).
"""
from __future__ import annotations

import math


def check_block_size(block_size: int) -> None:
    """ValueError unless block_size is a power of two (1, 2, 4, ...)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1 \
            or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two (1, 2, 4, ..., default 16), got {block_size!r}")


def kv_split_problem(num_kv_heads: int, tensor_parallel_size: int, name: str = "num_key_value_heads") -> str | None:
    """Why num_kv_heads cannot be split across tensor_parallel_size ranks, or None when it can
    (`name` names the KV head count in the message)."""
    tp, kv = tensor_parallel_size, num_kv_heads
    if tp <= kv and kv % tp:
        return f"tensor_parallel_size={tp} must divide {name}={kv}"
    if tp > kv and tp % kv:
        return (f"tensor_parallel_size={tp} exceeds {name}={kv} and is not a multiple of it "
                f"(KV heads are replicated only in whole copies)")
    return None


def kv_heads_per_rank(num_kv_heads: int, tensor_parallel_size: int, name: str = "num_key_value_heads") -> int:
    """KV heads one rank holds: num_kv_heads / tp, or 1 (a replica) when tp exceeds them."""
    problem = kv_split_problem(num_kv_heads, tensor_parallel_size, name)
    if problem:
        raise ValueError(problem)
    return num_kv_heads // tensor_parallel_size if tensor_parallel_size <= num_kv_heads else 1


def first_kv_head(num_kv_heads: int, tp_rank: int, tensor_parallel_size: int) -> int:
    """Index of the first KV head rank tp_rank holds (of the replicated one when tp exceeds them)."""
    per = kv_heads_per_rank(num_kv_heads, tensor_parallel_size)
    if tensor_parallel_size <= num_kv_heads:
        return tp_rank * per
    return tp_rank // (tensor_parallel_size // num_kv_heads)


def kv_block_bytes(block_size: int, num_layers: int, num_kv_heads_per_rank: int, head_dim: int,
                   dtype_bytes: int) -> int:
    """Bytes of one KV block on one rank, K and V of every layer (block_size=1: bytes per token)."""
    return 2 * num_layers * block_size * num_kv_heads_per_rank * head_dim * dtype_bytes


GIB = 1 << 30


def check_cpu_cache_size(cpu_cache_num_blocks: int, cpu_cache_gib: float | None) -> None:
    """ValueError unless the CPU tier is sized one way: cpu_cache_num_blocks >= 0, or cpu_cache_gib (a finite
    number >= 0) with cpu_cache_num_blocks left at its default 0."""
    if cpu_cache_gib is None:
        return
    gib = cpu_cache_gib
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not math.isfinite(gib) or gib < 0:
        raise ValueError(f"cpu_cache_gib must be a finite number of GiB >= 0 (0: no CPU tier), got {gib!r}")
    if cpu_cache_num_blocks:
        raise ValueError(f"cpu_cache_num_blocks={cpu_cache_num_blocks} and cpu_cache_gib={gib:g} both size the CPU "
                         f"tier; give one of them (cpu_cache_num_blocks=0 with cpu_cache_gib, or drop cpu_cache_gib)")


def cpu_cache_blocks(cpu_cache_num_blocks: int, cpu_cache_gib: float | None, block_bytes: int) -> int:
    """The CPU tier's size in blocks: cpu_cache_num_blocks, or the whole blocks of block_bytes (kv_block_bytes)
    that fit in cpu_cache_gib GiB when that is given (check_cpu_cache_size: not both)."""
    check_cpu_cache_size(cpu_cache_num_blocks, cpu_cache_gib)
    if cpu_cache_gib is None:
        return int(cpu_cache_num_blocks)
    return int(cpu_cache_gib * GIB // block_bytes)


def gib_floor(num_bytes: int) -> str:
    """num_bytes in GiB rounded down to 3 significant digits (a size that still fits), e.g. '27.9', '0.0123'."""
    gib = num_bytes / GIB
    if gib <= 0:
        return "0"
    step = 10.0 ** (math.floor(math.log10(gib)) - 2)
    return f"{math.floor(gib / step) * step:.6g}"
