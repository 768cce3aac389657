"""Checks of a composed config that Hydra's schema cannot make, run before anything is built.

    check_config(cfg)     # ValueError naming the key and the fix; expands ~ in path fields

- Unknown keys. Hydra's `+key=value` adds a key even to a typed config, and the `_target_` groups
  (scheduler, eviction, router, workload, backend.cost_model, ...) are untyped: a misspelt key
  would be accepted and ignored, or fail deep inside a constructor. Every key must be a field of
  its schema (experiments/config.py), a parameter of its node's `_target_`, or, for `backend`,
  a key of the chosen conf/backend/<name>.yaml; the error names the nearest valid key.
- Mandatory values (`???`, e.g. backend.cost_model.profile of the calibrated model) must be given.
- A group option's name given to the key the group fills (`scheduler.victim=newest`, `workload.prompt_len=fixed`)
  is refused naming the group choice (`victim=newest`); `null_group_choice(argv)`: a group set to null.
- A predictor's registered name given to the scheduler's predictor (`scheduler.predictor=oracle`; predictors are no
  config group) becomes that predictor's settings; a misspelt one is refused naming the valid names.
- Paths. `~` is expanded in every path field (`path`, `*_path`, `*_dir`, `*_file`, `profile`); a
  workload file given as a folder is refused.
- `trace_format_hint(cfg)`: when a trace reader fails, which workload reads the file instead.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from experiments.compose import CONF_DIR
from experiments.user_errors import nearest

# Hydra's own instantiate keys, accepted on every `_target_` node.
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_convert_", "_recursive_", "_args_"})


def is_path_key(key: str) -> bool:
    return key in ("path", "profile") or key.endswith(("_path", "_dir", "_file"))


def _schema_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _locate(target: str, key: str):
    """The object a `_target_` names, or a ValueError naming the key (and the nearest name in its module)."""
    import importlib

    from hydra.utils import get_object
    try:
        return get_object(target)
    except Exception as e:
        module, _, name = target.rpartition(".")
        try:
            near = nearest(name, [n for n in dir(importlib.import_module(module)) if not n.startswith("_")],
                           f"{module}.")
        except Exception:
            near = ""
        raise ValueError(f"{key}={target}: cannot import it ({type(e).__name__}){near}") from None


def _target_params(obj) -> set[str] | None:
    """Keyword parameters `obj` accepts, or None when it takes **kwargs we cannot list."""
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return None
    names = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        if "options" not in params:
            return None
        # The workload readers take their common options (experiments.workloads.options) as **kwargs.
        from experiments.workloads.options import TraceOptions
        names |= _schema_fields(TraceOptions)
    return names


def _backend_keys(name: str) -> set[str] | None:
    path = CONF_DIR / "backend" / f"{name}.yaml"
    if not path.is_file():
        return None
    node = OmegaConf.load(path)
    keys = {k for k in node if k != "defaults"}
    for entry in node.get("defaults", []):
        if isinstance(entry, (dict, DictConfig)):
            keys |= {str(k).split("@")[0].lstrip("/") for k in entry}
    return keys


def _unknown(node: DictConfig, allowed: set[str], prefix: str) -> None:
    for key in node:
        if key not in allowed:
            near = nearest(key, sorted(allowed - HYDRA_KEYS), prefix)
            raise ValueError(f"unknown key {prefix}{key}{near} (`servelab --cfg job` prints every key; a leading "
                             "+ does not add new ones)")


def _check_targets(node, prefix: str) -> None:
    """Keys of `_target_` nodes at and under `node` against their constructors' parameters."""
    if not isinstance(node, DictConfig):
        return
    target = node.get("_target_") if "_target_" in node else None
    if isinstance(target, str):
        params = _target_params(_locate(target, f"{prefix}_target_"))
        if params is not None:
            _unknown(node, params | HYDRA_KEYS, prefix)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and (target is None or "_target_" in child):
            _check_targets(child, f"{prefix}{key}.")


