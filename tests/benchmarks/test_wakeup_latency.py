"""benchmarks/wakeup_latency.py: every transport and wait gives its one-way figures (a few messages, seconds)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_pair_is_timed(tmp_path):
    pytest.importorskip("zmq")
    out = tmp_path / "wakeup.json"
    run = subprocess.run([sys.executable, "benchmarks/wakeup_latency.py", "--messages", "4", "--warmup", "1",
                          "--gap-ms", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())["one_way_us"]
    assert set(figures) == {"zmq_block", "zmq_spin", "unix_block", "unix_spin"}
    assert all(0 < f["p50"] <= f["p90"] for f in figures.values())
