"""benchmarks/sim_speed.py measures the settings users get: its DEFAULTS are servelab's composed defaults."""
import importlib.util
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import experiments.config  # noqa: F401  (registers the schema)

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("sim_speed", ROOT / "benchmarks" / "sim_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_defaults_are_servelabs():
    d = load_benchmark().DEFAULTS
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["workload=azure"])
    for key in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
                "enable_prefix_caching", "gpu_memory_utilization", "activation_reserve_gib", "seed"):
        assert d[key] == cfg[key], f"benchmarks/sim_speed.py DEFAULTS[{key!r}] = {d[key]!r}, servelab's is {cfg[key]!r}"
    assert cfg.num_kvcache_blocks is None and cfg.num_replicas == 1 and cfg.tensor_parallel_size == 1
    assert cfg.model.name == d["model"]
    assert cfg.hardware.name == d["hardware"]
    assert cfg.scheduler._target_ == "policies.scheduling.vllm.VLLMPolicy" and d["policy"] == "vllm"
    assert cfg.eviction._target_ == "policies.eviction.lru.LRUEviction" and d["eviction"] == "lru"
    assert cfg.workload.too_long == "clip"
    roofline = OmegaConf.to_container(cfg.backend.cost_model)
    assert roofline.pop("_target_") == "sim.cost_model.RooflineCostModel" and roofline.pop("_partial_")
    assert roofline == d["roofline"]
