"""SamplingParams: a NaN or a non-number fails at construction, naming the field (NaN passes every range check)."""
import numpy as np
import pytest

from engine.core.sequence import SamplingParams


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=float("nan")), "temperature must be a finite number, got nan"),
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
    (dict(temperature=None), "temperature must be a number, got None"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(top_k="5"), "top_k must be an integer, got '5'"),
    (dict(max_tokens=2.5), "max_tokens must be an integer, got 2.5"),
    (dict(max_tokens=float("nan")), "max_tokens must be an integer"),
    (dict(seed="x"), "seed must be an integer"),
])
def test_bad_values_name_the_field(kw, match):
    with pytest.raises(ValueError, match=f"SamplingParams.{match}"):
        SamplingParams(**kw)


def test_numpy_and_integral_values_are_accepted():
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), max_tokens=np.int64(7), seed=np.int32(1))
    assert (p.temperature, p.top_k, p.max_tokens, p.seed) == (0.5, 3, 7, 1)
    assert type(p.max_tokens) is int and SamplingParams(max_tokens=8.0).max_tokens == 8
