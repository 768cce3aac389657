"""Tensor parallelism's process group and collectives (torch.distributed: NCCL on CUDA, gloo on CPU).

The layers call all_reduce (after each row-parallel layer and the embedding) and gather_to_first
(the LM head's logits to rank 0) only when tp_size > 1; the worker processes that hold ranks
1..tp-1 are engine/workers.py. NVLink multicast (NCCL's NVLS, torch's symmetric-memory multicast,
NVSHMEM's NVLS) is switched off in every rank's environment before any communicator exists.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast() -> None:
    os.environ.update(MULTICAST_OFF)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


# -- collectives (called by layers only when tp_size > 1) -----------------------------------
def all_reduce(x: Tensor) -> Tensor:
    """In-place sum over ranks; returns x."""
    dist.all_reduce(x)
    return x


def gather_to_first(x: Tensor, tp_rank: int, tp_size: int) -> list[Tensor] | None:
    """Every rank's x (same shape) on rank 0, in rank order; None on the other ranks."""
    parts = [torch.empty_like(x) for _ in range(tp_size)] if tp_rank == 0 else None
    dist.gather(x, parts, dst=0)
    return parts


def all_reduce_min(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


# -- process group ----------------------------------------------------------------------------
def join_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float) -> None:
    disable_multicast()
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s))


def destroy_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
