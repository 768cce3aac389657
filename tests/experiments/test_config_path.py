"""One configuration path: each setting has one name and one default from the Hydra schema down to the
block manager, each layer's dataclass is built once from the layer above, SchedulerConfig in one place."""
import dataclasses
import json
import re
from pathlib import Path

from hydra import compose, initialize_config_dir

from engine.config import EngineConfig
from engine.core.scheduler import SchedulerConfig
from experiments.config import ServelabConfig
from experiments.runner_engine import EngineRunConfig
from experiments.runner_sim import kv_capacity, make_scheduler

ROOT = Path(__file__).resolve().parents[2]

# Settings whose upper layers say "derive it" (None) where the scheduler needs the settled number,
# and the one setting whose defaults differ on purpose (see experiments/config.py).
DERIVED = {"num_kvcache_blocks", "num_cpu_blocks", "max_model_len"}
APART = {"swap_space_gib"}


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def compose_cfg(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_one_default_per_setting():
    from experiments.validate import parse_args
    args = vars(parse_args(["--out-dir", "x"]))
    layers = {"hydra": _defaults(ServelabConfig), "engine": _defaults(EngineConfig),
              "replay": _defaults(EngineRunConfig), "scheduler": _defaults(SchedulerConfig), "validate": args}
    names = (set(layers["replay"]) | set(layers["scheduler"])) - APART     # the engine's and scheduler's settings
    for name in sorted(names):
        values = {k: d[name] for k, d in layers.items() if name in d and not (k == "scheduler" and name in DERIVED)}
        assert len(set(map(repr, values.values()))) == 1, (name, values)
    assert _defaults(EngineRunConfig).keys() >= _defaults(EngineConfig).keys()     # nothing re-listed by hand


def test_scheduler_config_is_built_in_one_place():
    """The backends build it with SchedulerConfig.from_settings; no package file lists its fields by hand."""
    by_hand = [str(p.relative_to(ROOT)) for pkg in ("engine", "sim", "experiments", "policies")
               for p in (ROOT / pkg).rglob("*.py") if re.search(r"\bSchedulerConfig\(", p.read_text())]
    assert by_hand == [], by_hand


def test_engine_run_config_from_the_composed_config():
    cfg = compose_cfg("backend=engine", "backend.model_path=/models/x", "backend.temperature=0.0",
                      "num_kvcache_blocks=77", "max_num_seqs=3", "enable_chunked_prefill=true", "seed=5")
    rcfg = EngineRunConfig.from_config(cfg)
    assert isinstance(rcfg, EngineConfig)
    assert (rcfg.model_path, rcfg.temperature, rcfg.num_kvcache_blocks, rcfg.max_num_seqs,
            rcfg.enable_chunked_prefill, rcfg.seed, rcfg.swap_space_gib) == ("/models/x", 0.0, 77, 3, True, 5, 4.0)
    sched_cfg = SchedulerConfig.from_settings(rcfg, num_kvcache_blocks=77, num_cpu_blocks=0, max_model_len=256)
    assert (sched_cfg.max_num_seqs, sched_cfg.enable_chunked_prefill) == (3, True)


def test_num_kvcache_blocks_keeps_its_name_down_to_the_block_manager():
    from omegaconf import OmegaConf

    from experiments.config import HardwareConfig, ModelConfig
    cfg = compose_cfg("num_kvcache_blocks=123", "num_cpu_blocks=9")
    model = ModelConfig(**OmegaConf.to_container(cfg.model)).to_spec()
    hardware = HardwareConfig(**OmegaConf.to_container(cfg.hardware)).to_spec()
    num_kvcache_blocks, num_cpu_blocks = kv_capacity(cfg, model, hardware)
    sched = make_scheduler(cfg, num_kvcache_blocks, num_cpu_blocks, 4096)
    assert sched.config.num_kvcache_blocks == sched.block_manager.num_kvcache_blocks == 123
    assert sched.view.num_kvcache_blocks == 123 and sched.config.num_cpu_blocks == 9


def test_saved_engine_facts_stay_readable():
    """A real run saved before EngineRunConfig took EngineConfig's fields (the committed ones) loads."""
    meta = ROOT / "benchmarks" / "results" / "real" / "azure_conv_real.json"
    saved = json.loads(meta.read_text())["engine"]
    rcfg = EngineRunConfig(**saved)
    assert (rcfg.model_path, rcfg.num_kvcache_blocks, rcfg.num_cpu_blocks) == (saved["model_path"], 1024, 2048)
    assert dataclasses.asdict(rcfg).items() >= saved.items()


def test_a_setting_missing_from_the_layer_above_is_named():
    import pytest
    above = {"block_size": 16, "max_num_batched_tokens": None, "enable_chunked_prefill": False,
             "enable_prefix_caching": True, "cpu_cache_num_blocks": 0, "cpu_cache_max_offload_blocks": 512}
    with pytest.raises(TypeError, match=r"no setting\(s\) \['max_num_seqs'\]"):
        SchedulerConfig.from_settings(above, num_kvcache_blocks=8, num_cpu_blocks=0, max_model_len=64)


def test_engine_config_from_a_commands_flags():
    """validate and profile build the engine from their flags by name, the rest at the field defaults."""
    from argparse import Namespace

    import pytest
    args = Namespace(max_num_seqs=3, device="cpu", threads=2, grid="small")
    rcfg = EngineRunConfig.from_attributes(args, model_path="/m", num_cpu_blocks=4)
    assert (rcfg.model_path, rcfg.max_num_seqs, rcfg.device, rcfg.num_cpu_blocks) == ("/m", 3, "cpu", 4)
    assert rcfg.block_size == EngineConfig.block_size and rcfg.temperature == EngineRunConfig.temperature
    with pytest.raises(TypeError, match="unknown engine option"):
        EngineConfig.from_attributes(args, model_path="/m", temperature=0.0)


def test_cpu_tier_settings_reach_the_block_manager_from_either_backend():
    """cpu_cache_num_blocks and cpu_cache_max_offload_blocks by name: servelab's config -> the simulator's
    scheduler, and -> EngineRunConfig -> the replay's SchedulerConfig (cpu_cache_eviction picks the tier's policy)."""
    from omegaconf import OmegaConf

    from experiments.config import HardwareConfig, ModelConfig
    cfg = compose_cfg("num_kvcache_blocks=64", "cpu_cache_num_blocks=40", "cpu_cache_max_offload_blocks=3",
                      "cpu_cache_eviction=lfu", "backend=engine", "backend.model_path=/models/x")
    model = ModelConfig(**OmegaConf.to_container(cfg.model)).to_spec()
    hardware = HardwareConfig(**OmegaConf.to_container(cfg.hardware)).to_spec()
    sched = make_scheduler(cfg, *kv_capacity(cfg, model, hardware), 4096)
    bm = sched.block_manager
    assert (bm.cpu_cache.num_blocks, bm.cpu_cache_max_offload_blocks, bm.cpu_cache.eviction.name) == (40, 3, "lfu")
    rcfg = EngineRunConfig.from_config(cfg)
    assert (rcfg.cpu_cache_num_blocks, rcfg.cpu_cache_max_offload_blocks) == (40, 3)
    sched_cfg = SchedulerConfig.from_settings(rcfg, num_kvcache_blocks=64, num_cpu_blocks=0, max_model_len=256)
    assert (sched_cfg.cpu_cache_num_blocks, sched_cfg.cpu_cache_max_offload_blocks) == (40, 3)


def test_fused_qk_norm_rope_store_from_hydra_to_the_decoder_switch():
    """backend.fused_qk_norm_rope_store keeps its name and EngineConfig's default from conf/ to the engine config."""
    assert compose_cfg("backend=engine").backend.fused_qk_norm_rope_store == EngineConfig.fused_qk_norm_rope_store
    cfg = compose_cfg("backend=engine", "backend.model_path=/models/x", "backend.fused_qk_norm_rope_store=false")
    assert EngineRunConfig.from_config(cfg).fused_qk_norm_rope_store is False
