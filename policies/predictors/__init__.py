"""Output-length predictors for length-aware scheduling (sjf, srpt)."""
from policies.predictors.base import OutputLengthPredictor
from policies.predictors.noisy import NoisyPredictor
from policies.predictors.oracle import OraclePredictor

__all__ = ["OutputLengthPredictor", "OraclePredictor", "NoisyPredictor"]
