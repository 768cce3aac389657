"""What every attention backend provides, plus the input checks they share.

A backend's forward(q, k, v, k_cache, v_cache, meta, scale):
    q:       [num_tokens, num_q_heads, head_dim]   (after RoPE / q-norm)
    k, v:    [num_tokens, num_kv_heads, head_dim]  (this step's new keys/values)
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
It first stores k, v at meta.slot_mapping (negative slots skipped), then computes paged causal
prefill attention for tokens [0, num_prefill_tokens) and paged decode attention for the next
num_decode_seqs tokens. Returns [num_tokens, num_q_heads, head_dim] in q's dtype; rows past the
prefill and decode tokens (padding) are zero.

A backend with padded_prefill = True also serves the padded layout of a graph-captured step
(engine/prefill_graphs.py): trailing prefill entries with no tokens (cu_seqlens_q repeats its last
value) and prefill rows past cu_seqlens_q[-1], which come out zero. graph_safe = True: forward
reads no metadata tensor on the host and sizes no launch by max_seqlen_q / max_seqlen_k, so a CUDA
graph captured for padded sizes is valid for every step that fits.

A backend whose attention reads this step's keys and values from the cache only (never from k, v)
may also provide attend(q, k_cache, v_cache, meta, scale): forward without the store, for a caller
that has stored k and v itself (engine/kernels/qk_norm_rope_store.py, fused into the rotary step).
"""
from __future__ import annotations

from typing import Protocol

from torch import Tensor

from engine.core.kv_layout import check_block_size
from engine.layers.attention_metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str
    padded_prefill: bool
    graph_safe: bool

    def forward(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                meta: AttentionMetadata, scale: float) -> Tensor: ...


def check_inputs(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                 meta: AttentionMetadata) -> None:
    """Raises ValueError naming the offending argument when shapes do not fit together."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [num_tokens, heads, head_dim]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    check_cache_inputs(q, k_cache, v_cache, meta)
    num_tokens, _, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if k.shape != (num_tokens, num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(f"k and v must be [{num_tokens}, {num_kv_heads}, {head_dim}] to match q and the cache; "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")


def check_cache_inputs(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> None:
    """check_inputs without this step's k and v (a backend's `attend`, when they are in the cache already)."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, heads, head_dim]; got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim]; "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"cache head_dim {cache_head_dim} != q head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    check_block_size(block_size)
    if meta.slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"meta.slot_mapping has {meta.slot_mapping.shape[0]} slots for {num_tokens} tokens")
    if meta.num_prefill_tokens + meta.num_decode_seqs > num_tokens:
        raise ValueError(f"meta describes {meta.num_prefill_tokens} prefill + {meta.num_decode_seqs} decode tokens "
                         f"but q has only {num_tokens}")
