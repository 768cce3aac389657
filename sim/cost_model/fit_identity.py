"""Which model and GPU a fitted cost-model file was made for, and whether a run's model and GPU match it.

    problem = fit_mismatch(cm.metadata, model_spec, hardware_spec)    # None, or "model ...; hardware ..."

A calibrated file prices the steps of the engine it was profiled on. Used for
another model (other layer count, widths, vocabulary) or another card, it
returns the same numbers and nothing says they are wrong, so the simulator
refuses it unless the run says `allow_mismatch: true`.

What a file says about itself (`metadata`, written by experiments.calibrate):
  * `model_dims`: the profiled checkpoint's dimensions (num_layers, hidden_size,
    num_q_heads, num_kv_heads, head_dim, vocab_size, intermediate_size); compared
    one by one with the run's sim.specs.ModelSpec when present. A random-weight
    checkpoint of a published config matches that config.
  * `model`: a name; without dims it is resolved with sim.specs.get_model_spec,
    dropping trailing `-suffix` words (`Qwen3-0.6B-random` is Qwen3-0.6B), and
    compared by spec name; a name no spec knows matches only itself.
  * `hardware` (or `device`, e.g. `NVIDIA H200`): resolved with
    sim.specs.get_hardware_spec, or matched when a name of the run's card is part
    of it.
A file that records neither (coefficients typed in by hand) is not checked.
"""
from __future__ import annotations

import re
from typing import Mapping

DIMS = ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "vocab_size", "intermediate_size")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def resolve_model_name(name: str):
    """The sim.specs.ModelSpec a file's model name stands for, or None (trailing `-words` dropped one by one)."""
    from sim.specs import get_model_spec
    parts = str(name).split("-")
    for end in range(len(parts), 0, -1):
        try:
            return get_model_spec("-".join(parts[:end]))
        except ValueError:
            continue
    return None


def model_dims_of(spec) -> dict:
    return {d: int(getattr(spec, d)) for d in DIMS}


def _model_problem(meta: Mapping, model) -> str | None:
    dims = meta.get("model_dims")
    label = meta.get("model")
    if isinstance(dims, Mapping) and all(d in dims for d in DIMS):
        differ = [f"{d} {dims[d]} vs {getattr(model, d)}" for d in DIMS if int(dims[d]) != int(getattr(model, d))]
        return f"model {label or '(unnamed)'} vs {model.name}: {', '.join(differ)}" if differ else None
    if not label or label == "unknown":
        return None
    spec = resolve_model_name(label)
    if spec is not None:
        same = spec.name == model.name or model_dims_of(spec) == model_dims_of(model)
    else:
        same = _key(label) == _key(model.name)
    return None if same else f"model {label} vs {model.name}"


def _hardware_problem(meta: Mapping, hardware) -> str | None:
    from sim.specs import get_hardware_spec
    from sim.specs.hardware import _ALIASES
    label = meta.get("hardware") if meta.get("hardware") not in (None, "unknown") else meta.get("device")
    if not label:
        return None
    try:
        same = get_hardware_spec(label).name == hardware.name
    except ValueError:
        names = [k for k, v in _ALIASES.items() if v == hardware.name] + [_key(hardware.name)]
        same = any(n and n in _key(label) for n in names)
    return None if same else f"hardware {label} vs {hardware.name}"


def fit_mismatch(metadata: Mapping | None, model=None, hardware=None) -> str | None:
    """What differs between a fitted file's model / GPU and the run's (sim.specs specs; None skips one), or None."""
    meta = dict(metadata or {})
    problems = [p for p in ((_model_problem(meta, model) if model is not None else None),
                            (_hardware_problem(meta, hardware) if hardware is not None else None)) if p]
    return "; ".join(problems) or None
