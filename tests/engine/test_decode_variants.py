"""Every paged decode variant (engine/kernels/decode_variants.CANDIDATES) against the torch reference, in the
Triton interpreter on CPU, and the table that picks one per batch size.

Caches come from make_paged_case: every slot no sequence owns is NaN, including the slots past each context
in its last page, so a variant that reads keys or values past a context's end (or a page it does not own)
produces NaN.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported

import pytest
import torch

from engine.kernels import decode_variants
from engine.kernels.decode_variants import CANDIDATES, DecodeVariant, table_literal, variant_for_batch
from engine.kernels.paged_decode import paged_decode_attention
from engine.layers.attention_backends.torch_backend import decode_attention_torch, store_kvcache_torch
from tests.engine.paged_cases import make_paged_case

ATOL = 2e-5
BLOCK_SIZE = 4
# ragged, none a multiple of the page size but one; 1 key; with 16-key tiles several tiles and a partial last one
CONTEXTS = [1, 7, 33, 70, 12]
IDS = [v.name for v in CANDIDATES]


def _case(heads, contexts, seed):
    hq, hkv, d = heads
    c = make_paged_case([1] * len(contexts), contexts, 0, hq, hkv, d, BLOCK_SIZE, seed=seed)
    store_kvcache_torch(c.k, c.v, c.k_cache, c.v_cache, c.meta.slot_mapping)
    return c


def _run(c, variant, lens=None, **kw):
    m = c.meta
    out = torch.full_like(c.q, float("nan"))
    paged_decode_attention(c.q, c.k_cache, c.v_cache, m.decode_context_lens if lens is None else lens,
                           m.decode_block_tables, c.scale, out=out, variant=variant, **kw)
    return out


def _expected(c):
    m = c.meta
    return decode_attention_torch(c.q, c.k_cache, c.v_cache, m.decode_context_lens, m.decode_block_tables, c.scale)


def test_candidates_have_unique_names_and_the_default_first():
    assert len(set(IDS)) == len(IDS)
    assert CANDIDATES[0] == DecodeVariant() and IDS[0] == "default"


@pytest.mark.parametrize("variant", CANDIDATES, ids=IDS)
def test_variant_matches_reference_on_ragged_contexts(variant):
    """The variant's own tiles and split rule; 16 q / 8 kv heads (as Qwen3-0.6B: every heads-per-program fits)."""
    c = _case((16, 8, 16), CONTEXTS, seed=1)
    out = _run(c, variant)
    assert not out.isnan().any()
    torch.testing.assert_close(out, _expected(c), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("variant", CANDIDATES, ids=IDS)
def test_variant_matches_reference_with_splits_that_end_early(variant):
    """Group 3 (rows not a power of two), 5 splits of >= 16 keys: the 70-key context uses all five (the last
    6 keys), the 33-key one three, the short ones one, the rest end at once; a zero-length entry gives zeros."""
    c = _case((6, 2, 16), CONTEXTS + [9], seed=2)
    lens = c.meta.decode_context_lens.clone()
    lens[-1] = 0
    out = _run(c, variant, lens=lens, num_splits=5, min_partition=16, block_n=16)
    expected = _expected(c)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))
    torch.testing.assert_close(out[:-1], expected[:-1], atol=ATOL, rtol=1e-4)


