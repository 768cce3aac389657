"""benchmarks/gpu_compile_stall.sh --smoke: the before/after pair runs (the "before" side re-makes the placeholder
kernel from its source) and the summary holds both runs' compile counts and step split."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_pair_writes_both_sides_and_a_summary(tmp_path):
    env = {**os.environ, "REPEATS": "1", "PYTHON": sys.executable}
    out = subprocess.run(["bash", "benchmarks/gpu_compile_stall.sh", "--smoke", "--out", str(tmp_path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "compile_stall_cpu_smoke.json").read_text())
    assert [(r["side"], r["repeat"]) for r in summary["runs"]] == [("before", 1), ("after", 1)]
    for run in summary["runs"]:
        assert run["triton_compiles"] == 0 and run["output_tokens_per_s"] > 0     # the CPU runs no Triton kernel
        assert run["prefill_s"] > 0 and run["longest_step_index"] is not None
    assert summary["after_over_before"] > 0
    assert "after / before, mean output tok/s" in (tmp_path / "gpu_compile_stall.log").read_text()
