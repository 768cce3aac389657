"""benchmarks/decode_live_gap.py on the tiny CPU model: every mode runs each shape (the placeholder modes through
the runner's placeholder path, resolved from the launch before), one row per (runner, shape, mode)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_mode_times_every_shape_on_both_runners(tmp_path):
    pytest.importorskip("torch")
    import pandas as pd

    from tests.engine.tiny_model import make_tiny_qwen3
    ckpt = tmp_path / "tiny"
    make_tiny_qwen3(ckpt)
    out = tmp_path / "gap.csv"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_live_gap.py"), "--model", str(ckpt),
                    "--device", "cpu", "--max-model-len", "512", "--num-kvcache-blocks", "256", "--repeats", "2",
                    "--chain", "8", "--smoke", "--sync-runner", "--profile-max-model-len", "512", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=300)
    df = pd.read_csv(out)
    live = df[df["runner"] == "live"]
    assert set(live["mode"]) == {"profile", "back_to_back", "scattered", "placeholder", "chain", "chain_contiguous"}
    assert live.groupby("shape")["mode"].nunique().eq(6).all() and live["shape"].nunique() == 3
    sync = df[df["runner"] == "profile_runner"]
    assert list(sync["mode"].unique()) == ["profile_sync"] and len(sync) == 3
    assert (live[live["mode"].str.startswith("chain")]["n"] == 8 - 5).all()      # the chain's first 5 steps dropped
