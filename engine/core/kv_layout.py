"""The rules of the paged KV cache's layout, written once for the scheduler, the engine and the simulator.

    check_block_size(16)                          # tokens per block: a power of two
    kv_heads_per_rank(8, 4) -> 2                   # KV heads each tensor-parallel rank holds
    kv_block_bytes(16, 28, 8, 128, 2) -> bytes     # one block across all layers, K and V

KV heads are split evenly across tensor-parallel ranks when tp <= num_kv_heads; a larger tp must be a
multiple of them, and each rank then holds a replica of the one KV head its query heads use (vLLM's
layout). Every rank holds the same block ids, so a block's bytes are per rank (per GPU).
"""
from __future__ import annotations


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
