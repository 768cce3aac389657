"""Scheduling policies by label, built from the Hydra config group `conf/scheduler/` (as `servelab scheduler=NAME`).

    label = "srpt"               -> conf/scheduler/srpt.yaml, the run's chunked-prefill setting
    label = "vllm+chunked"       -> conf/scheduler/vllm.yaml with chunked prefill forced on
    label = "vllm+nochunk"       -> ... forced off
    policy = make_policy("srpt"); swaps("mlfq") -> True (FastServe's swap preemption)

The validation commands (experiments.validate, experiments.generalize) name policies by such labels,
so both backends of a comparison build the same object the Hydra entry point would (victim, predictor
and parameters from the YAML), and a label is also the name the real runs are saved under.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf" / "scheduler"
CHUNK_SUFFIXES = {"chunked": True, "nochunk": False}


def policy_names() -> list[str]:
    """Every scheduler config of conf/scheduler/ (the names `servelab scheduler=NAME` accepts)."""
    return sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


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


def make_policy(label: str):
    """A fresh policy object for `label` (policies keep per-run state, so never share one between runs)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    spec = parse_label(label)
    return instantiate(OmegaConf.load(CONF_DIR / f"{spec.name}.yaml"), _convert_="all")


def swaps(label: str) -> bool:
    """Whether the policy preempts by swapping (then it needs swap blocks)."""
    return make_policy(label).preemption_mode == "swap"
