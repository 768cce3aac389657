"""Typed schemas of the Hydra config (registered in Hydra's ConfigStore).

`conf/config.yaml` lists `servelab_schema` first in its defaults, so the
composed config is checked against `ServelabConfig`: a misspelt top-level key,
model key or hardware key fails at composition with Hydra's "Key 'x' not in
'ModelConfig'" error, and a wrong type ("max_num_seqs=lots") fails too.
Behaviour groups (backend, scheduler, eviction, router, workload) are `_target_`
nodes, typed `Any` here; their constructors reject unknown keys.

Data groups:
  model/     `name` is a sim.specs model (qwen3_8b, Qwen3-8B, ...); any dimension
             given overrides the published one, and a model sim.specs does not
             know needs all of them.
  hardware/  `name` is a sim.specs GPU (h200, h100_sxm, a100_80gb, l40s); rates
             given override the datasheet.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from engine.config import EngineConfig


@dataclass
class ModelConfig:
    name: str = MISSING                         # sim.specs model name (case/punctuation-insensitive)
    hf_repo: Optional[str] = None               # Hugging Face checkpoint id, for the engine backend
    num_layers: Optional[int] = None
    hidden_size: Optional[int] = None
    num_q_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    intermediate_size: Optional[int] = None
    vocab_size: Optional[int] = None
    tie_word_embeddings: Optional[bool] = None
    dtype_bytes: Optional[int] = None
    max_model_len: Optional[int] = None         # longest sequence the model accepts (positions)

    def to_spec(self):
        """The sim.specs.ModelSpec this entry names, with the given dimensions overriding."""
        from sim.specs.models import ModelSpec, get_model_spec
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name not in ("name", "hf_repo") and getattr(self, f.name) is not None}
        try:
            base = get_model_spec(self.name)
        except ValueError:
            required = [f.name for f in dataclasses.fields(ModelSpec) if f.default is dataclasses.MISSING
                        and f.name != "name"]
            missing = [k for k in required if k not in given]
            if missing:
                raise ValueError(f"model.name={self.name!r} is not a known model and model.{missing[0]} "
                                 f"(and {missing[1:]}) are not given; use a known name (conf/model/*.yaml) or "
                                 f"give every dimension: {required}") from None
            return ModelSpec(name=self.name, **given)
        return dataclasses.replace(base, **given) if given else base


@dataclass
class HardwareConfig:
    name: str = MISSING                         # sim.specs GPU name (case/punctuation-insensitive)
    peak_bf16_tflops: Optional[float] = None
    hbm_bandwidth_gbps: Optional[float] = None
    memory_gib: Optional[float] = None
    host_link_gbps: Optional[float] = None
    interconnect_gbps: Optional[float] = None
    measured_matmul_tflops: Optional[float] = None
    measured_copy_gbps: Optional[float] = None
    host_memory_gib: Optional[float] = None     # host RAM per GPU: the ceiling of swap space + CPU tier

    def to_spec(self):
        from sim.specs.hardware import get_hardware_spec
        base = get_hardware_spec(self.name)
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "name" and getattr(self, f.name) is not None}
        return dataclasses.replace(base, **given) if given else base


@dataclass
class ServelabConfig:
    """The whole run: one serving setup, one workload, one root seed."""
    name: str = "default"                       # names the sweep folder (sweeps/<name>/...)
    seed: int = 0                               # root seed: workload streams and prompt tokens derive from it
    # serving instance (per replica)
    num_replicas: int = 1
    tensor_parallel_size: int = EngineConfig.tensor_parallel_size
    block_size: int = EngineConfig.block_size   # tokens per KV block
    num_kvcache_blocks: Optional[int] = None    # None: what fits in GPU memory; an int forces memory pressure
    gpu_memory_utilization: float = EngineConfig.gpu_memory_utilization   # used when num_kvcache_blocks is None
    activation_reserve_gib: float = 1.0         # used when num_kvcache_blocks is None
    # host memory for swapped KV, per replica: vLLM's default here; the engine's Python API
    # (EngineConfig) allocates none unless asked
    swap_space_gib: float = 4.0
    num_cpu_blocks: Optional[int] = None        # None: from swap_space_gib
    # CPU tier of the prefix cache, per replica: host blocks that keep KV the GPU prefix cache evicts (0: none)
    cpu_cache_num_blocks: int = EngineConfig.cpu_cache_num_blocks
    # the same tier in GiB of host memory instead (None: sized by cpu_cache_num_blocks; not both), converted with
    # the model's KV block bytes
    cpu_cache_gib: Optional[float] = EngineConfig.cpu_cache_gib
    cpu_cache_eviction: str = "lru"             # the tier's eviction policy: a policies/eviction name
    # evicted blocks offloaded per step at most (the rest dropped)
    cpu_cache_max_offload_blocks: int = EngineConfig.cpu_cache_max_offload_blocks
    max_num_seqs: int = EngineConfig.max_num_seqs
    # tokens per step; None: derived (engine/core/token_budget.py): max(max_model_len, 8192) with chunked prefill
    # off, 8192 with it on
    max_num_batched_tokens: Optional[int] = None
    # prompt + output; longer requests are clipped (workload.too_long). None: the model's context window in
    # the simulator (sim.specs), the engine's limit for the checkpoint on backend=engine
    max_model_len: Optional[int] = None
    enable_chunked_prefill: bool = EngineConfig.enable_chunked_prefill
    enable_prefix_caching: bool = EngineConfig.enable_prefix_caching
    # schedule each step while the previous one runs (docs/overlap.md): the engine's loop, and the simulator's
    # replicas, which then time a step's host and device parts as that loop runs them (sim/overlap_timeline.py)
    overlap_scheduling: bool = EngineConfig.overlap_scheduling
    # goodput SLOs (seconds; None = no limit)
    ttft_slo_s: Optional[float] = None
    tpot_slo_s: Optional[float] = None
    e2e_slo_s: Optional[float] = None
    # outputs
    resume: bool = True                         # skip a job whose output dir holds a complete summary.json
    plots: bool = True
    progress: bool = True                       # tqdm bar over requests
    print_summary: bool = True
    record_token_times: bool = False            # per-token times (ITL statistics); costs memory
    # config groups
    backend: Any = MISSING
    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    scheduler: Any = MISSING
    eviction: Any = MISSING
    router: Any = MISSING
    workload: Any = MISSING


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="servelab_schema", node=ServelabConfig)


register_configs()
