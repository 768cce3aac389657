"""Attention backends end to end: the torch reference against a dense per-sequence attention computed
without paging, and the triton backend against both; metadata construction and backend selection."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported

from dataclasses import replace

import pytest
import torch

from engine.layers.attention_backends import flash_attn_available, get_attention_backend
from engine.layers.attention_metadata import AttentionMetadata
from tests.engine.paged_cases import PagedCase, dense_attention, make_paged_case

# (num_new_tokens, context_lens, num_prefill_seqs)
SCENARIOS = {
    "prefill_no_cache": ([6, 1, 11], [6, 1, 11], 3),
    "prefill_prefix_hit": ([3, 5], [11, 13], 2),               # 8 cached tokens each (block-aligned for bs 4/8)
    "chunked_second_chunk": ([7], [15], 1),                    # the second chunk starts mid-block for bs 4 and 8
    "decode_multi_block": ([1, 1, 1], [1, 17, 29], 0),
    "mixed_prefill_decode": ([4, 6, 1, 1], [4, 10, 9, 22], 2),
}


def _check_caches(c: PagedCase, k_cache, v_cache):
    """Every position of every entry holds its dense key/value; nothing else was written (still NaN)."""
    bs = k_cache.shape[1]
    owned = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    rows = ([c.meta.prefill_block_tables[i] for i in range(c.meta.num_prefill_seqs)]
            + [c.meta.decode_block_tables[i] for i in range(c.meta.num_decode_seqs)])
    for table, ctx, kd, vd in zip(rows, c.context_lens, c.dense_k, c.dense_v):
        pos = torch.arange(ctx)
        blocks, offs = table[pos // bs].long(), pos % bs
        assert torch.equal(k_cache[blocks, offs], kd) and torch.equal(v_cache[blocks, offs], vd)
        owned[blocks, offs] = True
    assert k_cache[~owned].isnan().all() and v_cache[~owned].isnan().all()


def _run(name: str, c: PagedCase):
    k_cache, v_cache = c.k_cache.clone(), c.v_cache.clone()
    out = get_attention_backend(name, "cpu").forward(c.q, c.k, c.v, k_cache, v_cache, c.meta, c.scale)
    return out, k_cache, v_cache


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("block_size", [4, 8])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_backend_matches_dense_attention(backend, scenario, block_size):
    new, ctx, n_prefill = SCENARIOS[scenario]
    c = make_paged_case(new, ctx, n_prefill, 4, 2, 16, block_size, seed=block_size, num_pad_tokens=2)
    out, k_cache, v_cache = _run(backend, c)
    expected = dense_attention(c)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))        # padding tokens: zero rows
    _check_caches(c, k_cache, v_cache)                              # padding tokens (slot -1) not stored


def test_dense_reference_is_sensitive_to_the_cached_prefix():
    """A backend that ignored the cached prefix of a prefix-hit prefill would not pass the dense check."""
    c = make_paged_case([3], [11], 1, 4, 2, 16, 4)
    prefix_ignored = replace(c, context_lens=[3], dense_k=[c.dense_k[0][8:]], dense_v=[c.dense_v[0][8:]])
    out, _, _ = _run("torch", c)
    torch.testing.assert_close(out, dense_attention(c), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(out, dense_attention(prefix_ignored), atol=1e-3)


def _flash_attn_adapter_without_the_package():
    """The flash_attn adapter as it stands with pages smaller than flash_attn's: every call goes to the triton
    kernels (built without importing flash_attn, which needs CUDA)."""
    from engine.layers.attention_backends.flash_attn_backend import FlashAttnBackend
    from engine.layers.attention_backends.triton_backend import TritonAttentionBackend
    backend = FlashAttnBackend.__new__(FlashAttnBackend)
    backend._fallback, backend._warned = TritonAttentionBackend(), False
    return backend


@pytest.mark.parametrize("backend", ["triton", "flash_attn_small_pages"])
def test_attend_is_forward_with_k_and_v_stored_beforehand(backend):
    """attend (the decoder's call when it stores k and v itself): forward's output without the store."""
    from engine.layers.attention_backends.torch_backend import store_kvcache_torch
    c = make_paged_case([4, 6, 1, 1], [4, 10, 9, 22], 2, 4, 2, 16, 4, seed=5, num_pad_tokens=2)
    b = get_attention_backend("triton") if backend == "triton" else _flash_attn_adapter_without_the_package()
    k_cache, v_cache = c.k_cache.clone(), c.v_cache.clone()
    store_kvcache_torch(c.k, c.v, k_cache, v_cache, c.meta.slot_mapping)
    out = b.attend(c.q, k_cache, v_cache, c.meta, c.scale)
    torch.testing.assert_close(out, dense_attention(c), atol=2e-5, rtol=1e-4)
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))
    with pytest.raises(ValueError, match="slot_mapping has"):
        b.attend(c.q[:-1], k_cache, v_cache, c.meta, c.scale)


def test_triton_backend_larger_gqa_group_with_default_tiles():
    """The backend's default tile sizes (block_m 64, block_n 64) on a GQA ratio of 4."""
    c = make_paged_case([9, 1, 1], [20, 40, 3], 1, 8, 2, 32, 16, seed=3)
    out, k_cache, v_cache = _run("triton", c)
    torch.testing.assert_close(out, dense_attention(c), atol=2e-5, rtol=1e-4)
    _check_caches(c, k_cache, v_cache)


def test_metadata_build_by_hand():
    m = AttentionMetadata.build(num_new_tokens=[3, 2, 1], context_lens=[3, 6, 5],
                                block_tables=[[7], [2, 9], [4, 1]], num_prefill_seqs=2, block_size=4)
    assert m.num_prefill_seqs == 2 and m.num_prefill_tokens == 5 and m.num_decode_seqs == 1
    assert m.slot_mapping.tolist() == [28, 29, 30, 9 * 4 + 0, 9 * 4 + 1, 1 * 4 + 0]
    assert m.cu_seqlens_q.tolist() == [0, 3, 5] and m.cu_seqlens_k.tolist() == [0, 3, 9]
    assert (m.max_seqlen_q, m.max_seqlen_k) == (3, 6)
    assert m.prefill_block_tables.tolist() == [[7, 0], [2, 9]]
    assert m.decode_context_lens.tolist() == [5] and m.decode_block_tables.tolist() == [[4, 1]]
    assert m.cu_seqlens_q.dtype == torch.int32 and m.slot_mapping.dtype == torch.int64


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_new_tokens=[2], context_lens=[9], block_tables=[[1, 2]], num_prefill_seqs=1, block_size=4),
     "block table"),
    (dict(num_new_tokens=[2], context_lens=[2], block_tables=[[1]], num_prefill_seqs=0, block_size=4),
     "decode entry"),
    (dict(num_new_tokens=[1], context_lens=[1], block_tables=[[1]], num_prefill_seqs=0, block_size=6),
     "power of two"),
])
def test_metadata_build_rejects_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AttentionMetadata.build(**kwargs)


def test_forward_rejects_mismatched_heads():
    c = make_paged_case([2], [2], 1, 3, 2, 16, 4)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        _run("torch", c)


def test_get_attention_backend_names():
    assert get_attention_backend("torch").name == "torch"
    assert get_attention_backend("triton").name == "triton"
    assert get_attention_backend("auto", "cpu").name == "torch"
    with pytest.raises(ValueError, match="auto, torch, triton, flash_attn"):
        get_attention_backend("flashinfer")
    if not flash_attn_available():
        with pytest.raises(ValueError, match="flash_attn"):
            get_attention_backend("flash_attn")
