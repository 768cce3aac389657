"""A user's mistake as one line: which exceptions count as one, and how to print them.

    servelab num_replicas=0        ->  error: num_replicas must be >= 1, got 0      (exit status 2)

`servelab` (experiments/run.py) catches `USER_ERRORS` (and Hydra's composition errors: an unknown
option, a bad override) and prints `error: <one line>`; with HYDRA_FULL_ERROR=1 it raises them with
the full traceback instead. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys

from engine.core.requests import WorkloadFormatError


class MissingExtraError(ImportError):
    """An optional part of servelab is not installed; the message names the pip command."""


# The project's checks raise these for bad input (wrong values, missing or misplaced files).
USER_ERRORS = (ValueError, WorkloadFormatError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
               PermissionError, FileExistsError, MissingExtraError)

# Set by `servelab` for its own process and the sweep workers it starts: show tracebacks.
TRACEBACK_ENV = "SERVELAB_FULL_ERROR"


def tracebacks_wanted() -> bool:
    return os.environ.get(TRACEBACK_ENV) == "1"


def fail(message: str, status: int = 2):
    """Print `error: message` on stderr and exit (also from places where Hydra would swallow an Exception)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def nearest(word: str, choices, prefix: str = "") -> str:
    """`; did you mean 'prefix+x'?` for the choice closest to word, or ''."""
    choices = [str(c) for c in choices]
    # a dotted name whose last part is the word, or contains it, the shortest such (rate ->
    # workload.arrival.rate_rps, jain -> jain_index rather than jain_index_overall), then spelling; letter case
    # aside (eviction=LRU -> lru: difflib finds nothing alike in 'LRU' and 'lru')
    w = str(word).lower()
    lower = {c.lower(): c for c in reversed(choices)}          # the first choice of a spelling wins
    best = ([c for c in choices if c.rsplit(".", 1)[-1].lower() == w]
            or sorted((c for c in choices if len(w) >= 3 and w in c.rsplit(".", 1)[-1].lower()),
                      key=lambda c: len(c.rsplit(".", 1)[-1]))[:1]
            or [lower[m] for m in difflib.get_close_matches(w, list(lower), n=1, cutoff=0.6)])
    return f"; did you mean {prefix + best[0]!r}?" if best else ""


def _flat(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _schema_keys(head: str) -> list[str]:
    """Keys of the node `head` ('' = top level) where a typed schema (experiments/config.py) knows them."""
    import dataclasses

    from experiments.config import HardwareConfig, ModelConfig, ServelabConfig
    from experiments.serve.config import ServeOptions
    schema = {"": ServelabConfig, "model": ModelConfig, "hardware": HardwareConfig, "serve": ServeOptions}.get(head)
    return [f.name for f in dataclasses.fields(schema)] if schema else []


def _conf_keys(group: str) -> dict[str, list[str]]:
    """Dotted keys ("workload.arrival.rate_rps") of every option of conf/<group>/, its sub-groups' options
    placed under their folder's name (conf/workload/prompt_len/*.yaml: workload.prompt_len.*), each with the
    options that have it ("scheduler=srpt", "workload/prompt_len=fixed")."""
    from omegaconf import OmegaConf

    from experiments.compose import CONF_DIR

    def flat(node, prefix):
        for k, v in node.items():
            if k == "defaults":
                continue
            yield f"{prefix}{k}"
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")

    keys: dict[str, list[str]] = {}
    root = CONF_DIR / group
    for path in sorted(root.rglob("*.yaml")) if root.is_dir() else []:
        parts = path.relative_to(root).parent.parts
        option = "/".join((group, *parts)) + "=" + path.stem
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if isinstance(node, dict):
            for key in flat(node, ".".join((group, *parts)) + "."):
                keys.setdefault(key, []).append(option)
    return keys


def _nearest_conf_key(key: str) -> str:
    """`; did you mean 'x'?` for the key of the config files of key's group spelt most like it, or ''
    (groups without a typed schema: workload, scheduler, ...). A key of another option than the chosen one
    (scheduler.predictor with scheduler=vllm) is itself the nearest: the options that take it are named instead."""
    keys = _conf_keys(key.split(".", 1)[0])
    if key in keys:
        return f"; only other options take it: {', '.join(keys[key][:4])}{', ...' if len(keys[key]) > 4 else ''}"
    near = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.8)
    return f"; did you mean {near[0]!r}?" if near else ""


# How a typed field's type reads in an error, and a value of it to give where the field has none to show.
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
_EXAMPLES = {bool: True, int: 1024, float: 0.5, str: "name"}


def _typed_value_fix(cause) -> str | None:
    """'expected an integer (or null), e.g. num_kvcache_blocks=1024' for a value of the wrong type given to a field
    of a typed schema (experiments/config.py: OmegaConf's ValidationError names the field, not its type or a value
    it takes), or None. The example is the field's value before the override, else its default, else one of its
    type."""
    import typing

    from omegaconf.errors import ValidationError
    schema, key = getattr(cause, "object_type", None), getattr(cause, "key", None)
    if not isinstance(cause, ValidationError) or key is None or not dataclasses.is_dataclass(schema):
        return None
    try:
        hint = typing.get_type_hints(schema).get(str(key))
    except Exception:           # an annotation that does not resolve: OmegaConf's own words then
        return None
    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) != 1 or kinds[0] not in _TYPE_WORDS:
        return None
    kind, optional = kinds[0], type(None) in args
    field = {f.name: f for f in dataclasses.fields(schema)}.get(str(key))
    child = getattr(cause, "child_node", None)
    candidates = (getattr(child, "_value", lambda: None)(), None if field is None else field.default, _EXAMPLES[kind])
    example = next(v for v in candidates if type(v) is kind)
    example = str(example).lower() if kind is bool else example
    full_key = getattr(cause, "full_key", None) or key
    null = " (or null)" if optional else " (not null)" if getattr(cause, "value", "") is None else ""
    return f"expected {_TYPE_WORDS[kind]}{null}, e.g. {full_key}={example}"


