"""Triton kernels (run in the interpreter on CPU) against the torch reference backend's functions.

Caches and outputs are poisoned with NaN beforehand: a slot not written, a read outside a context
(partial last page, block-table padding) or an output row not written shows up as NaN.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported

import pytest
import torch

from engine.kernels.paged_decode import paged_decode_attention
from engine.kernels.paged_prefill import paged_prefill_attention
from engine.kernels.store_kvcache import store_kvcache
from engine.layers.attention_backends.torch_backend import (
    decode_attention_torch,
    prefill_attention_torch,
    store_kvcache_torch,
)
from tests.engine.paged_cases import make_paged_case

ATOL = 2e-5
HEADS = [(2, 1, 16), (4, 2, 32), (6, 2, 16)]     # (q heads, kv heads, head_dim); the last has group 3


def _same_with_nan(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize("block_size", [4, 16])
def test_store_kvcache_writes_slots_and_skips_negative(block_size):
    gen = torch.Generator().manual_seed(1)
    num_blocks, hkv, d = 5, 2, 16
    k = torch.randn(7, hkv, d, generator=gen)
    v = torch.randn(7, hkv, d, generator=gen)
    # non-contiguous k (a column slice of a wider tensor), as when k comes out of a fused qkv
    k = torch.cat([k, torch.randn(7, hkv, d, generator=gen)], dim=1)[:, :hkv]
    slots = torch.tensor([3, -1, 2 * block_size + 1, 0, num_blocks * block_size - 1, -7, block_size])
    caches = [torch.full((num_blocks, block_size, hkv, d), float("nan")) for _ in range(4)]
    store_kvcache(k, v, caches[0], caches[1], slots)
    store_kvcache_torch(k, v, caches[2], caches[3], slots)
    assert _same_with_nan(caches[0], caches[2]) and _same_with_nan(caches[1], caches[3])
    written = (~caches[0].isnan()).all(dim=(2, 3)).flatten()
    assert written.sum().item() == 5                                    # five non-negative slots
    assert torch.equal(caches[0].view(-1, hkv, d)[slots[0]], k[0])
    assert caches[0].isnan().flatten(0, 1).all(dim=(1, 2)).sum().item() == num_blocks * block_size - 5


PREFILL_CASES = {
    "no_cache": ([7, 16, 3], [7, 16, 3]),
    "prefix_hit": ([5, 3, 9], [21, 11, 9]),          # first two reuse cached blocks
    "chunked_second_chunk": ([8, 6], [24, 19]),       # chunks starting at 16 and mid-block 13
}


@pytest.mark.parametrize("case_name", list(PREFILL_CASES))
@pytest.mark.parametrize("block_size", [4, 32])     # tiles of 16 keys span 4 pages / half a page
@pytest.mark.parametrize("heads", HEADS)
def test_prefill_kernel_matches_reference(case_name, block_size, heads):
    hq, hkv, d = heads
    new, ctx = PREFILL_CASES[case_name]
    c = make_paged_case(new, ctx, len(new), hq, hkv, d, block_size, seed=block_size + hq)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    m = c.meta
    expected = prefill_attention_torch(c.q, c.k_cache, c.v_cache, m, c.scale)
    out = torch.full_like(c.q, float("nan"))
    paged_prefill_attention(c.q, c.k_cache, c.v_cache, m.cu_seqlens_q, m.cu_seqlens_k, m.prefill_block_tables,
                            c.scale, out=out, block_m=16, block_n=16)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("heads", HEADS)
def test_prefill_kernel_padded_graph_layout(heads):
    """A graph-captured step's layout: decode entries as prefill entries of one token, then padding
    entries (q_len 0, k_len 0) and padding rows. Real rows match the reference (tokens that cross
    tile boundaries, tiles shared by no entry); padding rows stay untouched (NaN here)."""
    from tests.engine.paged_cases import dense_attention
    hq, hkv, d = heads
    new, ctx = [13, 1, 1, 40, 1], [13, 30, 5, 47, 64]
    c = make_paged_case(new, ctx, len(new), hq, hkv, d, 8, seed=hq, num_pad_tokens=11)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    m = c.meta
    pad_entries = 4
    T = sum(new)
    cu_q = torch.cat([m.cu_seqlens_q, torch.full((pad_entries,), T, dtype=torch.int32)])
    cu_k = torch.cat([m.cu_seqlens_k, torch.full((pad_entries,), int(m.cu_seqlens_k[-1]), dtype=torch.int32)])
    tables = torch.cat([m.prefill_block_tables, torch.zeros(pad_entries, m.prefill_block_tables.shape[1],
                                                             dtype=torch.int32)])
    out = torch.full_like(c.q, float("nan"))
    paged_prefill_attention(c.q, c.k_cache, c.v_cache, cu_q, cu_k, tables, c.scale, out=out, block_m=16, block_n=16)
    torch.testing.assert_close(out[:T], dense_attention(c)[:T], atol=ATOL, rtol=1e-4)
    assert out[T:].isnan().all()


@pytest.mark.parametrize("num_splits,fixed", [(1, False), (3, False), (3, True), (None, False)])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads", HEADS[:2])
def test_decode_kernel_matches_reference(num_splits, fixed, block_size, heads):
    hq, hkv, d = heads
    ctx = [1, 7, 33, 70]            # one token up to several blocks; shuffled block ids
    c = make_paged_case([1] * len(ctx), ctx, 0, hq, hkv, d, block_size, seed=num_splits or 0)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    m = c.meta
    expected = decode_attention_torch(c.q, c.k_cache, c.v_cache, m.decode_context_lens, m.decode_block_tables, c.scale)
    out = torch.full_like(c.q, float("nan"))
    paged_decode_attention(c.q, c.k_cache, c.v_cache, m.decode_context_lens, m.decode_block_tables, c.scale,
                           out=out, num_splits=num_splits, block_n=16, fixed_partition=fixed, min_partition=16)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("fixed", [False, True])
def test_decode_kernel_splits_really_split(fixed):
    """With 70 keys, 16-key minimum partitions and num_splits=5 the reduce pass merges several partial
    results, including empty splits of the short entry; a wrong merge would not match a single split."""
    c = make_paged_case([1, 1], [3, 70], 0, 4, 2, 16, 4, seed=5)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    m = c.meta
    outs = [paged_decode_attention(c.q, c.k_cache, c.v_cache, m.decode_context_lens, m.decode_block_tables,
                                   c.scale, num_splits=s, block_n=16, fixed_partition=fixed, min_partition=16)
            for s in (1, 5)]
    torch.testing.assert_close(outs[0], outs[1], atol=ATOL, rtol=1e-4)


def test_decode_kernel_partitions_each_context():
    """Per-context partitions: 70 keys over 5 splits of >= 16 keys are partitions of 16 (the last one 6 keys);
    a 2-key context uses one. The keys past each context, in its last block, are NaN: a split that reads past
    its own context's end (a partition bound computed from another length) would poison the output."""
    c = make_paged_case([1, 1], [2, 70], 0, 4, 2, 16, 4, seed=7)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    m = c.meta
    expected = decode_attention_torch(c.q, c.k_cache, c.v_cache, m.decode_context_lens, m.decode_block_tables, c.scale)
    # keys past each context (in its last table block) are NaN: a split reading beyond ctx would poison out
    for b, ctx in enumerate((2, 70)):
        last = m.decode_block_tables[b, (ctx - 1) // 4]
        c.k_cache[last, (ctx - 1) % 4 + 1:] = float("nan")
    out = paged_decode_attention(c.q, c.k_cache, c.v_cache, m.decode_context_lens, m.decode_block_tables,
                                 c.scale, num_splits=5, block_n=16, min_partition=16)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=1e-4)