def check_keys(cfg: DictConfig) -> None:
    from experiments.config import HardwareConfig, ModelConfig, ServelabConfig
    # a schema extending servelab's (servelab-serve's, experiments/serve/config.py) adds its own fields
    schema = OmegaConf.get_type(cfg)
    schema = schema if isinstance(schema, type) and issubclass(schema, ServelabConfig) else ServelabConfig
    _unknown(cfg, _schema_fields(schema), "")
    _unknown(cfg.model, _schema_fields(ModelConfig), "model.")
    _unknown(cfg.hardware, _schema_fields(HardwareConfig), "hardware.")
    for f in dataclasses.fields(schema):
        node = cfg._get_node(f.name) if f.name not in ("model", "hardware") else None
        typ = OmegaConf.get_type(node) if isinstance(node, DictConfig) and not node._is_none() else None
        if typ is not None and dataclasses.is_dataclass(typ):
            _unknown(node, _schema_fields(typ), f"{f.name}.")
    backend = cfg.backend
    allowed = _backend_keys(str(backend.get("name")))
    if allowed is not None:
        _unknown(backend, allowed, "backend.")
    for group in ("backend", "scheduler", "eviction", "router", "workload"):
        _check_targets(cfg._get_node(group), f"{group}.")


def expand_user_paths(node) -> None:
    """`~` and `~user` expanded in every path field under node, in place."""
    if not isinstance(node, DictConfig):
        return
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            expand_user_paths(child)
        elif is_path_key(str(key)) and not child._is_none() and isinstance(node[key], str) \
                and node[key].startswith("~"):
            node[key] = os.path.expanduser(node[key])


def check_workload_files(cfg: DictConfig) -> None:
    """A workload file given as a folder, or missing, fails here naming the field (and the nearest file
    name in its folder)."""
    def walk(node, prefix):
        for key in node:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                walk(child, f"{prefix}{key}.")
            elif key == "path" and not child._is_none():
                path = Path(str(node[key]))
                if path.is_dir():
                    raise ValueError(f"{prefix}{key}={node[key]} is a folder; give the file itself, e.g. "
                                     f"{prefix}{key}=path/to/AzureLLMInferenceTrace_conv.csv")
                if not path.exists():
                    raise ValueError(f"{prefix}{key}={node[key]}: no such file ({os.path.abspath(path)}); give the "
                                     f"path of an existing file{_nearest_file(path, f'{prefix}{key}=')}")
    walk(cfg.workload, "workload.")


def _nearest_file(path: Path, prefix: str) -> str:
    """'; did you mean ...' for the file in path's folder whose name is nearest path's, or ''."""
    folder = path.parent
    if not folder.is_dir():
        return f" (its folder {folder} does not exist either)"
    near = difflib.get_close_matches(path.name, sorted(p.name for p in folder.iterdir() if p.is_file()), n=1,
                                     cutoff=0.6)
    return f"; did you mean {prefix + str(folder / near[0])!r}?" if near else ""


def check_given(node, prefix: str = "") -> None:
    """A mandatory value (`???` in its file) left out fails naming the key."""
    for key in node:
        child = node._get_node(key)
        if child._is_missing():
            raise ValueError(f"{prefix}{key} must be given (its config file leaves it ???); add {prefix}{key}=... "
                             "to the command")
        if isinstance(child, DictConfig) and not child._is_none():
            check_given(child, f"{prefix}{key}.")


def group_options(group: str) -> list[str]:
    """The options of the config group `group` ("eviction", "workload/prompt_len"): its conf/ files' names."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _package(group: str) -> str:
    """Where the options of conf/<group>/ land in the config: their `# @package` line, else the folder's path."""
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        first = path.read_text().splitlines()[:1]
        if first and first[0].startswith("# @package "):
            return first[0].removeprefix("# @package ").strip()
    return group.replace("/", ".")


