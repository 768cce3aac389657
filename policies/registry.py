"""Build policies by name (for code paths that do not go through Hydra's `_target_`).

    make_scheduling_policy("srpt", victim="longest_remaining", predictor="noisy",
                           predictor_params={"sigma": 0.5, "seed": 1})
    make_eviction_policy("lfu")
    make_victim_policy("lowest_priority")
    make_predictor("noisy", sigma=0.5)

`victim` and `predictor` accept a name or an instance. Unknown names raise
ValueError listing the allowed ones; bad parameters raise from the policy's
constructor with the allowed range. Each call builds fresh objects (policies
keep per-run state, so they are never shared between runs).

The tables are discovered, not listed (engine/core/registry.py): every module of a
family package (`policies/scheduling/`, `eviction/`, `victim/`, `predictors/`) whose
name does not start with "_" and is not `base` is imported, and each subclass of the
family's base class defined there is registered under its `name`. Adding a policy is one
file there plus one YAML under `conf/`; tests derive the expected sets from these tables.
"""
from __future__ import annotations

import inspect

import policies.eviction
import policies.predictors
import policies.scheduling
import policies.victim
from engine.core.registry import discover
from policies.eviction.base import EvictionPolicy
from policies.predictors.base import OutputLengthPredictor
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy

SCHEDULING_POLICIES = discover(policies.scheduling, SchedulingPolicy)
EVICTION_POLICIES = discover(policies.eviction, EvictionPolicy)
VICTIM_POLICIES = discover(policies.victim, VictimPolicy)
PREDICTORS = discover(policies.predictors, OutputLengthPredictor)
# Scheduling policies that take an output-length predictor (a `predictor` constructor argument).
USES_PREDICTOR = frozenset(n for n, cls in SCHEDULING_POLICIES.items()
                           if "predictor" in inspect.signature(cls.__init__).parameters)


def _lookup(kind: str, table: dict, name: str):
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; allowed values: {', '.join(sorted(table))}")
    return table[name]


def make_victim_policy(name: str):
    return _lookup("victim policy", VICTIM_POLICIES, name)()


def make_eviction_policy(name: str):
    return _lookup("eviction policy", EVICTION_POLICIES, name)()


def make_predictor(name: str, **params):
    return _lookup("predictor", PREDICTORS, name)(**params)


def make_scheduling_policy(name: str, victim=None, predictor=None, predictor_params: dict | None = None,
                           **params):
    cls = _lookup("scheduling policy", SCHEDULING_POLICIES, name)
    if isinstance(victim, str):
        victim = make_victim_policy(victim)
    if victim is not None:
        params["victim"] = victim
    if predictor is not None or predictor_params:
        if name not in USES_PREDICTOR:
            raise ValueError(f"scheduling policy {name!r} takes no predictor; "
                             f"policies with a predictor: {', '.join(sorted(USES_PREDICTOR))}")
        if predictor is None or isinstance(predictor, str):
            predictor = make_predictor(predictor or "oracle", **(predictor_params or {}))
        elif predictor_params:
            raise ValueError("predictor_params applies only when predictor is given by name")
        params["predictor"] = predictor
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"scheduling policy {name!r} has no parameter(s) {', '.join(unknown)}; "
                         f"accepted parameters: {', '.join(allowed)}")
    return cls(**params)
