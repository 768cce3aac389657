"""The fused q/k-norm + RoPE + KV-store kernel (Triton interpreter on CPU) against the unfused path:
engine/layers/fused.py's qk_norm_rope / rope, then the torch backend's store.

Batches are ragged (prefill runs at cached offsets, decodes, padding tokens with slot -1 in the
middle and at the end); caches are poisoned with NaN, so a slot written that should not be, or one
not written, shows up.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported

import pytest
import torch

from engine.kernels.qk_norm_rope_store import qk_norm_rope_store
from engine.layers.attention_metadata import AttentionMetadata
from engine.layers.rotary import RotaryEmbedding
from tests.engine.qkv_cases import bf16_steps, unfused_qk_norm_rope_store

HEADS = [(4, 2, 16), (6, 2, 24), (16, 8, 128)]   # (Hq, Hkv, D): D/2 = 12 is no power of two; the last Qwen3-0.6B's
BLOCK_SIZE, NUM_BLOCKS, MAX_POS = 4, 12, 64


def _ragged_batch():
    """positions [T], slot_mapping [T]: prefills of 7 (at 3..9) and 5 (at 0..4) tokens, a padding token,
    two decodes (positions 17, 40), two trailing padding tokens."""
    meta = AttentionMetadata.build([7, 5, 1, 1], [10, 5, 18, 41], [[0, 1, 2], [3, 4], [5, 6, 7, 8, 9], list(range(11))],
                                   2, BLOCK_SIZE)
    positions = [*range(3, 10), *range(0, 5), 17, 40]
    slots = meta.slot_mapping.tolist()
    slots = slots[:12] + [-1] + slots[12:] + [-1, -1]
    positions = positions[:12] + [0] + positions[12:] + [0, 0]
    return torch.tensor(positions), torch.tensor(slots)


def _case(heads, dtype, norm, seed=0):
    hq, hkv, d = heads
    gen = torch.Generator().manual_seed(seed)
    positions, slots = _ragged_batch()
    T = positions.shape[0]
    # qkv as a column slice of a wider tensor: a row stride other than its width
    qkv = torch.randn(T, (hq + 2 * hkv) * d + 8, generator=gen)[:, 4:-4].to(dtype)
    qw = (1.0 + 0.3 * torch.randn(d, generator=gen)).to(dtype) if norm else None
    kw = (1.0 + 0.3 * torch.randn(d, generator=gen)).to(dtype) if norm else None
    cos_sin = RotaryEmbedding(d, MAX_POS, 10000.0).cos_sin
    return qkv, positions, slots, qw, kw, cos_sin


def _caches(heads, dtype):
    hq, hkv, d = heads
    return [torch.full((NUM_BLOCKS, BLOCK_SIZE, hkv, d), float("nan"), dtype=dtype) for _ in range(2)]


@pytest.mark.parametrize("block_h", [None, 4])          # None: one program per token; 4: rows split across programs
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=[f"{h[0]}q{h[1]}kv{h[2]}d" for h in HEADS])
def test_fused_equals_unfused_norm_rope_store(heads, dtype, norm, block_h):
    hq, hkv, d = heads
    qkv, positions, slots, qw, kw, cos_sin = _case(heads, dtype, norm)
    k_ref, v_ref = _caches(heads, dtype)
    q_ref = unfused_qk_norm_rope_store(qkv, heads, positions, cos_sin, k_ref, v_ref, slots, qw, kw, 1e-6)
    k_out, v_out = _caches(heads, dtype)
    q = qk_norm_rope_store(qkv, hq, hkv, positions, cos_sin, k_out, v_out, slots, qw, kw, 1e-6, block_h=block_h)

    assert q.shape == (qkv.shape[0], hq, d) and q.dtype == dtype
    assert torch.equal(k_out.isnan(), k_ref.isnan()) and torch.equal(v_out.isnan(), v_ref.isnan())
    written = (~k_out.isnan()).all(dim=(2, 3)).flatten()
    assert written.sum().item() == int((slots >= 0).sum()) == 14
    assert torch.equal(v_out.nan_to_num(0.0), v_ref.nan_to_num(0.0))             # v is copied as it is
    kv_out, kv_ref = k_out.view(-1, hkv, d)[slots[slots >= 0]], k_ref.view(-1, hkv, d)[slots[slots >= 0]]
    if dtype == torch.float32:
        torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv_out, kv_ref, atol=1e-5, rtol=1e-5)
    else:
        assert bf16_steps(q, q_ref) <= 4 and bf16_steps(kv_out, kv_ref) <= 4


def test_bf16_error_measure_sees_a_wrong_weight():
    """The bf16 bound above (a few steps: the interpreter truncates bf16 casts where the GPU rounds) can fail:
    a q/k norm weight off by 10% is far outside it."""
    heads = (4, 2, 16)
    qkv, positions, slots, qw, kw, cos_sin = _case(heads, torch.bfloat16, True)
    q_ref = unfused_qk_norm_rope_store(qkv, heads, positions, cos_sin, *_caches(heads, torch.bfloat16), slots, qw, kw,
                                       1e-6)
    q = qk_norm_rope_store(qkv, 4, 2, positions, cos_sin, *_caches(heads, torch.bfloat16), slots, qw * 1.1, kw, 1e-6)
    assert bf16_steps(q, q_ref) > 8


def test_without_tokens_nothing_is_launched():
    heads = (4, 2, 16)
    k_cache, v_cache = _caches(heads, torch.float32)
    none = torch.zeros(0, dtype=torch.long)
    q = qk_norm_rope_store(torch.zeros(0, 128), 4, 2, none, RotaryEmbedding(16, MAX_POS, 1e4).cos_sin, k_cache,
                           v_cache, none)
    assert q.shape == (0, 4, 16) and k_cache.isnan().all()


@pytest.mark.parametrize("change, message", [
    (dict(qkv=torch.zeros(3, 100)), "qkv must be"),
    (dict(positions=torch.zeros(2, dtype=torch.long)), "positions and slot_mapping"),
    (dict(q_weight=torch.ones(16)), "both q_weight and k_weight"),
    (dict(num_kv_heads=1), "qkv must be"),
])
def test_bad_shapes_fail_with_one_line(change, message):
    k_cache, v_cache = _caches((4, 2, 16), torch.float32)
    args = dict(qkv=torch.zeros(3, 128), num_q_heads=4, num_kv_heads=2, positions=torch.zeros(3, dtype=torch.long),
                cos_sin=RotaryEmbedding(16, MAX_POS, 1e4).cos_sin, k_cache=k_cache, v_cache=v_cache,
                slot_mapping=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        qk_norm_rope_store(**{**args, **change})
