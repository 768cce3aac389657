"""servelab with the prefix cache's CPU tier: per-tier hit rates in the summary; bad tier settings get one
`error:` line naming the field."""
import json

import pytest

from tests.experiments.cli import QUIET, SMALL, error_line, in_tmp, servelab  # noqa: F401  (in_tmp: a fixture)


@pytest.mark.parametrize("args, expected", [
    (["cpu_cache_num_blocks=200000"], "error: cpu_cache_num_blocks=200000 (341.8 GiB of Qwen3-0.6B KV, plus 4.0 GiB "
                                      "of swap space) exceeds the 256 GiB of host memory per GPU of H200 "
                                      "(hardware.host_memory_gib); use cpu_cache_num_blocks <= 147456"),
    (["cpu_cache_num_blocks=-1"], "error: cpu_cache_num_blocks must be >= 0"),
    (["cpu_cache_gib=400"], "error: cpu_cache_gib=400 (234057 blocks of Qwen3-0.6B KV, plus 4.0 GiB of swap space) "
                            "exceeds the 256 GiB of host memory per GPU of H200 (hardware.host_memory_gib); use "
                            "cpu_cache_gib <= 252"),
    (["cpu_cache_gib=10", "cpu_cache_num_blocks=100"], "error: cpu_cache_num_blocks=100 and cpu_cache_gib=10 both "
                                                       "size the CPU tier; give one of them"),
    (["cpu_cache_gib=-2"], "error: cpu_cache_gib must be a finite number of GiB >= 0"),
    (["cpu_cache_num_blocks=10", "cpu_cache_eviction=none"], "error: cpu_cache_eviction='none' is not an eviction "
                                                             "policy that keeps blocks; use one of fifo, lfu, lru"),
    (["cpu_cache_num_blocks=10", "cpu_cache_eviction=lruu"], "error: cpu_cache_eviction='lruu'"),
    # the names are eviction=' options: a misspelt or upper-case one gets the nearest, as eviction=LRU does
    (["cpu_cache_num_blocks=10", "cpu_cache_eviction=LRU"], "error: cpu_cache_eviction='LRU' is not an eviction "
                                                            "policy that keeps blocks; use one of fifo, lfu, lru; did "
                                                            "you mean 'cpu_cache_eviction=lru'?"),
    # checked without a tier too: a misspelt name is never silently ignored
    (["cpu_cache_eviction=XYZ"], "error: cpu_cache_eviction='XYZ' is not an eviction policy that keeps blocks"),
    (["cpu_cache_num_blocks=10", "enable_prefix_caching=false"], "error: cpu_cache_num_blocks=10 needs the GPU "
                                                                 "prefix cache"),
])
def test_bad_tier_settings(in_tmp, monkeypatch, capsys, args, expected):
    assert error_line(monkeypatch, capsys, *SMALL, *args).startswith(expected)


def test_summary_reports_hits_per_tier(in_tmp, monkeypatch, capsys):
    args = ["workload.num_requests=300", "workload.arrival.rate_rps=50", "num_kvcache_blocks=400",
            "cpu_cache_num_blocks=2000", "hydra.run.dir=out", *QUIET[:1], "plots=false"]
    code, out, err = servelab(monkeypatch, capsys, *args)
    assert code in (0, None), err
    m = json.loads((in_tmp / "out" / "summary.json").read_text())["metrics"]
    assert m["prefix_cache_hit_rate_gpu"] + m["prefix_cache_hit_rate_cpu"] == pytest.approx(m["prefix_cache_hit_rate"])
    assert "prefix-cache hits" in out and "CPU tier" in out


def test_tier_in_gib_runs_with_the_blocks_it_resolves_to(in_tmp, monkeypatch, capsys):
    # Qwen3-8B (the default model): 36 layers x 8 KV heads x 128 x 2 bytes x K, V = 144 KiB a token, 2.25 MiB a
    # block: 0.5 GiB holds 227 blocks
    args = ["workload.num_requests=200", "workload.arrival.rate_rps=50", "num_kvcache_blocks=300",
            "cpu_cache_gib=0.5", "hydra.run.dir=out", *QUIET[:1], "plots=false"]
    code, out, err = servelab(monkeypatch, capsys, *args)
    assert code in (0, None), err
    s = json.loads((in_tmp / "out" / "summary.json").read_text())
    assert (s["meta"]["cpu_cache_num_blocks"], s["meta"]["cpu_cache_gib"]) == (227, 0.5)
    assert "+227 CPU-tier prefix blocks = cpu_cache_gib 0.5" in out
    assert "prefix-cache hits" in out and "prefix_cache_hit_rate_cpu" in s["metrics"]


def test_tier_plot_of_a_sweep(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from experiments.tier_plot import main, tier_table
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "experiments.run", "-m", "experiment=smoke", "workload.num_requests=200",
           "workload.arrival.rate_rps=50", "num_kvcache_blocks=300", "cpu_cache_num_blocks=0,3000",
           "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path / 'sw'}", *QUIET]
    proc = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = tier_table(tmp_path / "sw")
    assert list(table["cpu_cache_num_blocks"]) == [0, 3000]
    assert table["prefix_cache_hit_rate_cpu"].iloc[0] == 0
    main([str(tmp_path / "sw"), "--out", str(tmp_path / "rep")])
    assert (tmp_path / "rep" / "cpu_tier.png").stat().st_size > 10_000
    assert len(open(tmp_path / "rep" / "cpu_tier.csv").read().splitlines()) == 3
    # the same sweep again: the plot is left as it was; an earlier, different one is kept beside, not overwritten
    main([str(tmp_path / "sw"), "--out", str(tmp_path / "rep")])
    assert not (tmp_path / "rep.1").exists()
    (tmp_path / "rep" / "cpu_tier.csv").write_text("an earlier table\n")
    main([str(tmp_path / "sw"), "--out", str(tmp_path / "rep")])
    assert (tmp_path / "rep.1" / "cpu_tier.csv").read_text() == "an earlier table\n"
    assert len(open(tmp_path / "rep" / "cpu_tier.csv").read().splitlines()) == 3
    # a sweep whose runs all have the same tier size has nothing to compare: refused, naming the value
    import shutil
    shutil.rmtree(next((tmp_path / "sw").glob("cpu_cache_num_blocks=3000,*")))
    with pytest.raises(ValueError, match="every run has cpu_cache_num_blocks=0, nothing to compare"):
        tier_table(tmp_path / "sw")
