"""Calibration inputs and reports: cycle-time targets of a real run's steps table, the steps.parquet path
through `python -m experiments.calibrate`, per-source held-out errors and tables scored but never fitted on."""
import json

import numpy as np
import pandas as pd
import pytest

from experiments import calibrate
from experiments.step_tables import calibration_table, cycle_times, read_step_table
from sim.cost_model.calibrated import CalibratedCostModel

TRUTH = dict(step=4e-3, eager_step=2e-2, num_seqs=1e-5, prefill_attention_pairs=5e-10, decode_context_sum=3e-8,
             lm_head_rows=2e-6, loop_step=3e-4, loop_seqs=0.0)


def test_cycle_time_adds_the_host_gap_but_not_an_idle_wait():
    steps = pd.DataFrame(dict(start_time_s=[0.0, 0.0105, 0.0210, 1.0, 1.0102],
                              duration_s=[0.0100, 0.0100, 0.0100, 0.0100, 0.0100]))
    # gaps: 0.5 ms, 0.5 ms, ~969 ms (idle: waiting for an arrival), 0.2 ms, none (last step)
    np.testing.assert_allclose(cycle_times(steps), [0.0105, 0.0105, 0.0105, 0.0102, 0.0105], rtol=1e-9)
    with pytest.raises(ValueError, match="start_time_s must be non-decreasing"):
        cycle_times(steps.iloc[::-1])


def _run_table(seed: int, n: int = 400) -> pd.DataFrame:
    """A synthetic real run's steps table: decode steps and some prefills, times from TRUTH plus a host gap."""
    rng = np.random.default_rng(seed)
    pre = rng.random(n) < 0.1
    p_tok = np.where(pre, rng.integers(50, 1500, n), 0)
    d = np.where(pre, 0, rng.integers(1, 64, n))
    t = pd.DataFrame(dict(num_prefill_seqs=pre.astype(int), num_prefill_tokens=p_tok, prefill_context_sum=p_tok,
                          prefill_attention_pairs=p_tok * (p_tok + 1) // 2, num_prefill_samples=pre.astype(int),
                          num_decode_seqs=d, decode_context_sum=d * rng.integers(100, 2000, n), num_swap_blocks=0,
                          num_swapped_out=0, num_swapped_in=0, serving_loop=1))
    cycle = CalibratedCostModel(coefficients=TRUTH).predict_table(t) * rng.normal(1.0, 0.01, n)
    gap = 2e-4
    start = np.concatenate([[0.0], np.cumsum(cycle)[:-1]])
    return t.drop(columns="serving_loop").assign(start_time_s=start, duration_s=cycle - gap, replica=0)


def test_calibrate_from_a_run_steps_parquet(tmp_path):
    run, other = tmp_path / "steps.parquet", tmp_path / "other_slice.parquet"
    _run_table(0).to_parquet(run)
    _run_table(1).to_parquet(other)
    table = read_step_table(run)
    assert (table["serving_loop"] == 1).all() and "measured_duration_s" in table
    out = tmp_path / "p.json"
    assert calibrate.main([str(run), "--out", str(out), "--eval", str(other)]) == 0
    data = json.loads(out.read_text())
    meta = data["metadata"]
    assert meta["heldout"]["num_rows"] == 80 and meta["heldout"]["median_rel_err"] < 0.02
    assert abs(meta["heldout"]["sum_pred_over_real"] - 1.0) < 0.01
    ev = meta["eval_not_fitted"]["other_slice.parquet"]
    assert ev["num_rows"] == 400 and ev["median_rel_err"] < 0.02
    cm = CalibratedCostModel(data)
    # the cycle (step + gap) is what the fit sees; eager steps and KV reads come back
    assert cm.coefficients["eager_step"] == pytest.approx(TRUTH["eager_step"], rel=0.05)
    assert cm.coefficients["decode_context_sum"] == pytest.approx(TRUTH["decode_context_sum"], rel=0.05)


def test_profile_rows_have_no_serving_loop_and_bad_tables_fail_clearly(tmp_path):
    prof = pd.DataFrame(dict(kind=["decode"], duration_s=[1e-3], num_prefill_seqs=[0], num_prefill_tokens=[0],
                             prefill_context_sum=[0], prefill_attention_pairs=[0], num_prefill_samples=[0],
                             num_decode_seqs=[4], decode_context_sum=[40], num_swap_blocks=[0]))
    assert calibration_table(prof)["serving_loop"].tolist() == [0]
    bad = tmp_path / "bad.csv"
    prof.drop(columns="decode_context_sum").to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['decode_context_sum'\]"):
        read_step_table(bad)
    with pytest.raises(FileNotFoundError, match="step table not found"):
        read_step_table(tmp_path / "missing.parquet")
