"""benchmarks/engine_throughput.py on the tiny CPU model: the time split sees every step generate() runs, with
overlap scheduling and without (a wrapper around a method generate() no longer called reported 0 steps)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_time_split_counts_every_step(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import engine_throughput

    out = tmp_path / "et.json"
    engine_throughput.main(["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--num-requests", "4",
                            "--min-len", "8", "--max-len", "24", "--hf-requests", "0", "--overlap-scheduling", "both",
                            "--out", str(out)])
    res = json.loads(out.read_text())
    for run in (res, res["overlap_on"]):
        split = run["time_split"]
        assert split["steps"] >= 8 and split["prefill_steps"] >= 1      # outputs of >= 8 tokens each
        assert 0 < split["prefill_s"] + split["decode_s"] <= run["elapsed_s"]
        assert 0 <= split["longest_step_index"] < split["steps"]
        assert run["triton_compiles"] == 0          # the CPU runs no Triton kernel
        slow = split["slowest_steps"]
        assert len(slow) == 5 and slow[0]["index"] == split["longest_step_index"]
        assert [x["seconds"] for x in slow] == sorted((x["seconds"] for x in slow), reverse=True)
        # a step's call launches within the step's own row (overlap: the next step's launch, still inside it)
        assert all(0 < x["launch_s"] <= x["seconds"] for x in slow)
