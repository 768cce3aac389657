"""How many KV-cache blocks fit on a GPU after the weights (the scheduler's `num_kvcache_blocks`).

Per GPU, with tensor parallelism of degree tp:
    budget_bytes = memory_gib * 2**30 * gpu_memory_utilization - weight_bytes / tp - activation_reserve_gib * 2**30
    block_bytes  = block_size * 2 * num_layers * kv_heads_per_gpu * head_dim * dtype_bytes
    num_blocks   = floor(budget_bytes / block_bytes)
kv_heads_per_gpu = num_kv_heads / tp, or 1 when tp exceeds the KV heads (each GPU then holds a
replica of one head, as vLLM does); both rules are engine.core.kv_layout's. Every GPU holds the
same block ids, so the result is the block count of the whole replica. Weights split evenly
across GPUs (norms, replicated in practice, are a few KB). `activation_reserve_gib` stands for the forward pass's peak
activations and the allocator's slack, which the engine measures at start-up.

Host side: the swap space and the prefix cache's CPU tier hold blocks of the same size in host
memory; `cpu_tier_blocks` converts a tier given in GiB (`cpu_cache_gib`) to blocks, and `check_host_blocks`
refuses more than the hardware's host memory per GPU.
"""
from __future__ import annotations

from engine.core.kv_layout import cpu_cache_blocks, gib_floor, kv_block_bytes, kv_heads_per_rank
from sim.specs.hardware import HardwareSpec
from sim.specs.models import ModelSpec


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel_size: int) -> int:
    tp = tensor_parallel_size
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp!r}")
    if model.num_q_heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide {model.name}'s num_q_heads={model.num_q_heads}")
    return kv_heads_per_rank(model.num_kv_heads, tp, f"{model.name}'s num_kv_heads")


def block_bytes_per_gpu(model: ModelSpec, block_size: int, tensor_parallel_size: int) -> int:
    """Bytes of one KV block on one GPU (K and V of every layer)."""
    return kv_block_bytes(block_size, model.num_layers, kv_heads_per_gpu(model, tensor_parallel_size),
                          model.head_dim, model.dtype_bytes)


def check_host_blocks(model: ModelSpec, hardware: HardwareSpec, block_size: int, tensor_parallel_size: int,
                      num_cpu_blocks: int, cpu_cache_num_blocks: int, cpu_cache_gib: float | None = None) -> None:
    """ValueError naming cpu_cache_num_blocks (cpu_cache_gib when the tier was sized in GiB, cpu_cache_num_blocks
    then the blocks it resolved to) when swap space + CPU tier exceed the host memory per GPU
    (hardware.host_memory_gib; unchecked when None)."""
    if hardware.host_memory_gib is None or not cpu_cache_num_blocks:
        return
    block = block_bytes_per_gpu(model, block_size, tensor_parallel_size)
    need = (num_cpu_blocks + cpu_cache_num_blocks) * block
    have = hardware.host_memory_gib * 2**30
    if need > have:
        fit = max(0, int(have // block) - num_cpu_blocks)
        if cpu_cache_gib is not None:
            raise ValueError(f"cpu_cache_gib={cpu_cache_gib:g} ({cpu_cache_num_blocks} blocks of {model.name} KV, plus "
                             f"{num_cpu_blocks * block / 2**30:.1f} GiB of swap space) exceeds the "
                             f"{hardware.host_memory_gib:g} GiB of host memory per GPU of {hardware.name} "
                             f"(hardware.host_memory_gib); use cpu_cache_gib <= {gib_floor(fit * block)}")
        raise ValueError(f"cpu_cache_num_blocks={cpu_cache_num_blocks} ({cpu_cache_num_blocks * block / 2**30:.1f} GiB "
                         f"of {model.name} KV, plus {num_cpu_blocks * block / 2**30:.1f} GiB of swap space) exceeds "
                         f"the {hardware.host_memory_gib:g} GiB of host memory per GPU of {hardware.name} "
                         f"(hardware.host_memory_gib); use cpu_cache_num_blocks <= {fit}")


def cpu_tier_blocks(model: ModelSpec, block_size: int, tensor_parallel_size: int, cpu_cache_num_blocks: int,
                    cpu_cache_gib: float | None) -> int:
    """The CPU tier's blocks per replica: cpu_cache_num_blocks, or the blocks of this model's KV (per GPU) that
    fit in cpu_cache_gib GiB (engine.core.kv_layout.cpu_cache_blocks: not both)."""
    return cpu_cache_blocks(cpu_cache_num_blocks, cpu_cache_gib,
                            block_bytes_per_gpu(model, block_size, tensor_parallel_size))


def num_kv_blocks(model: ModelSpec, hardware: HardwareSpec, block_size: int = 16,
                  gpu_memory_utilization: float = 0.9, tensor_parallel_size: int = 1,
                  activation_reserve_gib: float = 1.0) -> int:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if activation_reserve_gib < 0:
        raise ValueError(f"activation_reserve_gib must be >= 0, got {activation_reserve_gib!r}")
    block_bytes = block_bytes_per_gpu(model, block_size, tensor_parallel_size)
    usable = hardware.memory_gib * 2**30 * gpu_memory_utilization
    weights = model.weight_bytes / tensor_parallel_size
    budget = usable - weights - activation_reserve_gib * 2**30
    blocks = int(budget // block_bytes)
    if blocks < 1:
        raise ValueError(
            f"{model.name} does not fit on {hardware.name} with tensor_parallel_size={tensor_parallel_size}: "
            f"{usable / 2**30:.1f} GiB usable (gpu_memory_utilization={gpu_memory_utilization}) minus "
            f"{weights / 2**30:.1f} GiB weights per GPU minus {activation_reserve_gib} GiB activations leaves "
            f"no room for one {block_bytes / 2**20:.2f} MiB KV block; raise tensor_parallel_size or "
            f"gpu_memory_utilization, or choose a larger GPU")
    return blocks
