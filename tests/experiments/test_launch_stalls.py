from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from experiments.launch_stalls import first_prefill_steps, run_ttft_by_stall, ttft_by_stall


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
    assert "near a stall" not in ttft_by_stall(real, sim, first, stall_steps=[])["group"].tolist()


def test_a_kept_runs_stalls_come_from_its_launch_host_seconds(monkeypatch):
    """Step 3's launch took 5 ms beyond the model's host seconds: steps 2 and 3 are near a stall, so request 2
    (prefill at step 2) is near and request 1 (prefill at step 0) is not."""
    from experiments import step_tables
    steps = pd.DataFrame({"step": np.arange(6), "launch_host_s": [1e-3, 1e-3, 1e-3, 6e-3, 1e-3, 1e-3]})
    monkeypatch.setattr(step_tables, "priced_steps", lambda s, cm, overlapped=False: (s, np.ones(len(s))))
    model = SimpleNamespace(overlap_parts_table=lambda s: (np.full(len(s), 1e-3),))
    run = SimpleNamespace(steps=steps, requests=pd.DataFrame({"request_id": [1, 2], "ttft_s": [0.01, 0.02]}))
    sim = SimpleNamespace(requests=pd.DataFrame({"request_id": [1, 2], "ttft_s": [0.01, 0.01]}))
    decisions = pd.DataFrame({"step": [0, 2], "prefill_ids": ["1", "2"]})
    table, near, total = run_ttft_by_stall(run, sim, model, decisions)
    assert (near, total) == (2, 6)
    t = table.set_index("group")
    assert t.loc["near a stall", "requests"] == 1 and t.loc["near a stall", "p50_rel_err"] == pytest.approx(-0.5)
    assert t.loc["away from stalls", "p50_rel_err"] == pytest.approx(0.0)
