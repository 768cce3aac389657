"""benchmarks/cross_machine_floor.py: experiments.real_vs_real's pairs over four runs (two machines, two runs
each) split into each machine's floor and the cross-machine floor; a clear stop when the runs differ."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "cross_machine_floor", Path(__file__).resolve().parents[2] / "benchmarks" / "cross_machine_floor.py")
cmf = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cmf)


def _folders(tmp_path):
    for m in ("a", "b"):
        for d in (tmp_path / m / "wl", tmp_path / m / "wl" / "repeat1"):
            d.mkdir(parents=True)
            (d / "wl_real.json").write_text("{}")
    return tmp_path / "a", tmp_path / "b"


def _pair(a, b, e2e, p50=0.0, busy=(1.0, 1.0)):
    return {"a": str(a), "b": str(b), "policy": "fcfs",
            "e2e_s": {"median_rel_err": e2e, "quantile_rel_err": {"p50": p50}},
            "ttft_s": {"quantile_rel_err": {"p50": -p50}}, "steps": {"busy_s_real": busy[0], "busy_s_sim": busy[1]}}


def test_floors_and_the_cross_machine_floor(tmp_path, monkeypatch):
    a, b = _folders(tmp_path)
    a0, a1, b0, b1 = a / "wl", a / "wl" / "repeat1", b / "wl", b / "wl" / "repeat1"
    pairs = [_pair(a0, a1, 0.01), _pair(a0, b0, 0.08, p50=0.1, busy=(2.0, 2.1)), _pair(a0, b1, 0.09),
             _pair(a1, b0, 0.10), _pair(a1, b1, 0.07), _pair(b0, b1, 0.002)]
    seen = []
    monkeypatch.setattr(cmf, "real_vs_real", lambda dirs, name: seen.append((dirs, name)) or {"pairs": pairs})
    t = cmf.cross_machine_table(a, b)
    assert seen == [([str(a0), str(a1), str(b0), str(b1)], "wl")]
    row = t.iloc[0]
    assert (row.workload, row.policy, row.floor_a, row.floor_b) == ("wl", "fcfs", 0.01, 0.002)
    assert row.cross_machine == pytest.approx(np.median([0.08, 0.09, 0.10, 0.07]))
    assert (row.e2e_p50_b_over_a, row.ttft_p50_b_over_a) == (0.1, -0.1)
    assert row.step_sum_b_over_a == pytest.approx(1.05)
    out = tmp_path / "x.md"
    assert cmf.main(["--a", str(a), "--b", str(b), "--out", str(out)]) == 0
    assert "cross-machine floor median 8.5%" in out.read_text()


def test_different_requests_stop_with_the_reason(tmp_path, monkeypatch):
    a, b = _folders(tmp_path)

    def refuse(dirs, name):
        raise ValueError("fcfs: x and y replayed different requests; compare runs of the same workload")
    monkeypatch.setattr(cmf, "real_vs_real", refuse)
    with pytest.raises(SystemExit, match="wl: fcfs: .* different requests"):
        cmf.cross_machine_table(a, b)
    with pytest.raises(SystemExit, match="no workload"):
        cmf.cross_machine_table(a, tmp_path / "nowhere")
