"""Registry construction, parameter validation, and every Hydra YAML under conf/ for policies."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from engine.core.scheduler import Scheduler, SchedulerConfig
from policies.predictors.noisy import NoisyPredictor
from policies.predictors.oracle import OraclePredictor
from policies.registry import (
    EVICTION_POLICIES,
    PREDICTORS,
    SCHEDULING_POLICIES,
    VICTIM_POLICIES,
    make_eviction_policy,
    make_predictor,
    make_scheduling_policy,
    make_victim_policy,
)
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_every_name_builds_a_fresh_object():
    for name, cls in SCHEDULING_POLICIES.items():
        p = make_scheduling_policy(name)
        assert type(p) is cls and p.name == name and isinstance(p.victim, VictimPolicy)
        assert make_scheduling_policy(name) is not p
    for name, cls in EVICTION_POLICIES.items():
        assert type(make_eviction_policy(name)) is cls
    for name, cls in VICTIM_POLICIES.items():
        assert type(make_victim_policy(name)) is cls
    for name, cls in PREDICTORS.items():
        assert type(make_predictor(name)) is cls


def test_names_and_instances_for_victim_and_predictor():
    p = make_scheduling_policy("srpt", victim="longest_remaining", predictor="noisy",
                               predictor_params={"sigma": 0.3, "seed": 5})
    assert p.victim.name == "longest_remaining"
    assert isinstance(p.predictor, NoisyPredictor) and p.predictor.sigma == 0.3 and p.predictor.seed == 5
    oracle = OraclePredictor()
    assert make_scheduling_policy("sjf", predictor=oracle).predictor is oracle
    assert make_scheduling_policy("priority").victim.name == "lowest_priority"
    assert make_scheduling_policy("sarathi", token_budget=256).token_budget == 256


@pytest.mark.parametrize("call, message", [
    (lambda: make_scheduling_policy("lifo"), "allowed values: " + ", ".join(sorted(SCHEDULING_POLICIES))),
    (lambda: make_eviction_policy("mru"), "allowed values: " + ", ".join(sorted(EVICTION_POLICIES))),
    (lambda: make_victim_policy("oldest"), "allowed values: " + ", ".join(sorted(VICTIM_POLICIES))),
    (lambda: make_predictor("bert"), "allowed values: " + ", ".join(sorted(PREDICTORS))),
    (lambda: make_scheduling_policy("fcfs", quantum=3), "accepted parameters: victim"),
    (lambda: make_scheduling_policy("vllm", predictor="oracle"), "takes no predictor"),
    (lambda: make_scheduling_policy("mlfq", base_quantum=-1), "base_quantum must be a finite number > 0"),
    (lambda: make_scheduling_policy("mlfq", base_quantum=0), "base_quantum must be a finite number > 0"),
    (lambda: make_scheduling_policy("mlfq", num_levels=0), "num_levels must be an integer >= 1"),
    (lambda: make_scheduling_policy("mlfq", starvation_s=-2.0), "starvation_s must be a finite number > 0"),
    (lambda: make_scheduling_policy("srpt", prompt_token_weight=-1), "prompt_token_weight must be a finite"),
    (lambda: make_scheduling_policy("sarathi", token_budget=0), "token_budget must be an integer >= 1"),
    (lambda: make_scheduling_policy("sarathi", token_budget=8.5), "token_budget must be an integer >= 1"),
    (lambda: make_scheduling_policy("srpt", predictor="noisy", predictor_params={"sigma": -1}),
     "sigma must be a finite float >= 0"),
])
def test_bad_names_and_parameters_fail_at_construction(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call()


def test_scheduler_refuses_budget_below_one_block():
    with pytest.raises(ValueError, match="smaller than one block"):
        Scheduler(SchedulerConfig(num_kvcache_blocks=8, block_size=16, enable_chunked_prefill=True),
                  make_scheduling_policy("sarathi", token_budget=8))


def _yamls(group):
    files = sorted((CONF / group).glob("*.yaml"))
    assert files, f"no YAML files in conf/{group}"
    return files


@pytest.mark.parametrize("path", _yamls("scheduler"), ids=lambda p: p.stem)
def test_scheduler_yaml_instantiates(path):
    obj = instantiate(OmegaConf.load(path))
    assert isinstance(obj, SchedulingPolicy) and isinstance(obj.victim, VictimPolicy)
    # file stem = registry name, or registry name + "_variant" (e.g. srpt_noisy)
    assert path.stem == obj.name or path.stem.startswith(obj.name + "_")
    assert type(obj) is SCHEDULING_POLICIES[obj.name]
    if hasattr(obj, "predictor"):
        assert type(obj.predictor) in PREDICTORS.values()


@pytest.mark.parametrize("group, table", [("eviction", EVICTION_POLICIES), ("victim", VICTIM_POLICIES)])
def test_eviction_and_victim_yamls_instantiate(group, table):
    files = _yamls(group)
    assert {p.stem for p in files} == set(table)     # one YAML per registered policy
    for path in files:
        assert type(instantiate(OmegaConf.load(path))) is table[path.stem]


def test_every_scheduling_policy_has_a_yaml():
    assert set(SCHEDULING_POLICIES) <= {p.stem for p in _yamls("scheduler")}


def test_registry_discovers_every_policy_module():
    """Each family's tables hold exactly the classes defined in its policy files (one file = one entry,
    nothing listed by hand), and a module dropped into a family package is found."""
    import importlib
    import sys
    import textwrap

    from policies.registry import discover
    root = CONF.parent / "policies"
    for family, table in (("scheduling", SCHEDULING_POLICIES), ("eviction", EVICTION_POLICIES),
                          ("victim", VICTIM_POLICIES), ("predictors", PREDICTORS)):
        files = {p.stem for p in (root / family).glob("*.py") if not p.stem.startswith("_") and p.stem != "base"}
        assert {cls.__module__.rsplit(".", 1)[1] for cls in table.values()} == files, family
    pkg_name = "servelab_test_policies"
    pkg = Path(__import__("tempfile").mkdtemp()) / pkg_name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lifo.py").write_text(textwrap.dedent("""
        from policies.scheduling.base import SchedulingPolicy
        class LIFOPolicy(SchedulingPolicy):
            name = "lifo"
    """))
    sys.path.insert(0, str(pkg.parent))
    try:
        table = discover(importlib.import_module(pkg_name), SchedulingPolicy)
    finally:
        sys.path.remove(str(pkg.parent))
    assert list(table) == ["lifo"] and table["lifo"].__name__ == "LIFOPolicy"


def test_policies_never_import_torch():
    import subprocess
    import sys
    code = ("import sys, policies, policies.registry, policies.predictors; "
            "assert 'torch' not in sys.modules, 'policies imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=CONF.parent)
