"""Hydra config: every group option composes and builds; schemas reject misspelt keys and bad types."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf

import experiments.config  # noqa: F401  (registers the schema)
from experiments.config import HardwareConfig, ModelConfig
from experiments.runner_sim import build_workload, kv_capacity, make_cost_model, make_scheduler
from sim.specs import get_hardware_spec, get_model_spec
from tests.helpers import trace_file

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
TRACE_FILES = {"azure": "AzureLLMInferenceTrace_conv.csv", "azure_conv": "splitwise_conv.csv",
               "mooncake": "conversation_trace.jsonl", "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"}


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture(autouse=True, scope="module")
def hydra_conf():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


def make_cfg(overrides=(), hydra_cfg=False):
    return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def test_groups_have_the_expected_options():
    assert set(options("model")) >= {"qwen3_0p6b", "qwen3_8b", "llama3_8b"}
    assert options("hardware") == ["a100_80gb", "h100_sxm", "h200", "l40s"]
    assert options("backend") == ["engine", "http", "sim"]
    assert options("backend/cost_model") == ["calibrated", "constant", "roofline"]
    assert set(options("workload")) >= {"poisson", "gamma", "all_at_once", "azure", "azure_conv", "mooncake",
                                        "sharegpt"}
    assert options("hydra/launcher") == ["local", "slurm", "submitit_local"]


def test_default_config_values():
    cfg = make_cfg()
    assert (cfg.model.name, cfg.hardware.name, cfg.backend.name) == ("Qwen3-8B", "H200", "sim")
    assert cfg.workload.num_requests == 2000 and cfg.num_kvcache_blocks is None and cfg.seed == 0
    assert cfg.scheduler._target_ == "policies.scheduling.vllm.VLLMPolicy"


@pytest.mark.parametrize("name", options("model"))
def test_model_options_name_a_spec(name):
    cfg = make_cfg([f"model={name}"])
    spec = ModelConfig(**OmegaConf.to_container(cfg.model)).to_spec()
    assert spec is get_model_spec(name)          # the file name is an alias of the same spec


@pytest.mark.parametrize("name", options("hardware"))
def test_hardware_options_name_a_spec(name):
    cfg = make_cfg([f"hardware={name}"])
    assert HardwareConfig(**OmegaConf.to_container(cfg.hardware)).to_spec() is get_hardware_spec(name)


def test_model_and_hardware_overrides_replace_published_values():
    cfg = make_cfg(["model.num_layers=4", "hardware.memory_gib=40"])
    spec = ModelConfig(**OmegaConf.to_container(cfg.model)).to_spec()
    assert spec.num_layers == 4 and spec.hidden_size == get_model_spec("qwen3_8b").hidden_size
    assert HardwareConfig(**OmegaConf.to_container(cfg.hardware)).to_spec().memory_gib == 40.0


def test_unknown_model_needs_all_dimensions():
    with pytest.raises(ValueError, match="not a known model"):
        ModelConfig(name="my-model", num_layers=2).to_spec()


@pytest.mark.parametrize("overrides", [["model.nmae=Qwen3-8B"], ["hardware.hbm_bandwidth=1"], ["sede=3"],
                                       ["max_num_seqs=lots"], ["num_kvcache_blocks=many"]])
def test_schema_rejects_misspelt_keys_and_bad_types(overrides):
    with pytest.raises(ConfigCompositionException):
        make_cfg(overrides)


def test_schema_rejects_misspelt_key_in_a_user_model_file(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("name: Qwen3-8B\nnum_layer: 4\n")   # num_layers misspelt
    with pytest.raises(ConfigCompositionException, match="mine"):
        make_cfg([f"hydra.searchpath=[file://{tmp_path}]", "model=mine"])


@pytest.mark.parametrize("cost_model", options("backend/cost_model"))
def test_cost_model_options_build(cost_model):
    extra = ([f"backend.cost_model.profile={ROOT / 'benchmarks/results/profile_h200_qwen3_0p6b.json'}"]
             if cost_model == "calibrated" else [])
    cfg = make_cfg([f"backend/cost_model={cost_model}", "model=qwen3_0p6b", *extra])
    model, hw = get_model_spec("qwen3_0p6b"), get_hardware_spec("h200")
    cm = make_cost_model(cfg, model, hw)
    assert type(cm).__name__.lower().startswith(cost_model)
    assert cm.step_time_from_shape([100], [100], 4, 400) > 0


@pytest.mark.parametrize("group", ["scheduler", "eviction", "router"])
def test_behaviour_options_instantiate(group):
    for name in options(group):
        obj = instantiate(make_cfg([f"{group}={name}"])[group], _convert_="all")
        assert obj is not None, name


@pytest.mark.parametrize("scheduler", options("scheduler"))
def test_every_scheduler_builds_a_scheduler(scheduler):
    cfg = make_cfg([f"scheduler={scheduler}", "model=qwen3_0p6b"])
    gpu, cpu = kv_capacity(cfg, get_model_spec("qwen3_0p6b"), get_hardware_spec("h200"))
    assert gpu > 1000 and cpu > 0           # swap space from swap_space_gib: vllm_swap works by default
    sched = make_scheduler(cfg, gpu, cpu)
    assert sched.config.num_kvcache_blocks == gpu


def test_kv_capacity_forced_blocks():
    cfg = make_cfg(["num_kvcache_blocks=123", "num_cpu_blocks=7"])
    assert kv_capacity(cfg, get_model_spec("qwen3_8b"), get_hardware_spec("h200")) == (123, 7)


@pytest.mark.parametrize("workload", ["poisson", "gamma", "all_at_once"])
@pytest.mark.parametrize("lengths", ["sharegpt_like", "fixed", "uniform"])
def test_synthetic_workloads_build(workload, lengths):
    cfg = make_cfg([f"workload={workload}", f"workload/prompt_len={lengths}", f"workload/output_len={lengths}",
                    "workload.num_requests=40", "max_model_len=4096"])
    wl = build_workload(cfg)
    assert len(wl) == 40 and wl.arrival_time_s[0] == 0.0
    assert (wl.num_prompt_tokens + wl.num_output_tokens).max() <= cfg.max_model_len
    again = build_workload(cfg)                  # the root seed makes it reproducible
    assert (again.num_prompt_tokens == wl.num_prompt_tokens).all()
    other = build_workload(make_cfg([f"workload={workload}", f"workload/prompt_len={lengths}",
                                     f"workload/output_len={lengths}", "workload.num_requests=40", "seed=1"]))
    if lengths != "fixed":
        assert (other.num_prompt_tokens != wl.num_prompt_tokens).any()


@pytest.mark.parametrize("workload", sorted(TRACE_FILES))
def test_trace_workloads_need_a_path(workload):
    cfg = make_cfg([f"workload={workload}"])
    with pytest.raises(ValueError, match=r"workload\.path is null"):
        build_workload(cfg)


@pytest.mark.parametrize("workload", sorted(TRACE_FILES))
def test_trace_workloads_read_the_shared_files(workload):
    path = trace_file(TRACE_FILES[workload])
    extra = ["workload.num_requests=30"] if workload == "sharegpt" else ["workload.max_requests=30"]
    wl = build_workload(make_cfg([f"workload={workload}", f"workload.path={path}"] + extra))
    assert len(wl) == 30


def test_length_file_option_needs_a_path():
    cfg = make_cfg(["workload/prompt_len=file"])
    with pytest.raises(ValueError, match=r"workload\.prompt_len\.path is null"):
        build_workload(cfg)


@pytest.mark.parametrize("name", options("experiment"))
def test_experiments_compose(name):
    cfg = make_cfg([f"experiment={name}"], hydra_cfg=True)
    assert cfg.name == name
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")   # experiments never choose a launcher


def test_fcfs_vs_preemptive_is_a_memory_constrained_sweep():
    cfg = make_cfg(["experiment=fcfs_vs_preemptive"], hydra_cfg=True)
    params = cfg.hydra.sweeper.params
    assert params.scheduler.split(",") == ["fcfs", "vllm", "vllm_swap", "srpt", "mlfq"]
    assert len(str(params["workload.target_rate_rps"]).split(",")) >= 5
    assert cfg.num_kvcache_blocks == 2048 and cfg.workload._target_.endswith("read_azure_trace")


@pytest.mark.parametrize("name", options("sweep"))
def test_sweeps_compose(name):
    cfg = make_cfg([f"sweep={name}"], hydra_cfg=True)
    assert cfg.hydra.sweep.dir == f"sweeps/{name}" and cfg.hydra.sweeper.params


@pytest.mark.parametrize("launcher", options("hydra/launcher"))
def test_launchers_compose(launcher):
    cfg = make_cfg([f"hydra/launcher={launcher}"], hydra_cfg=True)
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


def test_engine_backend_composes():
    cfg = make_cfg(["backend=engine", "backend.model_path=/models/qwen3"])
    assert set(cfg.backend) == {"name", "model_path", "device", "attention_backend", "enforce_eager", "dtype",
                               "temperature", "fused_qk_norm_rope_store"}
