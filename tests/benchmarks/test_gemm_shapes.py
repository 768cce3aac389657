"""benchmarks/gemm_shapes.py: its split-K Triton kernel against a float32 product (--smoke, Triton interpreter), and
the roofline it compares with."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_checks_every_split(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "benchmarks/gemm_shapes.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count('"rel_err"') == 6


def test_roofline_is_the_slower_of_bytes_and_flops(monkeypatch):
    spec = importlib.util.spec_from_file_location("gemm_shapes", ROOT / "benchmarks" / "gemm_shapes.py")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # M=1: the weight's bytes (4096 x 1024 x 2) at 4 TB/s; M=4096: 2 x M x N x K flops at 1 PFLOP/s
    assert mod.roofline_us(1, 1024, 4096, 4e12, 1e15) == pytest.approx((4096 * 1024 + 1024 + 4096) * 2 / 4e12 * 1e6)
    assert mod.roofline_us(4096, 1024, 4096, 4e12, 1e15) == pytest.approx(2 * 4096 ** 2 * 1024 / 1e15 * 1e6)
