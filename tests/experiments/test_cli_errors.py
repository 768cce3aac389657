"""A user's mistake gets one line `error: ...` naming the field and the fix (exit 2), never a traceback;
unknown keys fail with the nearest valid name; victim=NAME selects a victim; ~ works in paths."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from experiments.config_check import check_config
from tests.experiments.cli import QUIET, SMALL, error_line, in_tmp, servelab  # noqa: F401  (in_tmp: a fixture)

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
AZURE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{46 + i}.0000000,{30 + i},4\n" for i in range(6))
MOONCAKE_ROWS = "".join(f'{{"timestamp": {i * 100}, "input_length": 40, "output_length": 4, "hash_ids": [{i}]}}\n'
                        for i in range(6))


@pytest.fixture
def traces(tmp_path):
    (tmp_path / "azure.csv").write_text(AZURE_ROWS)
    (tmp_path / "mooncake.jsonl").write_text(MOONCAKE_ROWS)
    return tmp_path


@pytest.mark.parametrize("args, expected", [
    (["num_replicas=0"], "error: num_replicas must be >= 1, got 0"),
    (["workload=azure"], "error: workload.path is null"),
    (["workload=sharegpt"], "error: workload.path is null: this workload reads a file; give it on the command line, "
                            "e.g. workload.path=path/to/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
    (["model=qwen3_9b"], "error: model=qwen3_9b: no such option; choose one of llama3_70b"),
    (["model.name=qwen9"], "error: model.name='qwen9' is not a known model"),
    (["num_replicas=many"], "error: num_replicas=many: expected an integer, e.g. num_replicas=1"),
    (["workload.arrival.rate_rps=[1"], "error: cannot parse the override"),
    (["max_model_lenn=5"], "error: unknown key max_model_lenn; did you mean 'max_model_len'?"),
    (["backend/cost_model=calibrated"], "error: backend.cost_model.profile must be given"),
    (["backend=engine", "backend.model_path=/nonexistent", "backend.device=cpus"],
     "error: backend.device must be one of ('auto', 'cuda', 'cpu') or 'cuda:N', got 'cpus'"),
    (["--multirn"], "error: unknown option --multirn; did you mean '--multirun'? (servelab --help lists the options)"),
])
def test_one_line_errors(in_tmp, monkeypatch, capsys, args, expected):
    assert error_line(monkeypatch, capsys, *QUIET, *args).startswith(expected)


@pytest.mark.parametrize("args, expected", [
    # a typed field given a value of another type: the field, the type it takes and a value of it (its own where
    # it has one), not OmegaConf's "could not be converted to Integer"
    (["num_kvcache_blocks=abc"], "error: num_kvcache_blocks=abc: expected an integer (or null), e.g. "
                                 "num_kvcache_blocks=1024"),
    (["max_model_len=1.5"], "error: max_model_len=1.5: expected an integer (or null), e.g. max_model_len=1024"),
    (["gpu_memory_utilization=high"], "error: gpu_memory_utilization=high: expected a number, e.g. "
                                      "gpu_memory_utilization=0.9"),
    (["enable_chunked_prefill=yes_please"], "error: enable_chunked_prefill=yes_please: expected true or false, e.g. "
                                            "enable_chunked_prefill=false"),
    (["block_size=null"], "error: block_size=null: expected an integer (not null), e.g. block_size=16"),
    (["hardware.memory_gib=lots"], "error: hardware.memory_gib=lots: expected a number (or null), e.g. "
                                   "hardware.memory_gib=0.5"),
    (["model.num_layers=x"], "error: model.num_layers=x: expected an integer (or null), e.g. model.num_layers=1024"),
    # an untyped group's constructor (a cost model's __init__) gets the same check as a workload's, with its default
    (["backend.cost_model.matmul_efficiency=high"], "error: backend.cost_model.matmul_efficiency=high: not a number; "
                                                    "give a number, e.g. backend.cost_model.matmul_efficiency=1.0"),
    (["backend/cost_model=constant", "backend.cost_model.step_s=slow"],
     "error: backend.cost_model.step_s=slow: not a number; give a number, e.g. backend.cost_model.step_s=0.01"),
])
def test_a_value_of_the_wrong_type_names_the_type_and_a_value(in_tmp, monkeypatch, capsys, args, expected):
    assert error_line(monkeypatch, capsys, *SMALL, *args) == expected


@pytest.mark.parametrize("args, expected", [
    # every group's options, whatever the letter case of the typo
    (["eviction=LRU"], "error: eviction=LRU: no such option; choose one of fifo, lfu, lru, none; did you mean 'lru'?"),
    (["scheduler=VTC"], "did you mean 'vtc'?"),
    (["backend=HTTP"], "error: backend=HTTP: no such option; choose one of engine, http, sim; did you mean 'http'?"),
    (["victim=Newest"], "did you mean 'newest'?"),
    (["backend/cost_model=Roofline"], "did you mean 'roofline'?"),
    (["workload/prompt_len=Fixed"], "did you mean 'fixed'?"),
    (["-m", "eviction=LRU,fifo"], "error: eviction=LRU: no such option; choose one of fifo, lfu, lru, none; did you "
                                  "mean 'lru'?"),
    # an option's name at the key its group fills: the group choice to give instead
    (["scheduler.victim=newest"], "error: scheduler.victim=newest: scheduler.victim holds the settings of a victim "
                                  "option, not its name; choose the option with victim=newest"),
    (["scheduler.victim=Newst"], "did you mean 'victim=newest'?"),
    (["workload.prompt_len=fixed"], "choose the option with workload/prompt_len=fixed"),
    (["backend.cost_model=constant"], "choose the option with backend/cost_model=constant"),
    # Hydra refuses a group set to null without naming it
    (["eviction=null"], "error: eviction=null: a config group takes one of its options, not null; choose one of fifo, "
                        "lfu, lru, none, or leave eviction= out for its default"),
    # a key of another option than the chosen one: those options, not the key itself as its own nearest
    (["scheduler.predictor=noisy"], "error: unknown key scheduler.predictor; only other options take it: "
                                    "scheduler=sjf, scheduler=srpt, scheduler=srpt_noisy ("),
    # a predictor is chosen by its registered name (no config group): a misspelt one names the valid names
    (["scheduler=srpt", "scheduler.predictor=orcale"],
     "error: scheduler.predictor=orcale: no such predictor; choose one of noisy, oracle; did you mean "
     "'scheduler.predictor=oracle'?"),
    (["scheduler=sjf", "scheduler.predictor=Noisy"], "did you mean 'scheduler.predictor=noisy'?"),
])
def test_group_choices_name_the_nearest_option(in_tmp, monkeypatch, capsys, args, expected):
    assert expected in error_line(monkeypatch, capsys, *args, *SMALL)


@pytest.mark.parametrize("args, expected", [
    # Hydra's own hint for an unknown key is "+key=value", which used to be accepted and ignored
    (["+misspelled_key=1"], "unknown key misspelled_key ("),
    (["+max_num_seq=8"], "unknown key max_num_seq; did you mean 'max_num_seqs'?"),
    (["+scheduler.victimm=x"], "unknown key scheduler.victimm; did you mean 'scheduler.victim'?"),
    (["+workload.max_request=5"], "unknown key workload.max_request; did you mean 'workload.max_requests'?"),
    (["+workload.arrival.rate=5"], "unknown key workload.arrival.rate; did you mean 'workload.arrival.rate_rps'?"),
    (["+model.num_layer=2"], "unknown key model.num_layer; did you mean 'model.num_layers'?"),
    (["+backend.cost_model.overhead=0"], "did you mean 'backend.cost_model.overhead_s'?"),
    (["backend=engine", "+backend.model_pth=x"], "unknown key backend.model_pth; did you mean 'backend.model_path'?"),
    # a typo inside an untyped group (workload, scheduler) is matched against the keys of its config files
    (["workload.arival.rate_rps=5"], "unknown key workload.arival.rate_rps; did you mean 'workload.arrival.rate_rps'?"),
    (["workload.prompt_len.mean_tokns=5"],
     "unknown key workload.prompt_len.mean_tokns; did you mean 'workload.prompt_len.mean_tokens'?"),
])
def test_unknown_keys_fail_with_the_nearest_name(in_tmp, monkeypatch, capsys, args, expected):
    assert expected in error_line(monkeypatch, capsys, *SMALL, *args)


@pytest.mark.parametrize("args, expected", [
    # the key as the user typed it, not the constructor's field (Poisson.rate_rps) nor the bare option name
    (["workload.arrival.rate_rps=-5"], "error: workload.arrival.rate_rps must be > 0, got -5"),
    (["workload.prompt_len.mean_tokens=0"], "error: workload.prompt_len.mean_tokens must be >= 1, got 0"),
    (["workload.max_requests=-3"], "error: workload.max_requests must be >= 1 or None, got -3"),
    (["workload.start_offset_s=-1"], "error: workload.start_offset_s must be >= 0, got -1"),
    (["workload.num_requests=0"], "error: workload.num_requests must be >= 1, got 0"),
    (["workload=azure", "workload.path=azure.csv", "workload.target_rate_rps=-4"],
     "error: workload.target_rate_rps must be > 0, got -4"),
    (["workload=azure", "workload.path=azure.csv", "workload.time_scale=0"], "error: workload.time_scale must be > 0"),
    # text or a fraction where the constructor takes a number: named before a comparison fails on it
    (["workload.arrival.rate_rps=fast"],
     "error: workload.arrival.rate_rps=fast: not a number; give a number, e.g. workload.arrival.rate_rps=10.0"),
    (["workload=azure", "workload.path=azure.csv", "workload.target_rate_rps=four"],
     "error: workload.target_rate_rps=four: not a number"),              # a reader's option (**kwargs)
    (["workload.num_requests=1.5"], "error: workload.num_requests=1.5: give a whole number"),
    (["workload.prompt_len.mean_tokens=many"], "error: workload.prompt_len.mean_tokens=many: not a number"),
])
def test_bad_workload_values_name_the_full_key(in_tmp, monkeypatch, capsys, args, expected):
    (in_tmp / "azure.csv").write_text(AZURE_ROWS)
    assert error_line(monkeypatch, capsys, *QUIET, *args).startswith(expected)


def test_an_error_line_never_runs_on_after_the_progress_bar(in_tmp, monkeypatch, capsys):
    # progress on (not QUIET): a setting the scheduler refuses is refused before the bar starts
    code, _, err = servelab(monkeypatch, capsys, "print_summary=false", "plots=false", "num_kvcache_blocks=-1")
    assert code == 2 and err.strip() == "error: num_kvcache_blocks must be >= 1, got -1", err


def test_a_missing_trace_names_the_field_and_the_nearest_file(in_tmp, monkeypatch, capsys, traces):
    line = error_line(monkeypatch, capsys, *QUIET, "workload=azure", f"workload.path={traces / 'nope.csv'}")
    assert line.startswith(f"error: workload.path={traces / 'nope.csv'}: no such file")
    line = error_line(monkeypatch, capsys, *QUIET, "workload=azure", f"workload.path={traces / 'azur.csv'}")
    assert line.endswith(f"; did you mean 'workload.path={traces / 'azure.csv'}'?")


def test_keys_a_constructor_takes_may_be_added(tmp_path):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+workload.skip_requests=2", "+backend.cost_model.max_model_len=2048"])
    check_config(cfg)          # synthetic_workload and RooflineCostModel take these: no error


def test_full_error_shows_the_traceback(in_tmp, monkeypatch, capsys):
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        servelab(monkeypatch, capsys, *QUIET, "num_replicas=0", full_error=True)


def test_a_folder_as_trace_path(in_tmp, monkeypatch, capsys, traces):
    line = error_line(monkeypatch, capsys, *QUIET, "workload=azure", f"workload.path={traces}")
    assert line.startswith(f"error: workload.path={traces} is a folder; give the file itself")


@pytest.mark.parametrize("workload, file, suggested", [("azure", "mooncake.jsonl", "mooncake"),
                                                       ("mooncake", "azure.csv", "azure")])
def test_a_trace_in_the_wrong_format_names_the_workload_that_reads_it(in_tmp, monkeypatch, capsys, traces, workload,
                                                                       file, suggested):
    line = error_line(monkeypatch, capsys, *QUIET, f"workload={workload}", f"workload.path={traces / file}")
    assert line.endswith(f": use workload={suggested}")


def test_tilde_in_a_path(in_tmp, monkeypatch, capsys, traces):
    # Hydra's grammar rejects an unquoted ~ in a value; servelab quotes it and every path field expands it
    monkeypatch.setenv("HOME", str(traces))
    code, _, err = servelab(monkeypatch, capsys, *QUIET, "workload=azure", "workload.path=~/azure.csv",
                            "model=qwen3_0p6b", "hydra.run.dir=run")
    assert code == 0, err
    assert "azure.csv" in (in_tmp / "run" / "config.yaml").read_text()
    assert f"path: {traces / 'azure.csv'}" in (in_tmp / "run" / "config.yaml").read_text()
    line = error_line(monkeypatch, capsys, *QUIET, "backend=engine", "backend.model_path=~/models/x")
    assert str(traces / "models" / "x") in line and "~" not in line
    assert servelab(monkeypatch, capsys, *SMALL, "hydra.run.dir=~/out")[0] == 0
    assert (traces / "out" / "summary.json").is_file() and not (in_tmp / "~").exists()


@pytest.mark.parametrize("victim", sorted(p.stem for p in (CONF / "victim").glob("*.yaml")))
def test_every_victim_can_be_selected_by_name(victim):
    from policies.registry import VICTIM_POLICIES
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for scheduler in ("vllm", "priority", "srpt"):
            cfg = compose("config", overrides=[f"scheduler={scheduler}", f"victim={victim}"])
            assert type(instantiate(cfg.scheduler).victim) is VICTIM_POLICIES[victim]


def test_without_victim_each_scheduler_keeps_its_own():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        assert type(instantiate(compose("config", overrides=["scheduler=priority"]).scheduler).victim).__name__ == \
            "LowestPriorityVictim"
        assert type(instantiate(compose("config", overrides=["scheduler=srpt_noisy"]).scheduler).victim).__name__ == \
            "LongestRemainingVictim"


@pytest.mark.parametrize("scheduler", ["srpt", "sjf", "srpt_noisy"])
def test_every_predictor_can_be_given_by_name(scheduler):
    from policies.registry import PREDICTORS
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for name, cls in PREDICTORS.items():
            cfg = compose("config", overrides=[f"scheduler={scheduler}", f"scheduler.predictor={name}", "seed=5"])
            check_config(cfg)
            predictor = instantiate(cfg.scheduler).predictor
            assert type(predictor) is cls and getattr(predictor, "seed", 5) == 5      # the run's seed, as srpt_noisy


def test_the_validation_commands_take_a_predictor_by_name_too():
    from experiments.policy_conf import make_policy
    predictor = make_policy("srpt", ["scheduler.predictor=noisy", "seed=4"]).predictor      # validate --override
    assert type(predictor).__name__ == "NoisyPredictor" and predictor.seed == 4


def test_a_predictor_given_by_name_runs_and_is_saved_with_its_settings(in_tmp, monkeypatch, capsys):
    import yaml
    assert servelab(monkeypatch, capsys, *SMALL, "scheduler=srpt", "scheduler.predictor=noisy", "seed=3",
                    "hydra.run.dir=p")[0] == 0
    saved = yaml.safe_load((in_tmp / "p" / "config.yaml").read_text())["scheduler"]["predictor"]
    assert saved == {"_target_": "policies.predictors.noisy.NoisyPredictor", "sigma": 0.5, "seed": 3}


def test_victim_is_recorded_among_the_choices(in_tmp, monkeypatch, capsys):
    import json
    assert servelab(monkeypatch, capsys, *SMALL, "victim=most_blocks", "hydra.run.dir=v")[0] == 0
    assert json.loads((in_tmp / "v" / "summary.json").read_text())["choices"]["victim"] == "most_blocks"


# -- a simulator-only install (torch and the other engine packages made unimportable) ------------------
BLOCK_ENGINE = '''import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "safetensors", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Block())
'''


def sim_only(tmp_path, *cmd, timeout=120):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_ENGINE)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, *cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_engine_backend_on_a_simulator_only_install(tmp_path):
    proc = sim_only(tmp_path, "-m", "experiments.run", "backend=engine", "backend.model_path=x", *QUIET)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: backend=engine needs the engine extra") and \
        "pip install -e '.[engine]'" in proc.stderr


def test_validate_from_real_runs_without_torch(tmp_path):
    # the simulated side of `experiments.validate --from-real` reads the checkpoint's config.json only
    code = ("import sys; from experiments.validate import roofline_model; "
            f"m = roofline_model({str(ROOT / 'benchmarks/results/real')!r}, 'H200', 'cuda', 4096); "
            "print(m.model.num_layers, 'torch' in sys.modules)")
    proc = sim_only(tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["28", "False"]


def test_a_bug_keeps_its_traceback(in_tmp, monkeypatch, capsys):
    import experiments.runner_sim as runner_sim

    def broken(cfg, desc="x"):
        raise AttributeError("a bug, not a user's mistake")
    monkeypatch.setattr(runner_sim, "run_sim", broken)
    with pytest.raises(AttributeError, match="a bug"):
        servelab(monkeypatch, capsys, *SMALL)


def test_a_misspelt_target_is_one_line(in_tmp, monkeypatch, capsys):
    line = error_line(monkeypatch, capsys, *SMALL, "eviction._target_=policies.eviction.lru.LRUEvictionn")
    assert line == ("error: eviction._target_=policies.eviction.lru.LRUEvictionn: cannot import it (ImportError); "
                    "did you mean 'policies.eviction.lru.LRUEviction'?")


def test_engine_refuses_a_chosen_model_that_is_not_its_checkpoint(in_tmp, monkeypatch, capsys, tmp_path):
    """model= picked on the command line must match the checkpoint's dimensions (the simulator would price
    one model and the engine run another); left at its default, the checkpoint decides."""
    pytest.importorskip("torch")
    from tests.engine.tiny_model import make_tiny_qwen3
    make_tiny_qwen3(tmp_path / "ckpt")
    capsys.readouterr()                     # the checkpoint writer's progress bar
    line = error_line(monkeypatch, capsys, *QUIET, "backend=engine", f"backend.model_path={tmp_path / 'ckpt'}",
                      "model=llama3_8b")
    assert line.startswith("error: model=Llama-3.1-8B (from model=llama3_8b) does not match the checkpoint") and \
        "num_layers: 32 vs 2" in line and "leave model=llama3_8b out" in line
    # a model.* override alone changes the default entry: the error names the override, not a model= never given
    line = error_line(monkeypatch, capsys, *QUIET, "backend=engine", f"backend.model_path={tmp_path / 'ckpt'}",
                      "model.vocab_size=512")
    assert "(from model.vocab_size=512) does not match the checkpoint" in line and \
        "leave model.vocab_size=512 out" in line


def test_a_refused_run_leaves_no_folder(in_tmp, monkeypatch, capsys):
    """A mistake caught once the run's folder exists (a missing trace) removes the folder and the parents the command
    made, so nothing looks like a run; a folder that was there before stays, and so does a run that ran."""
    error_line(monkeypatch, capsys, *SMALL, "workload=azure", "workload.path=nope.csv")
    assert not (in_tmp / "outputs").exists()
    (in_tmp / "outputs" / "smoke").mkdir(parents=True)
    error_line(monkeypatch, capsys, *SMALL, "cpu_cache_gib=5000")
    assert list((in_tmp / "outputs").rglob("*")) == [in_tmp / "outputs" / "smoke"]
    code, _, _ = servelab(monkeypatch, capsys, *SMALL)
    assert code == 0 and len(list((in_tmp / "outputs" / "smoke").iterdir())) == 1


@pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema")   # Hydra 1.3 on submitit's config
def test_a_launcher_whose_plugin_is_missing_names_the_extra(in_tmp, monkeypatch, capsys):
    """hydra/launcher=submitit_local without the slurm extra: Hydra's 'Unknown plugin class' RuntimeError becomes
    one line naming the pip command (the plugin hidden from Hydra as if it were not installed)."""
    from hydra.core.plugins import Plugins
    plugins = Plugins.instance()
    kept = {k: v for k, v in plugins.class_name_to_class.items() if "submitit" not in k}
    monkeypatch.setattr(plugins, "class_name_to_class", kept)
    code, out, err = servelab(monkeypatch, capsys, "-m", *SMALL, "scheduler=fcfs,vllm", "hydra/launcher=submitit_local")
    announced = [ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("sweep folder: ")]
    assert code == 2 and len(announced) == 1, (out, err)
    assert err.strip() == ("error: hydra/launcher needs the hydra-submitit-launcher plugin, which is not installed: "
                           "pip install -e '.[slurm]', or leave hydra/launcher at its default (local: joblib) "
                           f"(no job started: the sweep folder {announced[0]} was not created)")
    assert not (in_tmp / "sweeps").exists() or not any((in_tmp / "sweeps").iterdir())
