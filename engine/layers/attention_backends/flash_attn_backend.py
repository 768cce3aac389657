"""Thin adapter over the flash_attn package (imported lazily; only used when it imports on CUDA).

Prefill: flash_attn_varlen_func over the paged cache with block_table (causal, bottom-right aligned,
so cached prefixes and later chunks work). Decode: flash_attn_with_kvcache with cache_seqlens.
flash_attn's paged path needs a KV page size divisible by 256; with smaller pages (the engine's
default is 16) this adapter runs our Triton kernels instead and says so once.
The KV store always uses our Triton store kernel (flash_attn's varlen path does not write the cache), or the
decoder stores k and v itself with engine/kernels/qk_norm_rope_store.py and calls `attend`.
"""
from __future__ import annotations

import logging

import torch
from torch import Tensor

from engine.kernels.store_kvcache import store_kvcache
from engine.layers.attention_backends.base import check_cache_inputs, check_inputs
from engine.layers.attention_backends.triton_backend import TritonAttentionBackend
from engine.layers.attention_metadata import AttentionMetadata

log = logging.getLogger(__name__)

FLASH_PAGE_MULTIPLE = 256


class FlashAttnBackend:
    name = "flash_attn"
    padded_prefill = False      # untested with padding entries: prefill steps stay eager
    graph_safe = False

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache
        self._fallback = TritonAttentionBackend()
        self._warned = False

    def _falls_back(self, k_cache: Tensor) -> bool:
        if k_cache.shape[1] % FLASH_PAGE_MULTIPLE and not self._warned:
            log.warning("flash_attn needs a KV block size divisible by %d (got %d); using the triton "
                        "kernels instead", FLASH_PAGE_MULTIPLE, k_cache.shape[1])
            self._warned = True
        return bool(k_cache.shape[1] % FLASH_PAGE_MULTIPLE)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                meta: AttentionMetadata, scale: float) -> Tensor:
        if self._falls_back(k_cache):
            return self._fallback.forward(q, k, v, k_cache, v_cache, meta, scale)
        check_inputs(q, k, v, k_cache, v_cache, meta)
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._attend(q, k_cache, v_cache, meta, scale)

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
        """forward for a step whose k and v are in the cache already (both flash_attn paths read keys and
        values from the paged cache only)."""
        if self._falls_back(k_cache):
            return self._fallback.attend(q, k_cache, v_cache, meta, scale)
        check_cache_inputs(q, k_cache, v_cache, meta)
        return self._attend(q, k_cache, v_cache, meta, scale)

    def _attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
        P, n_dec = meta.num_prefill_tokens, meta.num_decode_seqs
        out = torch.zeros_like(q)
        if meta.num_prefill_seqs:
            out[:P] = self._varlen(q[:P], k_cache, v_cache, meta.cu_seqlens_q, meta.cu_seqlens_k,
                                   meta.max_seqlen_q, meta.max_seqlen_k, softmax_scale=scale, causal=True,
                                   block_table=meta.prefill_block_tables)
        if n_dec:
            o = self._with_kvcache(q[P:P + n_dec].unsqueeze(1), k_cache, v_cache,     # q: [B, 1, Hq, D]
                                   cache_seqlens=meta.decode_context_lens, block_table=meta.decode_block_tables,
                                   softmax_scale=scale, causal=True)
            out[P:P + n_dec] = o.squeeze(1)
        return out
