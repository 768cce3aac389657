"""Cost models: predicted seconds per scheduler step (see base.py for the contract).

    from sim.cost_model import get_cost_model
    cm = get_cost_model("roofline", model="Qwen3-0.6B", hardware="H200")
    cm.step_time_s(batch)

Hydra configs may instead name a class directly (`_target_: sim.cost_model.RooflineCostModel`).
"""
from __future__ import annotations

import sys

from engine.core.registry import discover
from sim.cost_model.base import STEP_TABLE_COLUMNS, CostModel, CostModelError, FittedCostModel, StepShape
from sim.cost_model.constant import ConstantCostModel
from sim.cost_model.roofline import RooflineCostModel

# Every concrete CostModel in this package's files, by name (adding one: a file + conf/backend/cost_model/NAME.yaml).
# Discovered on first use (`COST_MODELS`, get_cost_model, register_cost_model): discovery imports every module
# here, and the calibrated model's are most of the package's code, which a run with another model never needs
# (start-up pays for them, compiling them too where no bytecode is cached).
_cost_models: dict[str, type[CostModel]] | None = None


def _registry() -> dict[str, type[CostModel]]:
    global _cost_models
    if _cost_models is None:
        _cost_models = discover(sys.modules[__name__], CostModel)
    return _cost_models


def __getattr__(name: str):
    if name == "COST_MODELS":
        return _registry()
    if name == "CalibratedCostModel":
        from sim.cost_model.calibrated import CalibratedCostModel
        return CalibratedCostModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_cost_model(name: str):
    """Class decorator adding a cost model defined outside this package (e.g. in a study's own code)."""
    def deco(cls: type[CostModel]) -> type[CostModel]:
        if not (isinstance(cls, type) and issubclass(cls, CostModel)):
            raise TypeError(f"register_cost_model({name!r}) needs a CostModel subclass, got {cls!r}")
        models = _registry()
        if name in models and models[name] is not cls:
            raise ValueError(f"cost model name {name!r} is already registered to {models[name].__name__}")
        models[name] = cls
        return cls
    return deco


def get_cost_model(name: str, **kwargs) -> CostModel:
    models = _registry()
    cls = models.get(name)
    if cls is None:
        raise ValueError(f"unknown cost model {name!r}; known cost models: {sorted(models)}")
    return cls(**kwargs)


__all__ = ["COST_MODELS", "STEP_TABLE_COLUMNS", "CalibratedCostModel", "ConstantCostModel", "CostModel",
           "CostModelError", "FittedCostModel", "RooflineCostModel", "StepShape", "get_cost_model",
           "register_cost_model"]
