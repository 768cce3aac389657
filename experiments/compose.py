"""The servelab config composed with Hydra's compose API: one composition for every command.

    cfg = compose_config(["scheduler=srpt", "victim=most_blocks", "eviction=lfu"])
    instantiate(cfg.scheduler), instantiate(cfg.eviction)

`servelab` (experiments/run.py, a Hydra app) composes conf/ itself; the commands that are not Hydra
apps (experiments.validate, experiments.generalize) compose the same groups here, so a policy, victim
or eviction policy they build is the object `servelab` would build from the same overrides.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

import experiments.config  # noqa: F401  (registers the schema before Hydra composes)

# An absolute path: Hydra would read a relative one as the Python package `conf`, which only imports
# when the command runs from the repository root.
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides=()) -> DictConfig:
    """conf/config.yaml with Hydra overrides (`group=option`, `key=value`), without Hydra's own node."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))
