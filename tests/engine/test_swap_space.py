"""SwapSpace: blocks round-trip GPU cache -> CPU cache -> GPU cache bit-exactly, and one step may swap a
block in and reuse its freed slot for a swap-out (sources are read before destinations are written)."""
import os

import pytest
import torch

from engine.cpu_tier_space import CpuTierSpace
from engine.swap_space import SwapSpace

SHAPE = (3, 4, 2, 8)            # layers, block_size, kv heads, head_dim


def _cache(num_blocks, seed):
    return torch.randn(2, SHAPE[0], num_blocks, *SHAPE[1:], generator=torch.Generator().manual_seed(seed))


def _host(num_blocks, seed):
    """A block-major CPU cache [num_blocks, 2, L, bs, Hkv, D] of random values."""
    return _cache(num_blocks, seed).permute(2, 0, 1, 3, 4, 5).contiguous()


def test_round_trip_is_exact():
    kv = _cache(6, 0)
    space = SwapSpace(5, SHAPE, torch.float32, torch.device("cpu"))
    original = kv.clone()
    space.swap(kv, swap_out=[(4, 0), (1, 3)], swap_in=[])
    assert torch.equal(space.cpu_cache[0], original[:, :, 4]) and torch.equal(space.cpu_cache[3],
                                                                                     original[:, :, 1])
    kv[:, :, [1, 4]] = float("nan")                             # the GPU blocks get reused meanwhile
    space.swap(kv, swap_out=[], swap_in=[(3, 2), (0, 5)])
    assert torch.equal(kv[:, :, 2], original[:, :, 1]) and torch.equal(kv[:, :, 5], original[:, :, 4])


def test_same_step_swap_in_source_reused_as_swap_out_destination():
    kv = _cache(4, 1)
    space = SwapSpace(3, SHAPE, torch.float32, torch.device("cpu"))
    space.cpu_cache.copy_(_host(3, 2))
    cpu_before, kv_before = space.cpu_cache.clone(), kv.clone()
    # CPU block 1 swaps in to GPU block 0 while GPU block 2 swaps out into the freed CPU block 1
    space.swap(kv, swap_out=[(2, 1)], swap_in=[(1, 0)])
    assert torch.equal(kv[:, :, 0], cpu_before[1])
    assert torch.equal(space.cpu_cache[1], kv_before[:, :, 2])
    assert torch.equal(space.cpu_cache[[0, 2]], cpu_before[[0, 2]])      # nothing else touched


def test_many_blocks_in_runs_and_out_of_order():
    """7 blocks each way, listed out of CPU-block order and holding runs of consecutive CPU blocks (one copy
    per run), with every swap-in source reused as a swap-out destination and every swap-out source as a
    swap-in destination."""
    kv = _cache(10, 3)
    space = SwapSpace(12, SHAPE, torch.float32, torch.device("cpu"))
    space.cpu_cache.copy_(_host(12, 4))
    cpu_before, kv_before = space.cpu_cache.clone(), kv.clone()
    swap_in = [(c, g) for c, g in zip((5, 1, 7, 6, 9, 0, 11), (2, 8, 0, 6, 4, 9, 1))]
    swap_out = [(g, c) for g, c in zip((8, 2, 6, 0, 4, 1, 9), (1, 3, 5, 7, 2, 4, 0))]
    space.swap(kv, swap_out=swap_out, swap_in=swap_in)
    for c, g in swap_in:
        assert torch.equal(kv[:, :, g], cpu_before[c])
    for g, c in swap_out:
        assert torch.equal(space.cpu_cache[c], kv_before[:, :, g])
    untouched = [c for c in range(12) if c not in {c for _, c in swap_out}]
    assert torch.equal(space.cpu_cache[untouched], cpu_before[untouched])


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_host_memory_is_not_touched_until_written():
    """A CPU engine's swap space and CPU tier take memory only for the blocks written: the default 4 GiB of swap
    space of a tiny model must not be resident from the start."""
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc")
    nbytes = 512 << 20
    block = 2 * SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3] * 4
    before = _rss_bytes()
    space = SwapSpace(nbytes // block, SHAPE, torch.float32, torch.device("cpu"))
    tier = CpuTierSpace(nbytes // block, SHAPE, torch.float32, torch.device("cpu"))
    assert _rss_bytes() - before < 64 << 20
    space.swap(_cache(2, 1), swap_out=[(0, 0)], swap_in=[])
    assert torch.equal(space.cpu_cache[0], _cache(2, 1)[:, :, 0]) and tier.host.numel() > 0
