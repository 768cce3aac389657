"""EngineConfig: everything the real engine (runner + scheduler) is built from. Torch-free.

Fields left None are derived at start-up from the checkpoint and the device (see resolve()). The
scheduler's settings carry SchedulerConfig's names and defaults; the LLM builds its SchedulerConfig
from this one (SchedulerConfig.from_settings).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from engine.core.kv_layout import check_block_size, check_cpu_cache_size, kv_split_problem
from engine.core.scheduler import SchedulerConfig
from engine.core.token_budget import resolve_max_num_batched_tokens

DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")
MAX_TENSOR_PARALLEL_SIZE = 8


def tensor_parallel_problem(tp: int, num_attention_heads: int, num_key_value_heads: int,
                            intermediate_size: int) -> str | None:
    """Why the model cannot be split across tp ranks, or None when it can.

    Query heads and the MLP's intermediate dim are split evenly; KV heads by engine.core.kv_layout's rule.
    """
    if num_attention_heads % tp:
        return f"tensor_parallel_size={tp} must divide num_attention_heads={num_attention_heads}"
    problem = kv_split_problem(num_key_value_heads, tp)
    if problem:
        return problem
    if intermediate_size % tp:
        return f"tensor_parallel_size={tp} must divide intermediate_size={intermediate_size}"
    return None


@dataclass
class EngineConfig:
    model_path: str                              # checkpoint directory (config.json + *.safetensors)
    device: str = "auto"                         # "auto" (cuda if available), "cuda", "cuda:N", "cpu"
    dtype: str = "auto"                          # "auto": config.json's dtype on CUDA, float32 on CPU
    attention_backend: str = "auto"              # see engine/layers/attention_backends
    block_size: int = SchedulerConfig.block_size  # tokens per KV block (power of two)
    num_kvcache_blocks: int | None = None        # None: from gpu_memory_utilization (CUDA) or cpu_kvcache_gib (CPU)
    gpu_memory_utilization: float = 0.9          # fraction of GPU memory the engine may use in total
    cpu_kvcache_gib: float = 1.0                 # CPU only: KV cache size when num_kvcache_blocks is None
    num_cpu_blocks: int | None = None            # swap space in blocks; None: from swap_space_gib
    swap_space_gib: float = 0.0                  # host memory for swapped-out KV blocks (0 = no swapping)
    # CPU tier of the prefix cache in host blocks (0 = none), or in GiB of host memory (None: by blocks; converted
    # with the checkpoint's KV block bytes, engine.core.kv_layout), and the evicted blocks offloaded to it per step
    cpu_cache_num_blocks: int = SchedulerConfig.cpu_cache_num_blocks
    cpu_cache_gib: float | None = None
    cpu_cache_max_offload_blocks: int = SchedulerConfig.cpu_cache_max_offload_blocks
    max_num_seqs: int = SchedulerConfig.max_num_seqs
    max_num_batched_tokens: int | None = None    # None: derived from max_model_len (engine.core.token_budget)
    max_model_len: int | None = None             # None: min(4096, max_position_embeddings)
    enable_chunked_prefill: bool = SchedulerConfig.enable_chunked_prefill
    enable_prefix_caching: bool = SchedulerConfig.enable_prefix_caching
    enforce_eager: bool = False                  # True: no CUDA graphs (always off on CPU)
    prefill_graph_max_tokens: int = 8192         # steps with prefill of up to this many tokens replay a CUDA
                                                 # graph (engine/prefill_graphs.py); 0: they run eagerly
    # torch.compile the elementwise layer parts; None: on CUDA unless enforce_eager
    compile_layers: bool | None = None
    # triton and flash_attn backends: q/k RMSNorm, RoPE and the KV-cache store as one kernel
    # (engine/kernels/qk_norm_rope_store.py) instead of three; False: the separate kernels. torch ignores it
    fused_qk_norm_rope_store: bool = True
    seed: int = 0                                # generator of unseeded sampled requests
    # schedule and prepare step N+1 while the device runs step N (docs/overlap.md); tensor_parallel_size 1 only
    overlap_scheduling: bool = False
    tensor_parallel_size: int = 1                # GPUs (processes) one model is split across, 1..8, one host
    distributed_timeout_s: float = 600.0         # tensor parallel only: a collective waiting longer raises

    def __post_init__(self):
        if not (self.device in DEVICES or self.device.startswith("cuda:")):
            raise ValueError(f"device must be one of {DEVICES} or 'cuda:N', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        check_block_size(self.block_size)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kvcache_blocks is not None and self.num_kvcache_blocks < 1:
            raise ValueError(f"num_kvcache_blocks must be >= 1 or None (derive), got {self.num_kvcache_blocks}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0 or None (derive from swap_space_gib), "
                             f"got {self.num_cpu_blocks}")
        if self.cpu_cache_num_blocks < 0:
            raise ValueError(f"cpu_cache_num_blocks must be >= 0 (0: no CPU tier), got {self.cpu_cache_num_blocks}")
        check_cpu_cache_size(self.cpu_cache_num_blocks, self.cpu_cache_gib)
        if self.cpu_cache_max_offload_blocks < 0:
            raise ValueError(f"cpu_cache_max_offload_blocks must be >= 0 (blocks offloaded per step), got "
                             f"{self.cpu_cache_max_offload_blocks}")
        if self.swap_space_gib < 0 or self.cpu_kvcache_gib <= 0:
            raise ValueError(f"swap_space_gib must be >= 0 and cpu_kvcache_gib > 0, got "
                             f"{self.swap_space_gib} and {self.cpu_kvcache_gib}")
        if self.max_num_seqs < 1 or (self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1):
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got "
                             f"{self.max_num_seqs} and {self.max_num_batched_tokens}")
        if self.prefill_graph_max_tokens < 0:
            raise ValueError(f"prefill_graph_max_tokens must be >= 0 (0: prefill steps run eagerly), "
                             f"got {self.prefill_graph_max_tokens}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1 or None, got {self.max_model_len}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TENSOR_PARALLEL_SIZE:
            raise ValueError(f"tensor_parallel_size must be an int in 1..{MAX_TENSOR_PARALLEL_SIZE} (one process per "
                             f"GPU of one host), got {tp!r}")
        if self.overlap_scheduling and tp != 1:
            raise ValueError(f"overlap_scheduling needs tensor_parallel_size=1 (the worker ranks would need the "
                             f"previous step's sampled tokens), got {tp}; set overlap_scheduling=False")
        if not self.distributed_timeout_s > 0:
            raise ValueError(f"distributed_timeout_s must be > 0 seconds, got {self.distributed_timeout_s}")

    def check_tensor_parallel(self, hf_config: dict) -> None:
        """ValueError naming the sizes this checkpoint (config.json dict) can be split into, if tp is not one."""
        heads = hf_config.get("num_attention_heads")
        inter = hf_config.get("intermediate_size")
        if self.tensor_parallel_size == 1 or heads is None or inter is None:
            return
        kv = hf_config.get("num_key_value_heads") or heads
        problem = tensor_parallel_problem(self.tensor_parallel_size, heads, kv, inter)
        if problem:
            ok = [t for t in range(1, MAX_TENSOR_PARALLEL_SIZE + 1)
                  if tensor_parallel_problem(t, heads, kv, inter) is None]
            raise ValueError(f"{problem}; set tensor_parallel_size to one of {ok} for this model")

    @classmethod
    def from_kwargs(cls, model_path: str, **kwargs) -> "EngineConfig":
        """cls(model_path, **kwargs) with a clear error for unknown keys."""
        names = {f.name for f in fields(cls)} - {"model_path"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; allowed: {sorted(names)}")
        return cls(model_path=str(model_path), **kwargs)

    @classmethod
    def from_attributes(cls, obj, **given) -> "EngineConfig":
        """cls with each field from `given`, else obj's attribute of the same name where it has one (a
        command's parsed flags), else the default."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; allowed: {names}")
        return cls(**{k: given[k] if k in given else getattr(obj, k) for k in names if k in given or hasattr(obj, k)})

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        """Fills max_model_len from the model (default min(4096, max_position_embeddings)) and checks it."""
        if self.max_model_len is None:
            self.max_model_len = min(4096, max_position_embeddings)
        elif self.max_model_len > max_position_embeddings:
            raise ValueError(f"max_model_len ({self.max_model_len}) exceeds the model's max_position_embeddings "
                             f"({max_position_embeddings}); set max_model_len <= {max_position_embeddings}")
        return self.max_model_len

    def resolve_max_num_batched_tokens(self) -> int:
        """Fills max_num_batched_tokens (engine.core.token_budget's rule) once max_model_len is resolved."""
        if self.max_model_len is None:
            raise ValueError("resolve_max_model_len must run before resolve_max_num_batched_tokens")
        self.max_num_batched_tokens, _ = resolve_max_num_batched_tokens(self.max_num_batched_tokens,
                                                                        self.max_model_len, self.enable_chunked_prefill)
        return self.max_num_batched_tokens
