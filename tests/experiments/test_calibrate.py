"""Calibration inputs and reports: cycle-time targets of a real run's steps table, the steps.parquet path
through `python -m experiments.calibrate`, per-source held-out errors and tables scored but never fitted on."""
import json

import numpy as np
import pandas as pd
import pytest

from experiments import calibrate
from experiments.step_tables import calibration_table, cycle_times, read_step_table
from sim.cost_model.calibrated import CalibratedCostModel
from sim.overlap_timeline import overlapped_row_s, restarts

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


def test_device_seconds_give_a_device_model_and_the_host_share_overlap_hides(tmp_path):
    """A run table with device_time_s: the saved file gets a `device` model fitted on those alone, and an
    overlapped step's parts are its host seconds around its device seconds; without the column there is none
    (loop terms)."""
    run = _run_table(2)
    truth_dev = {k: v * 0.8 for k, v in TRUTH.items()}          # the device does 80% of every term
    dev = CalibratedCostModel(coefficients=truth_dev).predict_table(run.assign(serving_loop=0))
    path = tmp_path / "steps.parquet"
    run.assign(device_time_s=dev).to_parquet(path)
    out = tmp_path / "p.json"
    assert calibrate.main([str(path), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["device"]["metadata"]["target"] == "device_time_s"
    assert data["device"]["metadata"]["kind_floor"] == calibrate.DEVICE_KIND_FLOOR > 0    # every step kind counts
    assert data["metadata"]["device_heldout"]["median_rel_err"] < 0.01
    cm = CalibratedCostModel(data)
    assert cm.device_model.coefficients["decode_context_sum"] == pytest.approx(
        truth_dev["decode_context_sum"], rel=0.02)
    from engine.core.batch import Batch
    from engine.core.sequence import SamplingParams, Sequence
    seqs = [Sequence(i, list(range(100)), SamplingParams(max_tokens=5)) for i in range(8)]
    batch = Batch(seqs=seqs, num_new_tokens=[1] * 8, context_lens=[100] * 8)      # 8 decodes of 100 keys
    step, device = cm.step_time_s(batch), cm.device_model.step_time_s(batch)
    assert device < step and cm.host_time_s(batch) == pytest.approx(step - device)
    prepare, dev_s, loop = cm.overlap_parts_s(batch)
    assert dev_s == pytest.approx(device) and prepare + dev_s + loop == pytest.approx(step)
    c = cm.coefficients
    assert loop == pytest.approx(min(c["loop_step"] + 8 * c["loop_seqs"], step - device)) and prepare >= 0
    assert CalibratedCostModel(cm.to_dict()).device_model.coefficients == cm.device_model.coefficients
    table = run.assign(serving_loop=1)
    total, dev_pred = cm.predict_table(table), cm.device_model.predict_table(table)
    host = total - dev_pred
    loops = np.minimum(c["loop_step"] + c["loop_seqs"] * (table.num_prefill_seqs + table.num_decode_seqs), host)
    # rows apart (each scheduled on an idle device): the preparation, then the device; nothing hides
    apart = table.assign(start_time_s=10.0 * np.arange(len(table)), duration_s=1.0)
    np.testing.assert_allclose(cm.predict_table(apart, overlapped=True), total - loops)
    # rows back to back: the pipeline (sim/overlap_timeline.py), at most the synchronous sum
    tiled = table.assign(start_time_s=np.arange(len(table), dtype=float), duration_s=1.0)
    piped = cm.predict_table(tiled, overlapped=True)
    np.testing.assert_allclose(piped, overlapped_row_s(host - loops, dev_pred, loops, restarts(tiled.start_time_s,
                                                                                               tiled.duration_s)))
    assert piped.sum() < total.sum() and piped.sum() >= max(dev_pred.sum(), host.sum())
    # a device-only table adds rows to the device model and none to the step model
    extra = tmp_path / "overlapped.parquet"
    _run_table(3).assign(device_time_s=lambda t: CalibratedCostModel(coefficients=truth_dev).predict_table(
        t.assign(serving_loop=0)), duration_s=1.0).to_parquet(extra)
    assert calibrate.main([str(path), "--out", str(tmp_path / "r.json"), "--device-tables", str(extra)]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    # the device table's first row was launched on an idle device: its events are not the device's seconds
    assert r["device"]["metadata"]["num_fit_rows"] == 799 and r["metadata"]["num_fit_rows"] == 400
    assert r["coefficients"]["step"] == pytest.approx(data["coefficients"]["step"], rel=1e-6)
    # no device seconds: no device model, the host share is the loop terms
    path2 = tmp_path / "plain.parquet"
    run.to_parquet(path2)
    assert calibrate.main([str(path2), "--out", str(tmp_path / "q.json")]) == 0
    assert "device" not in json.loads((tmp_path / "q.json").read_text())


def test_a_profile_swap_shape_without_device_seconds_counts_as_device_time():
    """The profile does not time swap shapes on the device; device_table gives them their step time (a swap's
    copies run on the device's stream), so the device model prices swaps and the simulator does not hide them
    behind the forward pass. Swap rows with seqs, and rows with measured device seconds, keep theirs."""
    from experiments.calibrate import device_table
    rows = pd.DataFrame(dict(duration_s=[2e-3, 5e-3, 6e-3, 3e-3], device_time_s=[1.5e-3, np.nan, np.nan, 2.5e-3],
                             num_prefill_seqs=[0, 0, 0, 0], num_decode_seqs=[4, 0, 4, 0],
                             num_swap_blocks=[0, 16, 16, 8], serving_loop=[0, 0, 0, 0]))
    table = pd.concat([rows] * 20, ignore_index=True)
    dev = device_table(table)
    assert len(dev) == 60                                     # the swap step with seqs and no device seconds: out
    np.testing.assert_allclose(dev["duration_s"].to_numpy()[:3], [1.5e-3, 5e-3, 2.5e-3])


@pytest.mark.parametrize("module, args", [("experiments.calibrate", ["/nonexistent/steps.csv", "--out", "x.json"]),
                                          ("experiments.validate", ["--from-real", "/nonexistent", "--out-dir", "x"])])
def test_the_module_clis_print_a_user_error_on_one_line(tmp_path, module, args):
    """A missing input file: `error: <one line>`, exit status 2, no traceback (experiments.user_errors.run_main)."""
    import os
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "SERVELAB_FULL_ERROR": "0"})
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_the_profiled_engines_largest_prefill_graph():
    """The profile's record; before it was recorded, the engine's default where its CUDA graphs were on."""
    from engine.config import EngineConfig
    from experiments.calibrate import profile_graph_max_tokens
    assert profile_graph_max_tokens({"prefill_graph_max_tokens": 4096, "cuda_graphs": True}) == 4096
    assert profile_graph_max_tokens({"cuda_graphs": True}) == EngineConfig.prefill_graph_max_tokens
    assert profile_graph_max_tokens({"cuda_graphs": False}) == 0
    assert profile_graph_max_tokens({}) is None


def test_device_seconds_of_steps_launched_on_an_idle_device_are_not_fitted():
    """back_to_back_device_s drops device_time_s where a row starts after a gap (its events also span the host's
    preparation); rows back to back, the first row's successors and tables without start times keep theirs."""
    from experiments.calibrate import back_to_back_device_s
    t = pd.DataFrame(dict(start_time_s=[0.0, 1.0, 2.0, 5.0, 6.0], duration_s=[1.0, 1.0, 1.0, 1.0, 1.0],
                          device_time_s=[0.9, 0.8, 0.7, 0.6, 0.5]))
    out = back_to_back_device_s(t)
    assert np.isnan(out["device_time_s"].to_numpy()[[0, 3]]).all()
    assert out["device_time_s"].tolist()[1:3] == [0.8, 0.7] and out["device_time_s"].tolist()[4] == 0.5
    profile = t.drop(columns="start_time_s")
    assert back_to_back_device_s(profile).equals(profile)
    # measured_duration_s (the step itself, before the gap the next one waited) decides where rows touch
    tiled = t.assign(duration_s=[1.0, 1.0, 3.0, 1.0, 1.0], measured_duration_s=[1.0, 1.0, 1.0, 1.0, 1.0])
    assert np.isnan(back_to_back_device_s(tiled)["device_time_s"].to_numpy()[3])


def test_the_launch_gap_is_what_back_to_back_decode_cycles_outlast_their_device_seconds():
    """launch_gap_s: the median of cycle - device seconds over an overlapped replay's back-to-back pure decode
    rows; prefill rows, rows with copies, rows after an idle gap and profile rows do not count; too few rows give
    None. with_step_added puts it on every step of a model and records it."""
    from experiments.calibrate import MIN_DEVICE_ROWS, launch_gap_s
    n = 4 * MIN_DEVICE_ROWS
    dur = np.full(n, 1e-3)
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    dev = dur - 8e-6                                    # each decode row: 8 us past its device seconds
    prefill = np.arange(n) % 10 == 0
    dev = np.where(prefill, dur - 5e-4, dev)            # prefill rows: host work the device did not hide
    swaps = np.arange(n) % 10 == 5
    dev = np.where(swaps, dur - 3e-4, dev)
    t = pd.DataFrame(dict(start_time_s=start, duration_s=dur, device_time_s=dev,
                          num_prefill_seqs=prefill.astype(int), num_decode_seqs=np.where(prefill, 0, 8),
                          num_swap_blocks=np.where(swaps, 4, 0), serving_loop=1))
    late = t.assign(start_time_s=t["start_time_s"] + np.where(np.arange(n) % 10 == 7, 1e-3, 0.0).cumsum(),
                    device_time_s=np.where(np.arange(n) % 10 == 7, dur - 4e-4, dev))
    assert launch_gap_s([late]) == pytest.approx(8e-6)
    assert launch_gap_s([t.assign(serving_loop=0)]) is None             # a profile: no loop between its steps
    host_bound = t.assign(device_time_s=np.where(np.arange(n) % 2 == 0, dur / 2, dev))    # half wait for the host
    assert launch_gap_s([host_bound]) == pytest.approx(8e-6)
    assert launch_gap_s([t.iloc[:MIN_DEVICE_ROWS]]) is None           # 80% of them decode rows
    assert launch_gap_s([]) is None
    cm = CalibratedCostModel(coefficients=TRUTH)
    moved = cm.with_step_added(8e-6, launch_gap_s=8e-6)
    assert moved.coefficients["step"] == pytest.approx(TRUTH["step"] + 8e-6)
    assert moved.metadata["launch_gap_s"] == 8e-6
    t2 = _run_table(3).assign(serving_loop=1)
    np.testing.assert_allclose(moved.predict_table(t2) - cm.predict_table(t2), 8e-6, rtol=1e-9)


def test_a_replay_whose_host_drifts_is_flagged(tmp_path, capsys):
    """Two replays of one model: one steady, one whose steps ran 10% slower from the middle of its run on (a
    host that slowed down). Only the second spreads its residual medians by tenth past REPLAY_DRIFT_WARN."""
    steady, drifting = tmp_path / "steady.parquet", tmp_path / "drifting.parquet"
    _run_table(0).to_parquet(steady)
    t = _run_table(2)
    late = np.arange(len(t)) >= len(t) // 2
    t["duration_s"] = np.where(late, t["duration_s"] * 1.10, t["duration_s"])
    t.to_parquet(drifting)
    out = tmp_path / "p.json"
    assert calibrate.main([str(steady), str(drifting), "--out", str(out)]) == 0
    drift = json.loads(out.read_text())["metadata"]["replay_drift"]
    assert drift["steady.parquet"]["range"] < calibrate.REPLAY_DRIFT_WARN < drift["drifting.parquet"]["range"]
    assert len(drift["drifting.parquet"]["tenths"]) == 10
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("WARNING: drift within drifting.parquet") for line in lines)
    assert not any(line.startswith("WARNING: drift within steady.parquet") for line in lines)
