import pandas as pd
import pytest

from benchmarks.ttft_stalls import first_prefill_steps, ttft_by_stall


def test_first_prefill_step_is_the_first_that_scheduled_it():
    decisions = pd.DataFrame({"step": [0, 3, 7], "prefill_ids": ["1 2", "", "2 3"]})
    assert first_prefill_steps(decisions) == {"1": 0, "2": 0, "3": 7}


def test_requests_split_by_a_stall_at_their_prefill_or_first_token_step():
    real = pd.DataFrame({"request_id": [1, 2, 3, 4], "ttft_s": [0.010, 0.020, 0.030, 0.040]})
    sim = pd.DataFrame({"request_id": [1, 2, 3, 4], "ttft_s": [0.010, 0.018, 0.024, 0.040]})
    first = {"1": 0, "2": 5, "3": 9, "4": 12}
    # step 6 follows request 2's prefill (its first token), step 9 is request 3's prefill: both near
    t = ttft_by_stall(real, sim, first, stall_steps=[6, 9]).set_index("group")
    assert t.loc["near a stall", "requests"] == 2
    assert t.loc["away from stalls", "requests"] == 2
    assert t.loc["near a stall", "per_request_signed_median"] == pytest.approx((-0.1 - 0.2) / 2)
    assert t.loc["away from stalls", "per_request_signed_median"] == pytest.approx(0.0)
    assert t.loc["all", "p50_rel_err"] == pytest.approx(0.021 / 0.025 - 1)
