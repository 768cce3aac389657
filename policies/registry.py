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
"""
from __future__ import annotations

import inspect

from policies.eviction.fifo import FIFOEviction
from policies.eviction.lfu import LFUEviction
from policies.eviction.lru import LRUEviction
from policies.eviction.none import NoEviction
from policies.predictors.noisy import NoisyPredictor
from policies.predictors.oracle import OraclePredictor
from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.mlfq import MLFQPolicy
from policies.scheduling.priority import PriorityPolicy
from policies.scheduling.sarathi import SarathiPolicy
from policies.scheduling.sjf import SJFPolicy
from policies.scheduling.srpt import SRPTPolicy
from policies.scheduling.vllm import VLLMPolicy
from policies.scheduling.vllm_swap import VLLMSwapPolicy
from policies.victim.longest_remaining import LongestRemainingVictim
from policies.victim.lowest_priority import LowestPriorityVictim
from policies.victim.most_blocks import MostBlocksVictim
from policies.victim.newest import NewestVictim

SCHEDULING_POLICIES = {cls.name: cls for cls in (
    FCFSPolicy, VLLMPolicy, VLLMSwapPolicy, PriorityPolicy, SJFPolicy, SRPTPolicy, MLFQPolicy, SarathiPolicy)}
EVICTION_POLICIES = {cls.name: cls for cls in (LRUEviction, FIFOEviction, LFUEviction, NoEviction)}
VICTIM_POLICIES = {cls.name: cls for cls in (NewestVictim, LowestPriorityVictim, MostBlocksVictim,
                                             LongestRemainingVictim)}
PREDICTORS = {cls.name: cls for cls in (OraclePredictor, NoisyPredictor)}
# Scheduling policies that take an output-length predictor.
USES_PREDICTOR = frozenset({"sjf", "srpt"})


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
