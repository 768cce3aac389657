"""benchmarks/host_breakdown.py on the tiny CPU model: one row per launch, in launch order, each launch's own CPU
seconds no more than its wall seconds, and HOST_BREAKDOWN_GC_FREEZE=1 freezing the start-up heap."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_rows_per_launch_with_times_and_cpu_seconds(tmp_path, tiny_ckpt, run_benchmark):
    import pandas as pd
    out = tmp_path / "hb.parquet"
    res = run_benchmark("host_breakdown.py", "--out", out, "--", "--model", tiny_ckpt, "--device", "cpu",
                        "--num-requests", "6", "--arrival", "poisson", "--rate-rps", "50", "--prompt-len", "16:64",
                        "--output-len", "4:8", "--num-kvcache-blocks", "64", "--policies", "vllm",
                        "--max-model-len", "512", "--no-roofline", "--no-plot", "--max-wall-s", "60",
                        "--out-dir", tmp_path / "run", "--name", "hb",
                        env={**os.environ, "HOST_BREAKDOWN_GC_FREEZE": "1"})
    assert "objects frozen out of the collector's reach" in res.stdout
    assert "launches, median" in res.stdout and "the collector in all launches" in res.stdout
    df = pd.read_parquet(out)
    assert len(df) > 6 and df["t_s"].iloc[0] == 0.0 and df["t_s"].is_monotonic_increasing
    assert (df["launch_cpu_s"] <= df["launch_s"] + 1e-3).all() and (df["launch_cpu_s"] > 0).all()
    assert (df["schedule_cpu_s"] <= df["schedule_s"] + 1e-3).all()
    assert (df["num_decode_seqs"] > 0).any() and (df["num_prefill_seqs"] > 0).any()


def test_summary_counts_stalls_their_cpu_share_and_first_launches():
    pd = pytest.importorskip("pandas")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from host_breakdown import summary
    ms = 1e-3
    df = pd.DataFrame(dict(                   # median launch 1 ms; rows 2 and 4 stall (> 3 ms)
        launch_s=[1 * ms, 1 * ms, 6 * ms, 1 * ms, 5 * ms, 1 * ms],
        launch_cpu_s=[1 * ms, 1 * ms, 6 * ms, 1 * ms, 1 * ms, 1 * ms],
        gc_s=[0.0, 0.0, 2 * ms, 0.0, 0.0, 0.0], gc_gen2=[0, 0, 0, 0, 0, 0],
        num_prefill_seqs=[1, 0, 0, 0, 0, 0], num_decode_seqs=[0, 4, 9, 4, 4, 9]))
    out = summary(df)
    assert "6 launches, median 1.00 ms; 2 more than 2 ms above it (0.011 s)" in out
    assert "CPU seconds / wall seconds 0.64" in out                  # (6 + 1) / (6 + 5)
    assert "the collector 2.0 ms of them; the first launch of a decode batch size: 1" in out   # row 2: 9 first