def test_decode_kernel_zero_context_gives_zeros():
    """A padding decode entry (context 0, e.g. from CUDA-graph batch padding) yields zeros, not NaN."""
    c = make_paged_case([1, 1], [9, 1], 0, 4, 2, 16, 4, seed=2)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    lens = torch.tensor([9, 0], dtype=torch.int32)
    for splits in (1, 2):
        out = torch.full_like(c.q, float("nan"))
        paged_decode_attention(c.q, c.k_cache, c.v_cache, lens, c.meta.decode_block_tables, c.scale,
                               out=out, num_splits=splits, block_n=16)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        assert not out[0].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S,V", [(1, 700), (5, 1531)])
def test_race_sample_kernel_matches_torch_reference(dtype, S, V):
    from engine.kernels.sample import race_sample
    from engine.layers.sampler import race_sample_reference
    gen = torch.Generator().manual_seed(S * V)
    logits = (torch.randn(S, V, generator=gen) * 3).to(dtype)
    noise = torch.empty(S, V).exponential_(1.0, generator=gen)
    noise[0, :7] = 0.0                                   # clamped, not -log(0) = inf everywhere
    temps = torch.tensor([0.0, 0.7, 1.3, 0.0, 2.0][:S])
    if S > 1:                                            # a greedy row whose max appears twice: lowest index wins
        logits[3, [5, V - 2]] = logits[3].max() + 1
    # tiny tiles and many splits so the host-side merge across slices is exercised too
    out = race_sample(logits, temps, noise, block=64, min_programs=4 * S)
    assert out.tolist() == race_sample_reference(logits, temps, noise).tolist()
    if S > 1:
        assert out[3].item() == 5 and out[0].item() == logits[0].float().argmax().item()


