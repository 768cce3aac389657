"""oracle: the true output length, known in advance.

The workload gives every request its output length (`max_output_tokens`, which
the engine enforces with ignore_eos); an oracle predictor returns it. This is
the upper bound length-aware schedulers are measured against (e.g. the SJF /
SRPT oracles of "Efficient LLM Scheduling by Learning to Rank", Fu et al. 2024).
"""
from __future__ import annotations

from policies.predictors.base import OutputLengthPredictor


class OraclePredictor(OutputLengthPredictor):
    name = "oracle"

    def predict(self, seq) -> int:
        return seq.max_output_tokens