def _hydra_message(exc) -> str | None:
    from hydra.errors import (
        ConfigCompositionException,
        InstantiationException,
        MissingConfigException,
        OverrideParseException,
    )
    text = str(exc)
    if isinstance(exc, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", text)
        options = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", text)
        if found and options and "/" in found.group(1):
            group, option = found.group(1).rsplit("/", 1)
            names = [o.strip() for o in options.group(1).splitlines() if o.strip()]
            return f"{group}={option}: no such option; choose one of {', '.join(names)}{nearest(option, names)}"
        return _flat(text.split("Config search path")[0])
    if isinstance(exc, OverrideParseException):
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("^", "See "))]
        return (f"cannot parse the override: {' '.join(ln.strip() for ln in lines)}; quote a value that holds "
                "special characters, e.g. key='value' (https://hydra.cc/docs/advanced/override_grammar/basic)")
    if isinstance(exc, InstantiationException):
        cause = exc.__cause__
        key = re.search(r"full_key: (\S+)", text)
        where = f"{key.group(1)}: " if key else ""
        if cause is not None and isinstance(cause, (*USER_ERRORS, TypeError)):
            return where + one_line(cause)
        return _flat(text)
    if isinstance(exc, ConfigCompositionException):
        cause = exc.__cause__
        unknown = re.match(r"Could not override '([^']+)'\.", text)
        if unknown and cause is not None and "not in" in str(cause):
            key = unknown.group(1)
            head, _, leaf = key.rpartition(".")
            schema = _schema_keys(head)
            near = nearest(leaf, schema, f"{head}." if head else "") if schema or not head else _nearest_conf_key(key)
            return (f"unknown key {key}{near} (`servelab --cfg job` prints every key; a leading + does not add "
                    "new ones)")
        if cause is not None:
            head = re.sub(r"^Error merging override ", "", _flat(text))
            return f"{head}: {_typed_value_fix(cause) or str(cause).splitlines()[0]}"
        return _flat(text)
    return None


def name_the_key(message: str, path: str, keys) -> str:
    """message about the config node at `path` ("workload.arrival") with its leading field named by the full
    key the user types: "rate_rps must be > 0" or "Poisson.rate_rps must be > 0" -> "workload.arrival.rate_rps
    must be > 0" when rate_rps is one of the node's keys; "path: message" otherwise."""
    m = re.match(r"(?:[A-Z]\w*\.)?(\w+)\b(.*)", message, re.S)
    if m and m.group(1) in {str(k) for k in keys}:
        return f"{path}.{m.group(1)}{m.group(2)}"
    return f"{path}: {message}"


# The pip extra that brings each Hydra plugin a launcher option (conf/hydra/launcher/) names; the others come with
# servelab itself.
PLUGIN_EXTRAS = {"hydra_submitit_launcher": "slurm"}


def missing_plugin(exc: BaseException) -> str | None:
    """The fix for Hydra's "Unknown plugin class : 'hydra_plugins.<package>.<module>.<Class>'" (a launcher option
    whose plugin is not installed), or None for any other exception."""
    m = re.fullmatch(r"Unknown plugin class : 'hydra_plugins\.(\w+)\.[\w.]+'", str(exc))
    if not isinstance(exc, RuntimeError) or not m:
        return None
    package = m.group(1)
    extra = PLUGIN_EXTRAS.get(package)
    install = f"pip install -e '.[{extra}]'" if extra else f"pip install {package.replace('_', '-')}"
    return (f"hydra/launcher needs the {package.replace('_', '-')} plugin, which is not installed: {install}, or "
            "leave hydra/launcher at its default (local: joblib)")


def is_user_error(exc: BaseException) -> bool:
    """Bad input rather than a bug: USER_ERRORS, Hydra's composition errors, a constructor that `instantiate`
    called with bad arguments (TypeError) or a `_target_` that does not import, and a launcher option whose plugin
    is not installed (missing_plugin)."""
    from hydra.errors import HydraException, InstantiationException
    if isinstance(exc, InstantiationException):
        cause = exc.__cause__
        return cause is None or isinstance(cause, (*USER_ERRORS, TypeError, ImportError))
    return isinstance(exc, (*USER_ERRORS, HydraException)) or missing_plugin(exc) is not None


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (Hydra's multi-line composition errors condensed)."""
    from hydra.errors import HydraException
    if isinstance(exc, HydraException):
        msg = _hydra_message(exc)
        if msg is not None:
            return msg
    plugin = missing_plugin(exc)
    if plugin is not None:
        return plugin
    if isinstance(exc, KeyError) and exc.args:
        return _flat(exc.args[0])
    return _flat(exc) or type(exc).__name__


def run_main(main, argv=None) -> int:
    """A module CLI's `main(argv)` with USER_ERRORS printed as `error: <one line>` (exit status 2) instead of a
    traceback (SERVELAB_FULL_ERROR=1: the traceback); anything else is a bug and keeps its traceback."""
    try:
        return main(argv)
    except USER_ERRORS as e:
        if tracebacks_wanted():
            raise
        fail(" ".join(str(e).split()) or type(e).__name__)
