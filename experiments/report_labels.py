"""The `policy` label of each row of a sweep table (experiments.report): the line of the plots a run is drawn on.

A label names every command-line override whose value differs between the runs read, rates excepted (they are
the x axis) and settings that change no result (results.NON_RESULT_KEYS: progress, plots, ...; experiments.report
reads no column of them), so two runs on one line differ in their rate only. A run that did not give a key that
another run gave shows the value its config resolved (its config.yaml: `seed=0` beside a relaunch's `seed=7`), or
`default` where its config does not say (a config group's option). Runs that are still alike at the same rate (the
same command run twice into one folder tree) get their folder appended, so no plot joins two runs.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import yaml

from experiments.report_table import cell

UNSET = "default"        # the label text of a key a run neither gave nor resolved


def is_rate_key(key: str) -> bool:
    return key.endswith(("rate_rps", "time_scale", "rate_scale"))


def _config(run_dir: Path, cache: dict) -> dict:
    if run_dir not in cache:
        path = run_dir / "config.yaml"
        try:
            cache[run_dir] = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader",
                                                                                       yaml.SafeLoader)) or {}
        except (OSError, yaml.YAMLError):
            cache[run_dir] = {}
    return cache[run_dir]


def resolved_value(run_dir: Path, key: str, cache: dict):
    """The value of a dotted key in the run's config.yaml; KeyError when the config has none (a config group,
    e.g. workload/output_len, is named by its option only in the overrides)."""
    node = _config(run_dir, cache)
    for part in key.split("."):
        if "/" in part or not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _predictor_name(value):
    """A predictor's settings as `scheduler.predictor=NAME` resolves them (experiments/config_check.py
    resolve_predictor_name: its class, its constructor's defaults, the run's seed) back to NAME, so a run that gave
    the name and one whose config holds those settings get one label; any other value as it is."""
    if not (isinstance(value, dict) and "_target_" in value):
        return value
    from experiments.config_check import registered_settings
    from policies.registry import PREDICTORS
    for name, cls in PREDICTORS.items():
        settings = registered_settings(cls)
        if value["_target_"] == settings["_target_"] and \
                all(k == "seed" or (k in settings and settings[k] == v) for k, v in value.items()):
            return name
    return value


def fill_overrides(rows: list[dict], keys, root: Path) -> None:
    """Gives each row the resolved value of every override key it lacks (in place; see the module docstring). The
    keys are filled in sorted order: the report's columns follow the rows' key order, and a set's order changes
    from one process to the next (an identical report would differ)."""
    cache: dict = {}
    for row in rows:
        for key in sorted(keys):
            if key not in row:
                try:
                    row[key] = cell(_predictor_name(resolved_value(root / row["run_dir"], key, cache)))
                except KeyError:
                    pass


def _text(row, key):
    return str(row[key]) if key in row else UNSET


def label_keys(rows: list[dict], override_keys) -> list[str]:
    """The keys a label names: every override key, rates excepted, whose value differs between the rows."""
    keys = [k for k in sorted(override_keys) if not is_rate_key(k) and len({_text(r, k) for r in rows}) > 1]
    if not keys and len({_text(r, "scheduler") for r in rows if "scheduler" in r}) > 1:
        keys = ["scheduler"]        # the sweep varies the policy through its experiment files, not an override
    return keys


def policy_labels(rows: list[dict], override_keys, rate: str, keys: list[str] | None = None) -> list[str]:
    """One label per row (rows already filled by fill_overrides); keys: label_keys(rows, override_keys), when the
    caller has them."""
    text = _text
    keys = label_keys(rows, override_keys) if keys is None else keys
    if len(keys) == 1:
        labels = [text(r, keys[0]) for r in rows]
    elif keys:
        labels = [",".join(f"{k.rsplit('.', 1)[-1]}={text(r, k)}" for k in keys) for r in rows]
    else:
        labels = ["run"] * len(rows)
    seen = Counter((label, str(r.get(rate))) for label, r in zip(labels, rows))
    return [f"{label} ({r['run_dir']})" if seen[(label, str(r.get(rate)))] > 1 else label
            for label, r in zip(labels, rows)]


_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")   # unsigned: the "-" of qwen3-8b is no sign


def natural_key(label: str) -> tuple:
    """A label's sort key with its numbers compared as numbers: `blocks=512` before `blocks=1024`, which text order
    puts the other way round."""
    parts = _NUMBER.split(str(label))
    return tuple((1, float(x), "") if i % 2 else (0, 0.0, x) for i, x in enumerate(parts) if x)
