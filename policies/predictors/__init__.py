"""Output-length predictors for length-aware scheduling (sjf, srpt).

One file per policy; policies/registry.py discovers them.
"""
from policies.predictors.base import OutputLengthPredictor

__all__ = ["OutputLengthPredictor"]