def test_race_sample_kernel_rejects_mismatched_shapes():
    from engine.kernels.sample import race_sample
    with pytest.raises(ValueError, match="must be"):
        race_sample(torch.zeros(2, 10), torch.zeros(2), torch.zeros(2, 11))


def test_num_splits_follow_the_batch_not_the_table_width(monkeypatch):
    """132 SMs (an H200): a small batch gets enough splits for ~8 programs per SM, capped by 256-key
    partitions of the table width and MAX_SPLITS; the count does not grow with a wider table (a CUDA
    graph's width is max_model_len); a batch with >= 2 programs per SM gets one split."""
    from engine.kernels import paged_decode
    monkeypatch.setattr(paged_decode, "_num_sms", lambda device: 132)
    choose = paged_decode.choose_num_splits
    assert [choose(b, 8, 4096, 64, "cuda") for b in (1, 4, 16, 24, 32)] == [16, 16, 9, 6, 5]
    assert [choose(b, 8, 16384, 64, "cuda") for b in (4, 16, 24, 32)] == [33, 9, 6, 5]
    assert choose(33, 8, 4096, 64, "cuda") == 1                           # 264 programs = 2 per SM
    assert choose(2, 8, 300, 64, "cuda") == 2
    assert choose(1, 2, 40960, 64, "cuda") == paged_decode.MAX_SPLITS


@pytest.mark.parametrize("num_ids", [1, 7, 256, 300])      # one program, a partial one, several
def test_resolve_placeholders_kernel_matches_the_torch_form(num_ids):
    from engine.core.in_flight import PLACEHOLDER_BASE
    from engine.kernels.resolve_placeholders import resolve_placeholders
    from engine.model_runner import resolve_placeholders_torch
    gen = torch.Generator().manual_seed(num_ids)
    prev = torch.randint(0, 151936, (max(1, num_ids // 2),), generator=gen)
    ids = torch.randint(0, 151936, (num_ids,), generator=gen)
    ph = torch.rand(num_ids, generator=gen) < 0.5
    ph[0] = True                                                    # at least one placeholder
    ids[ph] = PLACEHOLDER_BASE + torch.randint(0, prev.numel(), (int(ph.sum()),), generator=gen)
    kernel, ref = ids.clone(), ids.clone()
    resolve_placeholders(kernel, prev)
    resolve_placeholders_torch(ref, prev)
    assert torch.equal(kernel, ref)
    assert torch.equal(kernel[~ph], ids[~ph])                       # real ids untouched
    assert torch.equal(kernel[ph], prev[ids[ph] - PLACEHOLDER_BASE])
