"""A request the scheduling policy rejects while it waits gets a 503 "policy_rejected" answer (an error
event when it streams), never a hang; backend=http records it as rejected, with the workload's tenant and
SLO columns."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from engine.core.requests import RequestSpec  # noqa: E402
from experiments.http_replay import HttpTarget, replay  # noqa: E402
from experiments.runner_http import http_requests, requests_frame  # noqa: E402
from policies.scheduling.vllm import VLLMPolicy  # noqa: E402
from tests.experiments.serve.server import running_server  # noqa: E402

LONG = 10       # prompts longer than this are rejected


class RejectsLongPrompts(VLLMPolicy):
    name = "rejects_long"
    may_reject = True

    def reject_reason(self, seq, view):
        return f"prompt longer than {LONG} tokens" if seq.num_prompt_tokens > LONG else None


@pytest.fixture(scope="module")
def srv(ckpt):
    with running_server(ckpt, policy=RejectsLongPrompts()) as s:
        yield s


def test_a_rejected_request_gets_503_with_the_policy_reason(srv):
    r = httpx.post(f"{srv.url}/completions", json={"prompt": list(range(1, 20)), "max_tokens": 3}, timeout=30)
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "policy_rejected" and err["type"] == "service_unavailable"
    assert "scheduling policy rejected" in err["message"] and "longer than 10 tokens" in err["message"]
    ok = httpx.post(f"{srv.url}/completions", json={"prompt": [1, 2, 3], "max_tokens": 3}, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    srv.wait_idle()
    assert not srv.llm._live and srv.llm.scheduler.block_manager.num_used_blocks == 0
    assert "servelab_request_policy_rejected_total{model_name=\"tiny\"} 1.0" in httpx.get(f"{srv.base}/metrics").text


def test_a_rejected_streaming_request_ends_with_an_error_event(srv):
    body = {"prompt": list(range(1, 20)), "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{srv.url}/completions", json=body, timeout=30) as r:
        events = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "policy_rejected" and "longer than 10 tokens" in err["message"]
    srv.wait_idle()


def test_backend_http_records_policy_rejections_and_the_workloads_targets(srv):
    specs = [RequestSpec(0, 0.0, 5, 3, tenant="a", ttft_slo_s=30.0), RequestSpec(1, 0.02, 16, 3, tenant="b",
                                                                                  ttft_slo_s=30.0, tpot_slo_s=5.0),
             RequestSpec(2, 0.04, 6, 3)]
    out = replay(http_requests(specs, 512, 0), HttpTarget(srv.base, temperature=0.0))
    df = requests_frame(out, {s.request_id: s for s in specs}).set_index("request_id")
    assert out.num_failed == 0, [r.error for r in out.records]
    assert list(df["status"]) == ["finished", "rejected", "finished"]
    assert "longer than 10 tokens" in df.loc[1, "reject_reason"] and df["reject_reason"].isna()[[0, 2]].all()
    assert list(df["tenant"]) == ["a", "b", "default"]
    assert df.loc[0, "ttft_slo_met"] and not df.loc[1, "slo_met"] and df["slo_met"].isna()[2]
    assert df.loc[1, "tpot_slo_s"] == 5.0 and df["tpot_slo_s"].isna()[[0, 2]].all()
    srv.wait_idle()
