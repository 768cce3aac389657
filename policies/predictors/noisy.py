"""noisy: the true output length times a log-normal error.

    predicted = max(1, round(max_output_tokens * exp(eps))),   eps ~ N(0, sigma)

sigma = 0 is the oracle; larger sigma models a worse learned length predictor
(sigma = 0.5 puts ~68% of predictions within a factor 1.65 of the truth).
The error of one request is drawn from a numpy Generator seeded by
SeedSequence((seed, xxh64(repr(request_id)))), so a request's prediction does
not depend on how many other requests were predicted before it or on call
order: changing the workload mix never shifts another request's error.
"""
from __future__ import annotations

import math

import numpy as np
import xxhash

from policies.predictors.base import OutputLengthPredictor


def _request_key(request_id) -> int:
    """Stable 64-bit integer for a request id (Python's hash() of str is salted per process)."""
    return xxhash.xxh64(repr(request_id).encode()).intdigest()


class NoisyPredictor(OutputLengthPredictor):
    name = "noisy"

    def __init__(self, sigma: float = 0.5, seed: int | np.random.Generator = 0):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"NoisyPredictor.sigma must be a finite float >= 0 (0 = oracle), got {sigma!r}")
        if isinstance(seed, np.random.Generator):
            # Spawned from the run's root generator: take one base seed from it, once.
            seed = int(seed.integers(0, 2**63))
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"NoisyPredictor.seed must be an int >= 0 or a numpy Generator, got {seed!r}")
        self.sigma = float(sigma)
        self.seed = int(seed)
        self._factor: dict = {}     # request_id -> exp(eps), the multiplicative error

    def error_factor(self, request_id) -> float:
        f = self._factor.get(request_id)
        if f is None:
            rng = np.random.default_rng(np.random.SeedSequence((self.seed, _request_key(request_id))))
            f = math.exp(rng.normal(0.0, self.sigma)) if self.sigma > 0 else 1.0
            self._factor[request_id] = f
        return f

    def predict(self, seq) -> int:
        return max(1, round(seq.max_output_tokens * self.error_factor(seq.request_id)))

    def forget(self, request_id) -> None:
        self._factor.pop(request_id, None)

    def __repr__(self) -> str:
        return f"NoisyPredictor(sigma={self.sigma}, seed={self.seed})"