def _past_end_case():
    """Last pages hold 2, 1 and 2 of 4 slots; the slots past each context are NaN (checked)."""
    c = _case((4, 2, 16), [6, 13, 30], seed=3)
    m = c.meta
    for b, ctx in enumerate([6, 13, 30]):
        page = m.decode_block_tables[b, (ctx - 1) // BLOCK_SIZE]
        assert c.k_cache[page, (ctx - 1) % BLOCK_SIZE + 1:].isnan().all()
        assert c.v_cache[page, (ctx - 1) % BLOCK_SIZE + 1:].isnan().all()
    return c


def test_reading_one_key_past_the_end_shows_as_nan():
    """The premise of the next test: a kernel that reads the first slot past each context gets NaN out."""
    c = _past_end_case()
    assert _run(c, DecodeVariant(), lens=c.meta.decode_context_lens + 1, num_splits=2, min_partition=16,
                block_n=16).isnan().any()


@pytest.mark.parametrize("variant", CANDIDATES, ids=IDS)
def test_variant_reads_nothing_past_a_context(variant):
    c = _past_end_case()
    out = _run(c, variant, num_splits=2, min_partition=16, block_n=16)
    assert not out.isnan().any()
    torch.testing.assert_close(out, _expected(c), atol=ATOL, rtol=1e-4)


def test_kv_heads_per_program_falls_back_when_it_does_not_divide():
    """4 kv heads per program on a model with 2 kv heads runs one per program, with the same result."""
    c = _case((4, 2, 16), [5, 21], seed=4)
    torch.testing.assert_close(_run(c, DecodeVariant(kv_heads_per_program=4)), _run(c, DecodeVariant()),
                               atol=0, rtol=0)


def test_direct_single_output_is_bitwise_the_reduced_one():
    """A context that fits in one split gives the same bits written directly as through the reduce pass."""
    c = _case((4, 2, 16), [5, 21, 70], seed=5)
    a = _run(c, DecodeVariant(num_splits=4, min_partition=32), block_n=16)
    b = _run(c, DecodeVariant(num_splits=4, min_partition=32, direct_single=True), block_n=16)
    assert torch.equal(a, b)


def test_default_table_is_the_default_variant(monkeypatch):
    """The engine's decode kernel is unchanged until a measured table is adopted: every batch size gets
    DecodeVariant(), and a call without a variant follows the table."""
    assert all(variant_for_batch(b) == DecodeVariant() for b in (1, 7, 64, 512, 4096))
    c = _case((4, 2, 16), [5, 21], seed=6)
    monkeypatch.setattr(decode_variants, "DECODE_TABLE", ((1, DecodeVariant(block_n=32)),
                                                          (None, DecodeVariant(kv_heads_per_program=2))))
    seen = []
    from engine.kernels import paged_decode
    real = paged_decode.split_kernel_constexprs
    monkeypatch.setattr(paged_decode, "split_kernel_constexprs", lambda var, *a: seen.append(var) or real(var, *a))
    _run(c, None)
    assert seen == [DecodeVariant(kv_heads_per_program=2)]


def test_card_tables_by_device_name(monkeypatch):
    """A card with a measured table gets it, by torch's device name; any other card (and the CPU) DECODE_TABLE's."""
    h100 = decode_variants.DECODE_TABLES_BY_CARD["H100"]
    assert decode_variants.table_for_device("NVIDIA H100 80GB HBM3") is h100
    assert decode_variants.table_for_device("NVIDIA H200") is decode_variants.DECODE_TABLE
    assert decode_variants.table_for_device(None) is decode_variants.DECODE_TABLE
    assert variant_for_batch(128, device_name="NVIDIA H100 80GB HBM3") == DecodeVariant(heads_fastest=True,
                                                                                         longest_first=True)
    assert variant_for_batch(128, device_name="NVIDIA H200") == DecodeVariant()
    # every card table ends with a bucket for any larger batch, in increasing bounds
    for table in decode_variants.DECODE_TABLES_BY_CARD.values():
        bounds = [b for b, _ in table]
        assert bounds[-1] is None and bounds[:-1] == sorted(bounds[:-1])
    monkeypatch.setattr(decode_variants, "DECODE_TABLES_BY_CARD", {"H100": ((None, DecodeVariant(num_warps=8)),)})
    assert variant_for_batch(3, device_name="NVIDIA H100 PCIe") == DecodeVariant(num_warps=8)


def test_install_line_overrides_every_card(monkeypatch):
    monkeypatch.setattr(decode_variants, "DECODE_TABLE", decode_variants.DECODE_TABLE)       # restored after
    monkeypatch.setattr(decode_variants, "DECODE_TABLES_BY_CARD", decode_variants.DECODE_TABLES_BY_CARD)
    table = ((8, DecodeVariant(num_warps=8)), (None, DecodeVariant(block_n=32)))
    decode_variants.install_line(table_literal(table))
    assert decode_variants.table_for_device("NVIDIA H100 80GB HBM3") == table
    assert variant_for_batch(9, device_name="NVIDIA H200") == DecodeVariant(block_n=32)


def test_table_lookup_and_literal_round_trip():
    table = ((4, DecodeVariant(num_warps=8)), (256, DecodeVariant()), (None, DecodeVariant(block_n=128, num_stages=2)))
    assert [variant_for_batch(b, table).name for b in (1, 4, 5, 256, 257)] == \
        ["w8", "w8", "default", "default", "n128_s2"]
    line = table_literal(table)
    assert line.startswith("DECODE_TABLE: ")
    ns = {"DecodeVariant": DecodeVariant}
    exec(line, ns)
    assert ns["DECODE_TABLE"] == table


@pytest.mark.parametrize("kwargs,field", [(dict(block_n=48), "block_n"), (dict(kv_heads_per_program=3),
                                          "kv_heads_per_program"), (dict(use_dot=False, kv_heads_per_program=2),
                                          "use_dot"), (dict(num_splits=0), "num_splits"),
                                          (dict(min_partition=0), "min_partition")])
def test_bad_variant_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DecodeVariant(**kwargs)
