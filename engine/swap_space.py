"""Host swap space for KV blocks: the CPU cache and the block copies between it and the GPU cache.

    space = SwapSpace(num_cpu_blocks, (L, bs, Hkv, D), dtype, device)
    space.swap(kv_cache, swap_out=[(gpu_block, cpu_block), ...], swap_in=[(cpu_block, gpu_block), ...])

The CPU cache is block-major, [num_cpu_blocks, 2 (k|v), L, bs, Hkv, D], pinned on CUDA (the layout of
the prefix cache's CPU tier, engine/cpu_tier_space.py): a CPU block is one contiguous span of host
memory, so a run of consecutive CPU blocks is one cudaMemcpyAsync straight between the pinned cache
and a device buffer, and the host copies no bytes itself. The gather and scatter over the GPU cache's
block dim run on the device. Every copy is queued on the compute stream, so the host only launches:
the next step's forward pass follows the copies in stream order, and a later swap of the same CPU
block is ordered after them.

Why not the GPU cache's layout with pinned staging buffers (the design this replaced): a CPU block
is then 2 x L strided pieces, so every swap paid a host-side index_select or index_copy_ through the
staging buffer, one CPU thread moving ~1.8 MB a block. On the H200 that cost 80-230 us a block and
varied from run to run (`copy_host_s` in benchmarks/results/generalize/whole_suite/'s swap steps),
several times a PCIe copy's ~40 us; `benchmarks/swap_speed.py` measures both in one run.

Device memory: a step's swap holds its blocks in device temporaries (the caching allocator's) while
it runs, as the swap-out gather always did.
"""
from __future__ import annotations

import torch

from engine.cpu_tier_space import block_runs


class SwapSpace:
    def __init__(self, num_blocks: int, block_shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device):
        """block_shape (num_layers, block_size, num_kv_heads, head_dim)."""
        self.device, self.dtype = device, dtype
        self.is_cuda = device.type == "cuda"
        self.block_shape = (2, block_shape[0], *block_shape[1:])           # one block, block-major
        # empty, not zeros: a CPU block is read only after a swap-out wrote it, and on a CPU engine the pages
        # nobody wrote take no memory (zeros made the default 4 GiB of swap space resident for a tiny model)
        self.cpu_cache = torch.empty(num_blocks, *self.block_shape, dtype=dtype, device="cpu",
                                     pin_memory=self.is_cuda and num_blocks > 0)

    def swap(self, kv_cache: torch.Tensor, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copies blocks GPU->CPU (swap_out) and CPU->GPU (swap_in), as (src, dst) block ids.

        A block freed by one direction may be reused by the other in the same step, so in stream order
        the swap-out GPU blocks are gathered before any swap-in writes the GPU cache, and every swap-in CPU
        block is read before any swap-out writes the CPU cache: gather out, read in, scatter in, write out.
        """
        gathered = None
        if swap_out:
            swap_out = sorted(swap_out, key=lambda p: p[1])     # by CPU block: longer runs, fewer copies
            src = torch.tensor([g for g, _ in swap_out], dtype=torch.int64).to(self.device, non_blocking=True)
            gathered = kv_cache.index_select(2, src).permute(2, 0, 1, 3, 4, 5).contiguous()  # [n, 2, L, bs, Hkv, D]
        if swap_in:
            swap_in = sorted(swap_in)
            dst = torch.tensor([g for _, g in swap_in], dtype=torch.int64).to(self.device, non_blocking=True)
            buf = torch.empty(len(swap_in), *self.block_shape, dtype=self.dtype, device=self.device)
            for i, c, k in block_runs([c for c, _ in swap_in]):
                buf[i:i + k].copy_(self.cpu_cache[c:c + k], non_blocking=self.is_cuda)
            kv_cache.index_copy_(2, dst, buf.permute(1, 2, 0, 3, 4, 5))
        if swap_out:
            for i, c, k in block_runs([c for _, c in swap_out]):
                self.cpu_cache[c:c + k].copy_(gathered[i:i + k], non_blocking=self.is_cuda)
