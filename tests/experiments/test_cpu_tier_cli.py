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
    (["cpu_cache_num_blocks=10", "cpu_cache_eviction=none"], "error: cpu_cache_eviction='none' is not an eviction "
                                                             "policy that keeps blocks; use one of fifo, lfu, lru"),
    (["cpu_cache_num_blocks=10", "cpu_cache_eviction=lruu"], "error: cpu_cache_eviction='lruu'"),
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
