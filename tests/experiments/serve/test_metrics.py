"""GET /metrics: Prometheus text whose counts match the requests served."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.experiments.serve.server import running_server  # noqa: E402


def scrape(srv) -> dict:
    """{(sample name, frozenset of labels other than model_name): value}."""
    r = httpx.get(f"{srv.base}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            assert s.labels.get("model_name") == "tiny"
            labels = frozenset((k, v) for k, v in s.labels.items() if k != "model_name")
            out[(s.name, labels)] = s.value
    return out


def value(m, name, **labels):
    return m[(name, frozenset(labels.items()))]


def test_counts_match_the_requests(ckpt):
    with running_server(ckpt) as srv:
        body = {"prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True}
        for _ in range(3):
            assert httpx.post(f"{srv.url}/completions", json=body, timeout=30).status_code == 200
        chat = {"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 4, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{srv.url}/chat/completions", json=chat, timeout=30) as r:
            assert r.read().endswith(b"data: [DONE]\n\n")
        shared = {"prompt": list(range(1, 41)), "max_tokens": 1}      # 40 tokens: two full blocks of 16
        for _ in range(2):
            assert httpx.post(f"{srv.url}/completions", json=shared, timeout=30).status_code == 200
        srv.wait_idle()
        m = scrape(srv)
    assert value(m, "servelab_time_to_first_token_seconds_count") == 6
    assert value(m, "servelab_inter_token_latency_seconds_count") == 4 * 3
    assert value(m, "servelab_e2e_request_latency_seconds_count") == 6
    assert value(m, "servelab_generation_tokens_total") == 4 * 4 + 2
    prompt_tokens = 3 * 3 + 3 + 2 * 40          # the chat template makes "w1 w2 w9"
    assert value(m, "servelab_prompt_tokens_total") == prompt_tokens
    assert value(m, "servelab_prefix_cache_queries_total") == prompt_tokens
    # the repeat finds the first's two full blocks (and the three 3-token prompts hold no full block)
    assert value(m, "servelab_prefix_cache_hits_total") == 32
    assert value(m, "servelab_prefix_cache_hit_rate") == pytest.approx(32 / prompt_tokens)
    assert value(m, "servelab_request_success_total", finished_reason="length") == 6
    for gauge in ("waiting", "running", "swapped"):
        assert value(m, f"servelab_num_requests_{gauge}") == 0
    assert value(m, "servelab_kv_cache_usage_perc") == 0
    assert value(m, "servelab_num_preemptions_total") == 0
    assert value(m, "servelab_request_aborted_total") == 0
    # TTFT bucket counts are cumulative and end at the count
    assert value(m, "servelab_time_to_first_token_seconds_bucket", le="+Inf") == 6


def test_preemptions_are_counted_under_memory_pressure(ckpt):
    # 8 blocks of 16 tokens; four requests of 16 + 60 tokens need 5 blocks each at the end
    with running_server(ckpt, num_kvcache_blocks=8) as srv:
        async def go():
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"prompt": list(range(1, 17)), "max_tokens": 60, "ignore_eos": True}
                return await asyncio.gather(*[c.post(f"{srv.url}/completions", json={**body, "seed": i})
                                              for i in range(4)])
        rs = asyncio.run(go())
        assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60 for r in rs)
        srv.wait_idle()
        m = scrape(srv)
    assert value(m, "servelab_num_preemptions_total") > 0
    assert value(m, "servelab_request_success_total", finished_reason="length") == 4
