"""Helpers shared by the length- and rank-aware scheduling policies (ranking, validation)."""
from __future__ import annotations

import math

from policies.scheduling.base import SchedulingPolicy

# Cost of one prompt token in units of one decode step of the same request. A decode
# step of an 8B model on an H200 is weight-read bound (~16 GB / 4.3 TB/s ~ 4 ms), in
# which time the GPU prefills roughly 200-250 tokens (2 * 8e9 FLOP/token at ~0.8 PFLOP/s):
# so a prompt token costs ~1/256 of an output token. Tune per (model, hardware).
DEFAULT_PROMPT_TOKEN_WEIGHT = 1.0 / 256


def arrival_rank(seq) -> tuple:
    """FCFS tie-break: arrival time, then admission order; a never-admitted sequence ranks
    after an admitted one of the same arrival time, so equal keys never cause preemption."""
    return (seq.arrival_time_s, seq.admit_order if seq.admit_order >= 0 else math.inf)


def check_weight(policy: str, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{policy}.{field} must be a finite number >= 0 (prompt-token cost in decode-step "
                         f"units, default {DEFAULT_PROMPT_TOKEN_WEIGHT:g}), got {value!r}")
    return float(value)


def check_positive(policy: str, field: str, value, *, integer: bool = False):
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value <= 0:
        kind = "an integer >= 1" if integer else "a finite number > 0"
        raise ValueError(f"{policy}.{field} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


def check_finite(policy: str, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{policy}.{field} must be a finite number (seconds), got {value!r}")
    return float(value)


def check_preemption_mode(policy: str, value, note: str) -> str:
    """value if it is "recompute" or "swap"; note says what the policy's source does (e.g. "FastServe swaps")."""
    if value not in ("recompute", "swap"):
        raise ValueError(f"{policy}: preemption_mode must be 'recompute' or 'swap' ({note}), got {value!r}")
    return value


def default_predictor(predictor):
    if predictor is None:
        from policies.predictors.oracle import OraclePredictor
        return OraclePredictor()
    if not hasattr(predictor, "predict"):
        raise ValueError(f"predictor must be an OutputLengthPredictor (oracle, noisy), got {predictor!r}")
    return predictor


class PredictedLengthPolicy(SchedulingPolicy):
    """Base of the policies ranked by a predicted output length (sjf, srpt): the
    predictor, the prompt-token weight, and forgetting a finished request's prediction."""
    ranked = True
    fast_forward_ok = True

    def __init__(self, victim=None, predictor=None, prompt_token_weight: float = DEFAULT_PROMPT_TOKEN_WEIGHT):
        super().__init__(victim)
        self.predictor = default_predictor(predictor)
        self.prompt_token_weight = check_weight(self.name, "prompt_token_weight", prompt_token_weight)

    def on_finish(self, seq) -> None:
        self.predictor.forget(seq.request_id)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(victim={self.victim.name}, predictor={self.predictor!r}, "
                f"prompt_token_weight={self.prompt_token_weight:g})")
