"""benchmarks/gpu_overlap_check.py on the tiny CPU model: every case runs on its own cache and chunking (a case
used to inherit the cache of the case before it, so "chunked" ran preempting in the 24 blocks of "swap"), and the
two loops give the same tokens and the same step shapes where they must."""
import json


def test_cases_run_on_their_own_cache(tmp_path, tiny_ckpt, run_benchmark):
    out = tmp_path / "check.json"
    run_benchmark("gpu_overlap_check.py", "--model", tiny_ckpt, "--device", "cpu", "--num-requests", "4",
                  "--max-len", "24", "--skip-eager", "--out", out)
    res = json.loads(out.read_text())
    cases = res["cases"]
    full = cases["graphs"]["num_kvcache_blocks"]
    assert cases["recompute"]["num_kvcache_blocks"] == cases["swap"]["num_kvcache_blocks"] == 24 < full
    for name in ("prefix", "seeded", "eos", "chunked", "chunked_no_prefill_graphs"):
        assert cases[name]["num_kvcache_blocks"] == full, name
    assert cases["chunked"]["chunked_prefill"] and not cases["graphs"]["chunked_prefill"]
    assert res["ok"] and "eager" not in cases
    for name in ("graphs", "prefix", "seeded", "chunked"):
        assert cases[name]["first_step_shape_difference"] is None, name