def nested_groups() -> dict[str, str]:
    """key -> group for the groups whose options land inside another group's node (scheduler.victim: victim,
    workload.prompt_len: workload/prompt_len, backend.cost_model: backend/cost_model)."""
    folders = sorted(p.parent.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*.yaml"))
    out = {}
    for group in dict.fromkeys(f for f in folders if f != "." and not f.startswith("hydra")):
        key = _package(group)
        if "." in key and not key.startswith("_"):
            out[key] = group
    return out


def check_group_values(cfg: DictConfig) -> None:
    """An option's name given to the key its group fills (scheduler.victim=newest, workload.prompt_len=fixed)
    would reach a constructor as text and fail deep inside the run: refused, naming the group choice to give
    instead (victim=newest) or the nearest option."""
    for key, group in nested_groups().items():
        value = OmegaConf.select(cfg, key, default=None)
        if not isinstance(value, str):
            continue
        options = group_options(group)
        same = [o for o in options if o.lower() == value.lower()]
        fix = (f"choose the option with {group}={same[0]}" if same else
               f"choose one of the {group} options: {', '.join(options)}{nearest(value, options, f'{group}=')}")
        raise ValueError(f"{key}={value}: {key} holds the settings of a {group} option, not its name; {fix}")


def registered_settings(cls) -> dict:
    """The config node a registered class stands for when given by name: its `_target_` and every default of its
    constructor (resolve_predictor_name writes it; report_labels reads a node back to the name)."""
    return {"_target_": f"{cls.__module__}.{cls.__qualname__}",
            **{n: p.default for n, p in inspect.signature(cls).parameters.items() if p.default is not p.empty}}


def resolve_predictor_name(cfg: DictConfig) -> None:
    """`scheduler.predictor=oracle`: the scheduler's predictor holds the predictor's settings
    (conf/scheduler/srpt.yaml), but its registered name (policies/predictors/) is what a user naturally gives, and
    as text it would reach the policy's constructor and fail there. The name becomes those settings, in place: the
    predictor's class and every default of its constructor, a `seed` the run's root seed (as
    conf/scheduler/srpt_noisy.yaml gives it), so the saved config names every value. A name that is no predictor is
    refused naming the valid ones."""
    from omegaconf import open_dict

    from policies.registry import PREDICTORS
    value = OmegaConf.select(cfg, "scheduler.predictor", default=None)
    target = OmegaConf.select(cfg, "scheduler._target_", default=None)
    if not isinstance(value, str) or not isinstance(target, str):
        return
    params = _target_params(_locate(target, "scheduler._target_"))
    if params is None or "predictor" not in params:       # check_keys names the schedulers that take one
        return
    if value not in PREDICTORS:
        names = sorted(PREDICTORS)
        raise ValueError(f"scheduler.predictor={value}: no such predictor; choose one of {', '.join(names)}"
                         f"{nearest(value, names, 'scheduler.predictor=')}")
    cls = PREDICTORS[value]
    node = registered_settings(cls)
    if "seed" in node:
        node["seed"] = int(cfg.seed)
    with open_dict(cfg.scheduler):
        cfg.scheduler.predictor = node


def null_group_choice(overrides) -> str | None:
    """The error line of a config group set to null on the command line (eviction=null), which Hydra refuses
    without naming the group, or None."""
    for item in overrides:
        key, sep, value = str(item).partition("=")
        key = key.lstrip("+")
        if sep and value.strip() == "null" and (CONF_DIR / key).is_dir():
            return (f"{key}=null: a config group takes one of its options, not null; choose one of "
                    f"{', '.join(group_options(key))}, or leave {key}= out for its default")
    return None


def check_config(cfg: DictConfig) -> None:
    """All of the above, in place on cfg (path expansion) or raising ValueError."""
    check_given(cfg)
    check_group_values(cfg)
    resolve_predictor_name(cfg)
    check_keys(cfg)
    expand_user_paths(cfg)
    check_workload_files(cfg)


# -- which workload reads this file -------------------------------------------------------------
def _workload_options() -> dict[str, str]:
    """reader function name -> conf/workload option that calls it."""
    out = {}
    for path in sorted((CONF_DIR / "workload").glob("*.yaml")):
        target = OmegaConf.load(path).get("_target_")
        if isinstance(target, str):
            out.setdefault(target.rsplit(".", 1)[-1], path.stem)
    return out


def trace_format_hint(cfg: DictConfig) -> str | None:
    """'... looks like a mooncake trace: use workload=mooncake' when the chosen workload reads another format
    (experiments/workloads/formats/)."""
    from experiments.workloads.formats import formats, sniff_format
    path = cfg.workload.get("path")
    target = str(cfg.workload.get("_target_", ""))
    if not isinstance(path, str) or not Path(path).is_file():
        return None
    try:
        name = sniff_format(path)
    except (OSError, UnicodeDecodeError):
        return None
    if name is None:
        return None
    fmt = formats()[name]
    reader = fmt.reader.__name__
    if target.rsplit(".", 1)[-1] == reader:
        return None
    option = _workload_options().get(reader)
    return f"{path} looks like {fmt.description}" + (f": use workload={option}" if option else "")
