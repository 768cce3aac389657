"""benchmarks/cross_machine_floor.py on two hand-made real/ folders: each machine's floor, the cross-machine
floor over the four run pairs, the p50 and step-sum ratios, and a clear stop when the machines ran different
requests."""
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.runner_engine import EngineRunConfig

_SPEC = importlib.util.spec_from_file_location(
    "cross_machine_floor", Path(__file__).resolve().parents[2] / "benchmarks" / "cross_machine_floor.py")
cmf = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cmf)


def _write_run(d: Path, wl: str, policy: str, e2e, ttft, step_s: float, prompts=(10, 20, 30, 40)):
    d.mkdir(parents=True, exist_ok=True)
    n = len(e2e)
    pd.DataFrame(dict(request_id=range(n), status=["finished"] * n, num_prompt_tokens=list(prompts[:n]),
                      e2e_s=e2e, ttft_s=ttft)).to_parquet(d / f"{wl}_{policy}_requests.parquet")
    pd.DataFrame(dict(duration_s=[step_s / 2, step_s / 2])).to_parquet(d / f"{wl}_{policy}_steps.parquet")
    meta = d / f"{wl}_real.json"
    runs = json.loads(meta.read_text())["runs"] if meta.is_file() else {}
    runs[policy] = {}
    meta.write_text(json.dumps({"engine": asdict(EngineRunConfig(model_path="m")), "device": "cpu",
                                "vocab_size": 8, "max_model_len": 64, "num_kvcache_blocks": 4, "num_cpu_blocks": 0,
                                "runs": runs}))


def _machine(root: Path, e2e0, e2e1, step_s=1.0, prompts=(10, 20, 30, 40)):
    _write_run(root / "wl", "wl", "fcfs", e2e0, [0.01] * len(e2e0), step_s, prompts)
    _write_run(root / "wl" / "repeat1", "wl", "fcfs", e2e1, [0.01] * len(e2e1), step_s, prompts)


def test_floors_and_the_cross_machine_floor(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _machine(a, [1.0, 2.0, 3.0, 4.0], [1.01, 2.02, 3.03, 4.04], step_s=1.02)       # A repeats itself to 1%
    _machine(b, [1.1, 2.2, 3.3, 4.4], [1.1, 2.2, 3.3, 4.4])                         # B: exactly, 10% slower
    t = cmf.cross_machine_table(a, b)
    row = t.iloc[0]
    assert (row.workload, row.policy) == ("wl", "fcfs")
    assert row.floor_a == pytest.approx(0.01) and row.floor_b == pytest.approx(0.0)
    # pairs: A0/B = 1/1.1, A1/B = 1.01/1.1; |x - 1| medians 0.0909 and 0.0818, their median
    assert row.cross_machine == pytest.approx(np.median([1 - 1 / 1.1, 1 - 1 / 1.1, 1 - 1.01 / 1.1, 1 - 1.01 / 1.1]))
    assert row.e2e_p50_a_over_b == pytest.approx(2.5 / 2.75 - 1)
    assert row.step_sum_a_over_b == pytest.approx(1.02)
    out = tmp_path / "x.md"
    assert cmf.main(["--a", str(a), "--b", str(b), "--out", str(out)]) == 0
    assert "cross-machine floor median" in out.read_text()


def test_different_requests_stop_with_the_reason(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _machine(a, [1.0, 2.0], [1.0, 2.0])
    _machine(b, [1.0, 2.0], [1.0, 2.0], prompts=(11, 20))
    with pytest.raises(SystemExit, match="different requests"):
        cmf.cross_machine_table(a, b)
