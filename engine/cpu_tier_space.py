"""Host memory of the prefix cache's CPU tier, and the block copies between it and the GPU KV cache.

    tier = CpuTierSpace(num_blocks, (L, bs, Hkv, D), dtype, device)
    tier.offload(kv_cache, [(gpu_block, tier_block), ...])    # before the forward pass
    tier.load(kv_cache, [(tier_block, gpu_block), ...])       # before the forward pass, after offload
    tier.finish()                                             # after launching the forward pass

The bookkeeping is the block manager's (engine.core.cpu_cache); this moves bytes. Layout:
block-major [num_blocks, 2 (k|v), L, bs, Hkv, D], pinned on CUDA, so a tier block is one
contiguous span of host memory and a run of consecutive tier blocks is one cudaMemcpyAsync,
with no host-side gather or scatter (the swap space, engine/swap_space.py, keeps the GPU
cache's layout and stages through pinned buffers instead).

Offload (CUDA): blocks are gathered on the compute stream into a device staging buffer (the
forward pass may overwrite them once gathered), and a side stream copies the buffer to host
memory while the compute stream runs the loads and the forward pass; `finish` waits for the
side stream. Staging is two buffers of STAGING_BLOCKS blocks, allocated once: a larger offload
is gathered chunk by chunk, each chunk waiting until the transfer of the chunk two before it
left its buffer, so the forward pass overlaps the last two chunks' transfer and the step lasts
about gather + transfer beyond those two chunks + max(loads + forward, their transfer)
(sim.cost_model.roofline prices it so). Load: one host->device copy per run of tier blocks into
a device buffer on the compute stream, then a scatter into the cache; the forward pass follows
in stream order. On CPU the same copies run synchronously. Copies only: round trips are
bit-exact.

Ordering the block manager guarantees: within a step no tier block is both offloaded and
loaded, or offloaded twice, and no GPU block is loaded into and offloaded.
"""
from __future__ import annotations

import torch

from engine.core.kv_layout import gib_floor, kv_block_bytes

STAGING_BLOCKS = 256        # blocks per device staging buffer (two of them; 0.9 GiB of Qwen3-0.6B KV in all)
GIB = 1 << 30


def host_memory_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def block_runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """(position in ids, first id, length) of each run of consecutive ids."""
    runs = []
    i, n = 0, len(ids)
    while i < n:
        j = i + 1
        while j < n and ids[j] == ids[j - 1] + 1:
            j += 1
        runs.append((i, ids[i], j - i))
        i = j
    return runs


