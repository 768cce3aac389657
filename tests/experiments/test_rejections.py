"""Requests the run's limits reject (too long for max_model_len, more KV blocks than the cache) are counted in
summary.json with their reasons and warned about on stderr with the fix; the policy's own rejections are not."""
import json

import pandas as pd

from experiments.rejections import rejection_meta, rejection_warning
from tests.experiments.cli import QUIET, in_tmp, servelab  # noqa: F401  (in_tmp: a fixture)


def table(reasons):
    return pd.DataFrame({"request_id": range(len(reasons)),
                         "status": ["finished" if r is None else "rejected" for r in reasons],
                         "reject_reason": reasons})


def test_reasons_group_by_cause_most_common_first():
    meta = rejection_meta(table([None, "needs 15 KV blocks at completion, the cache has 10",
                                 "needs 40 KV blocks at completion, the cache has 10",
                                 "prompt (90) + max_tokens (20) exceeds max_model_len (100)",
                                 "policy edf: cannot make its TTFT target"]))
    assert meta["num_rejected_by_limits"] == 3 and meta["rejected_by_limits_fraction"] == 3 / 5
    kv, length = meta["reject_reasons"]
    assert kv["num_requests"] == 2 and kv["max_kv_blocks_needed"] == 40 and kv["num_kvcache_blocks"] == 10
    assert length["num_requests"] == 1 and length["max_model_len"] == 100
    line = rejection_warning(meta, 5, model_max_len=40960)
    assert line.startswith("WARNING: 3 of 5 requests (60%) were rejected on arrival by the run's limits")
    assert "raise num_kvcache_blocks to at least 40" in line and "raise max_model_len (up to 40960" in line


def test_policy_rejections_alone_give_no_warning():
    meta = rejection_meta(table([None, "policy edf: late"]))
    assert meta["num_rejected_by_limits"] == 0 and rejection_warning(meta, 2) is None


def test_a_cache_too_small_warns_and_is_recorded(in_tmp, monkeypatch, capsys):
    # used to be rc 0 with "finished / rejected 7 / 43" and nothing on stderr
    code, out, err = servelab(monkeypatch, capsys, *QUIET, "print_summary=true", "num_kvcache_blocks=10",
                              "workload.num_requests=50", "hydra.run.dir=run")
    assert code == 0, err
    warning = [ln for ln in err.splitlines() if ln.startswith("WARNING")]
    assert len(warning) == 1 and "43 of 50 requests" in warning[0], err
    assert "43 need more KV blocks at completion than the cache has" in warning[0]
    assert "raise num_kvcache_blocks to at least" in warning[0]
    assert "7 / 43 (43 by the run's limits: see the WARNING)" in out
    meta = json.loads((in_tmp / "run" / "summary.json").read_text())["meta"]
    assert meta["num_rejected_by_limits"] == 43 and meta["reject_reasons"][0]["num_requests"] == 43
    assert meta["rejected_by_limits_warning"] == warning[0]
