"""Shared set-up of the benchmark scripts' tests: the tiny CPU checkpoint and a script run from the repository root."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_ckpt(tmp_path) -> Path:
    """The tiny random Qwen3 checkpoint (tests/engine/tiny_model.py) in tmp_path/tiny; skips without torch."""
    pytest.importorskip("torch")
    from tests.engine.tiny_model import make_tiny_qwen3
    ckpt = tmp_path / "tiny"
    make_tiny_qwen3(ckpt)
    return ckpt


@pytest.fixture
def run_benchmark():
    """run_benchmark("script.py", *args, env=None): benchmarks/script.py in a subprocess from the repository root,
    checked, its output captured as text (CompletedProcess)."""
    def run(script: str, *args, env=None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *map(str, args)], check=True,
                              cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return run
