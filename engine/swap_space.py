"""Host swap space for KV blocks: the CPU cache and the block copies between it and the GPU cache.

    space = SwapSpace(num_cpu_blocks, (L, bs, Hkv, D), dtype, device, staging_blocks=max_blocks_per_seq)
    space.swap(kv_cache, swap_out=[(gpu_block, cpu_block), ...], swap_in=[(cpu_block, gpu_block), ...])

The CPU cache has the GPU cache's layout, [2 (k|v), L, num_cpu_blocks, bs, Hkv, D], so a swap is one
gather and one scatter over dim 2. Each direction copies through its own staging buffer
[2, L, n, bs, Hkv, D] of `staging_blocks` blocks (pinned on CUDA), allocated once at start-up; a swap
of more blocks runs in chunks of that size, each waiting for the previous chunk's copy. Why: pinning
host memory is slow (cudaHostAlloc page-locks every page), and copying pageable memory runs at
~1 GB/s. Pinning a fresh buffer for each swap-in made the H200's swap steps take 5-340 ms for 11-97
blocks (`benchmarks/results/real/azure_conv_vllm_swap_steps.parquet`), and growing the staging buffer
when a step moved more made one 774-block swap take 1.76 s (a 1.8 GB pinned allocation).
"""
from __future__ import annotations

import torch

DEFAULT_STAGING_BLOCKS = 64


class SwapSpace:
    def __init__(self, num_blocks: int, block_shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device, staging_blocks: int = DEFAULT_STAGING_BLOCKS):
        """block_shape (num_layers, block_size, num_kv_heads, head_dim); staging_blocks: blocks per staging
        buffer, the largest chunk one copy moves (capped at num_blocks)."""
        self.device, self.dtype = device, dtype
        self.pinned = device.type == "cuda" and num_blocks > 0
        self.cpu_cache = torch.zeros(2, block_shape[0], num_blocks, *block_shape[1:], dtype=dtype, device="cpu",
                                     pin_memory=self.pinned)
        self.chunk_blocks = max(1, min(staging_blocks, num_blocks))
        numel = self.cpu_cache[:, :, :1].numel() * self.chunk_blocks if num_blocks > 0 else 0
        self._staging = {d: torch.empty(numel, dtype=dtype, pin_memory=self.pinned) for d in ("out", "in")}

    def swap(self, kv_cache: torch.Tensor, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copies blocks GPU->CPU (swap_out) and CPU->GPU (swap_in), as (src, dst) block ids.

        A block freed by one direction may be reused by the other in the same step, so the swap-out GPU
        blocks are gathered (on the device, in stream order) before any swap-in writes the GPU cache, and
        every swap-in CPU block is read before any swap-out writes the CPU cache.
        """
        gathered = None
        if swap_out:
            src = torch.tensor([s for s, _ in swap_out], dtype=torch.int64, device=self.device)
            gathered = kv_cache[:, :, src]                                       # [2, L, n, bs, Hkv, D]
        for i in range(0, len(swap_in), self.chunk_blocks):
            part = swap_in[i:i + self.chunk_blocks]
            if i:
                self._wait()        # the previous chunk's host->device copy still reads the staging buffer
            staged = self._staging_view("in", len(part))
            torch.index_select(self.cpu_cache, 2, torch.tensor([s for s, _ in part], dtype=torch.int64), out=staged)
            # Asynchronous from pinned memory; the buffer is next written by this loop after _wait, or by a
            # later step's swap, after that step read the previous step's sampled tokens (a sync).
            dst = torch.tensor([d for _, d in part], dtype=torch.int64, device=self.device)
            kv_cache[:, :, dst] = staged.to(self.device, non_blocking=True)
        for i in range(0, len(swap_out), self.chunk_blocks):
            part = swap_out[i:i + self.chunk_blocks]
            host = self._staging_view("out", len(part))
            host.copy_(gathered[:, :, i:i + len(part)], non_blocking=True)
            self._wait()
            self.cpu_cache.index_copy_(2, torch.tensor([d for _, d in part], dtype=torch.int64), host)

    def _wait(self) -> None:
        if self.pinned:
            torch.cuda.current_stream(self.device).synchronize()

    def _staging_view(self, direction: str, num_blocks: int) -> torch.Tensor:
        """A contiguous [2, L, num_blocks, bs, Hkv, D] view of one direction's flat staging buffer: a contiguous
        pinned source or target is what makes a copy asynchronous and fast; a strided one would be staged
        again through pageable memory."""
        shape = list(self.cpu_cache.shape)
        shape[2] = num_blocks
        return self._staging[direction][:self.cpu_cache[:, :, :1].numel() * num_blocks].view(shape)
