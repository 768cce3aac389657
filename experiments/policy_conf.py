"""Scheduling policies by label, built from the Hydra config group `conf/scheduler/` (as `servelab scheduler=NAME`).

    label = "srpt"               -> conf/scheduler/srpt.yaml, the run's chunked-prefill setting
    label = "vllm+chunked"       -> conf/scheduler/vllm.yaml with chunked prefill forced on
    label = "vllm+nochunk"       -> ... forced off
    policy = make_policy("srpt"); swaps("mlfq") -> True (FastServe's swap preemption)
    make_policy("srpt", ["victim=most_blocks"]); make_eviction(["eviction=lfu"])

The validation commands (experiments.validate, experiments.generalize) name policies by such labels,
so both backends of a comparison build the same object the Hydra entry point would: the config is
composed like `servelab scheduler=NAME OVERRIDES` (experiments.compose), victim, predictor and
parameters from the YAMLs. A label is also the name the real runs are saved under.
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments.compose import CONF_DIR, compose_config

SCHEDULER_DIR = CONF_DIR / "scheduler"
CHUNK_SUFFIXES = {"chunked": True, "nochunk": False}


def policy_names() -> list[str]:
    """Every scheduler config of conf/scheduler/ (the names `servelab scheduler=NAME` accepts)."""
    return sorted(p.stem for p in SCHEDULER_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class PolicyLabel:
    label: str                      # as given, e.g. "vllm+chunked"
    name: str                       # the conf/scheduler YAML, e.g. "vllm"
    chunked: bool | None            # forced chunked prefill, or None: the run's setting


def parse_label(label: str) -> PolicyLabel:
    """'NAME' or 'NAME+chunked' / 'NAME+nochunk'; ValueError names the allowed values."""
    name, _, suffix = label.strip().partition("+")
    if name not in policy_names():
        raise ValueError(f"--policies: unknown scheduling policy {name!r}; allowed: {', '.join(policy_names())} "
                         f"(conf/scheduler/*.yaml), optionally with +chunked or +nochunk")
    if suffix and suffix not in CHUNK_SUFFIXES:
        raise ValueError(f"--policies: {label!r}: the suffix after '+' must be one of {sorted(CHUNK_SUFFIXES)}")
    return PolicyLabel(label.strip(), name, CHUNK_SUFFIXES[suffix] if suffix else None)


def make_policy(label: str, overrides=()):
    """A fresh policy object for `label` (policies keep per-run state, so never share one between runs),
    composed with Hydra `overrides` (e.g. victim=most_blocks, scheduler.prompt_token_weight=0)."""
    from hydra.utils import instantiate

    from experiments.config_check import resolve_predictor_name

    cfg = compose_config([f"scheduler={parse_label(label).name}", *overrides])
    resolve_predictor_name(cfg)           # scheduler.predictor=noisy, as servelab reads it
    return instantiate(cfg.scheduler, _convert_="all")


def make_eviction(overrides=()):
    """A fresh eviction policy from the composed config (conf/eviction; servelab's default without
    an eviction=NAME override)."""
    from hydra.utils import instantiate

    return instantiate(compose_config(overrides).eviction, _convert_="all")


def swaps(label: str, overrides=()) -> bool:
    """Whether the policy preempts by swapping (then it needs swap blocks)."""
    return make_policy(label, overrides).preemption_mode == "swap"