class CpuTierSpace:
    def __init__(self, num_blocks: int, block_shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device, staging_blocks: int = STAGING_BLOCKS, other_host_bytes: int = 0,
                 cpu_cache_gib: float | None = None):
        """block_shape (num_layers, block_size, num_kv_heads, head_dim). Checks the host memory first, with
        other_host_bytes (the swap space) beside the tier (check_host_memory), and allocates nothing when it
        is short. cpu_cache_gib: the size the user gave num_blocks in (the error then names that setting)."""
        self.device, self.dtype = device, dtype
        self.num_blocks = num_blocks
        self.is_cuda = device.type == "cuda"
        self.block_shape = (2, block_shape[0], *block_shape[1:])           # one block, block-major
        self.block_bytes = kv_block_bytes(block_shape[1], block_shape[0], block_shape[2], block_shape[3],
                                          torch.empty((), dtype=dtype).element_size())
        self.check_host_memory(other_host_bytes, cpu_cache_gib)
        # empty: a tier block is read only after an offload wrote it (engine/swap_space.py says why)
        self.host = torch.empty(num_blocks, *self.block_shape, dtype=dtype, device="cpu",
                                pin_memory=self.is_cuda and num_blocks > 0)
        self.stream = None
        self._staging: list[torch.Tensor] = []
        self._events: list = [None, None]          # per staging buffer: its transfer in flight
        if self.is_cuda and num_blocks > 0:
            self.stream = torch.cuda.Stream(device)
            n = min(staging_blocks, num_blocks)
            self._staging = [torch.empty(n, *self.block_shape, dtype=dtype, device=device) for _ in range(2)]

    def offload(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Copies GPU blocks to tier blocks, (gpu_block, tier_block) pairs; on CUDA the transfer runs on the
        side stream until finish()."""
        if not pairs:
            return
        pairs = sorted(pairs, key=lambda p: p[1])      # by tier block: longer runs of consecutive blocks
        if not self.is_cuda:
            src = torch.tensor([g for g, _ in pairs], dtype=torch.int64)
            gathered = kv_cache.index_select(2, src).permute(2, 0, 1, 3, 4, 5)    # [n, 2, L, bs, Hkv, D]
            for i, c, k in block_runs([c for _, c in pairs]):
                self.host[c:c + k].copy_(gathered[i:i + k])
            return
        compute = torch.cuda.current_stream(self.device)
        chunk = len(self._staging[0])
        for n0 in range(0, len(pairs), chunk):
            part = pairs[n0:n0 + chunk]
            b = (n0 // chunk) % 2
            buf = self._staging[b][:len(part)]
            if self._events[b] is not None:
                compute.wait_event(self._events[b])  # the buffer's previous transfer has left it
            src = torch.tensor([g for g, _ in part], dtype=torch.int64).to(self.device)
            buf.copy_(kv_cache.index_select(2, src).permute(2, 0, 1, 3, 4, 5))
            self.stream.wait_stream(compute)
            with torch.cuda.stream(self.stream):
                for i, c, k in block_runs([c for _, c in part]):
                    self.host[c:c + k].copy_(buf[i:i + k], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            self._events[b] = ev

    def load(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Copies tier blocks into GPU blocks, (tier_block, gpu_block) pairs, before the forward pass (in
        stream order on CUDA)."""
        if not pairs:
            return
        pairs = sorted(pairs)
        dst = torch.tensor([g for _, g in pairs], dtype=torch.int64)
        if not self.is_cuda:
            buf = torch.empty(len(pairs), *self.block_shape, dtype=self.dtype)
        else:
            dst = dst.to(self.device, non_blocking=True)
            buf = torch.empty(len(pairs), *self.block_shape, dtype=self.dtype, device=self.device)
        for i, c, k in block_runs([c for c, _ in pairs]):
            buf[i:i + k].copy_(self.host[c:c + k], non_blocking=self.is_cuda)
        kv_cache.index_copy_(2, dst, buf.permute(1, 2, 0, 3, 4, 5))

    def check_host_memory(self, other_bytes: int = 0, cpu_cache_gib: float | None = None) -> None:
        """ValueError naming cpu_cache_num_blocks (cpu_cache_gib when the tier was sized in GiB) when the tier
        plus other_bytes (the swap space) would not fit in the host memory available now (Linux MemAvailable;
        unchecked where it cannot be read)."""
        available = host_memory_available_bytes()
        need = self.num_blocks * self.block_bytes + other_bytes
        if available is not None and self.num_blocks and need > available:
            fit = max(0, (available - other_bytes) // self.block_bytes)
            tier_gib = self.num_blocks * self.block_bytes / GIB
            if cpu_cache_gib is not None:
                raise ValueError(f"cpu_cache_gib={cpu_cache_gib:g} ({self.num_blocks} blocks) needs {tier_gib:.1f} "
                                 f"GiB of host memory (plus {other_bytes / GIB:.1f} GiB of swap space), "
                                 f"{available / GIB:.1f} GiB are available; use cpu_cache_gib <= "
                                 f"{gib_floor(fit * self.block_bytes)}")
            raise ValueError(f"cpu_cache_num_blocks={self.num_blocks} needs {tier_gib:.1f} GiB of host memory "
                             f"(plus {other_bytes / GIB:.1f} GiB of swap space), "
                             f"{available / GIB:.1f} GiB are available; use cpu_cache_num_blocks <= {fit}")

    def finish(self) -> None:
        """Waits for the offloads in flight (CUDA); after it the tier's host memory holds them."""
        for b, ev in enumerate(self._events):
            if ev is not None:
                ev.synchronize()
                self._events[b] = None
