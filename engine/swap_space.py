"""Host swap space for KV blocks: the CPU cache and the block copies between it and the GPU cache.

    space = SwapSpace(num_cpu_blocks, (L, bs, Hkv, D), dtype, device, staging_blocks=max_blocks_per_seq)
    space.swap(kv_cache, swap_out=[(gpu_block, cpu_block), ...], swap_in=[(cpu_block, gpu_block), ...])

The CPU cache has the GPU cache's layout, [2 (k|v), L, num_cpu_blocks, bs, Hkv, D], so a swap is one
gather and one scatter over dim 2. On CUDA the CPU cache is pinned and each direction copies through
its own pinned staging buffer [2, L, n, bs, Hkv, D], allocated at start-up for `staging_blocks`
blocks and grown by doubling when a step moves more. Why: pinning host memory is slow (cudaHostAlloc
page-locks every page), and copying pageable memory runs at ~1 GB/s. Pinning a fresh buffer for each
swap-in, and growing one staging buffer from 8 blocks, made the H200's swap steps take 5-340 ms for
11-97 blocks (`benchmarks/results/real/azure_conv_vllm_swap_steps.parquet`).
"""
from __future__ import annotations

import torch


class SwapSpace:
    def __init__(self, num_blocks: int, block_shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device, staging_blocks: int = 0):
        """block_shape (num_layers, block_size, num_kv_heads, head_dim); staging_blocks: the pinned staging
        buffers' initial size in blocks (CUDA only; capped at num_blocks)."""
        self.device, self.dtype = device, dtype
        self.pinned = device.type == "cuda" and num_blocks > 0
        self.cpu_cache = torch.zeros(2, block_shape[0], num_blocks, *block_shape[1:], dtype=dtype, device="cpu",
                                     pin_memory=self.pinned)
        self._staging: dict[str, torch.Tensor] = {}
        if self.pinned and staging_blocks > 0:
            for direction in ("out", "in"):
                self._staging_buffer(direction, min(staging_blocks, num_blocks))

    def swap(self, kv_cache: torch.Tensor, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copies blocks GPU->CPU (swap_out) and CPU->GPU (swap_in), as (src, dst) block ids.

        Swap-in sources are read first and swap-out runs before swap-in writes, so a block freed by
        one direction and reused by the other in the same step is never clobbered.
        """
        staged = None
        if swap_in:
            src = torch.tensor([s for s, _ in swap_in], dtype=torch.int64)
            if self.pinned:
                staged = self._staging_buffer("in", len(swap_in))
                torch.index_select(self.cpu_cache, 2, src, out=staged)           # [2, L, n, bs, Hkv, D]
            else:
                staged = self.cpu_cache[:, :, src]
        if swap_out:
            src = torch.tensor([s for s, _ in swap_out], dtype=torch.int64, device=self.device)
            dst = torch.tensor([d for _, d in swap_out], dtype=torch.int64)
            gathered = kv_cache[:, :, src]                                       # [2, L, n, bs, Hkv, D]
            if self.pinned:
                host = self._staging_buffer("out", len(swap_out))
                host.copy_(gathered, non_blocking=True)
                torch.cuda.current_stream(self.device).synchronize()
                self.cpu_cache.index_copy_(2, dst, host)
            else:
                self.cpu_cache.index_copy_(2, dst, gathered.to("cpu"))
        if swap_in:
            # The host->device copy runs asynchronously from the staging buffer; the buffer is next written
            # by a later step's swap, after that step read the previous step's sampled tokens (a sync).
            dst = torch.tensor([d for _, d in swap_in], dtype=torch.int64, device=self.device)
            kv_cache[:, :, dst] = staged.to(self.device, non_blocking=True)

    def _staging_buffer(self, direction: str, num_blocks: int) -> torch.Tensor:
        """A contiguous pinned [2, L, num_blocks, bs, Hkv, D] staging tensor of one direction (a view of a
        flat buffer grown by doubling): a contiguous pinned source or target is what makes a copy
        asynchronous and fast; a strided one would be staged again through pageable memory."""
        shape = list(self.cpu_cache.shape)
        shape[2] = num_blocks
        numel = 1
        for n in shape:
            numel *= n
        buf = self._staging.get(direction)
        if buf is None or buf.numel() < numel:
            size = max(numel, 2 * (buf.numel() if buf is not None else 0))
            buf = self._staging[direction] = torch.empty(size, dtype=self.dtype, pin_memory=True)
        return buf[:numel].view(shape)
