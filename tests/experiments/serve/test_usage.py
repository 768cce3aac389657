"""usage.prompt_tokens_details.cached_tokens (streamed or not), prompt tokens counted once per prompt in usage and
/metrics, 404 for a model not served, and the server's scheduler facts on GET /v1/models."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from tests.experiments.serve.server import running_server  # noqa: E402
from tests.experiments.serve.test_metrics import scrape, value  # noqa: E402

SHARED = list(range(1, 41))     # 40 tokens: two full blocks of 16 the prefix cache keeps


@pytest.fixture(scope="module", params=[False, True], ids=["thread", "process"])
def srv(request, ckpt):
    with running_server(ckpt, engine_process=request.param) as s:
        yield s


def streamed_usage(srv, body) -> dict:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{srv.url}/completions", json=body, timeout=30) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == []
    return last["usage"]


def test_cached_tokens_are_reported_streamed_and_not(srv):
    body = {"prompt": SHARED + [100], "max_tokens": 2, "ignore_eos": True}
    first = httpx.post(f"{srv.url}/completions", json=body, timeout=30).json()["usage"]
    assert first["prompt_tokens"] == 41 and first["prompt_tokens_details"] == {"cached_tokens": 0}
    again = httpx.post(f"{srv.url}/completions", json={**body, "prompt": SHARED + [101]}, timeout=30).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == 32
    streamed = streamed_usage(srv, {**body, "prompt": SHARED + [102]})
    assert streamed["prompt_tokens"] == 41 and streamed["prompt_tokens_details"]["cached_tokens"] == 32
    chat = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=30)
    resp = chat.completions.create(model="tiny", prompt=SHARED + [103], max_tokens=1)
    assert resp.usage.prompt_tokens_details.cached_tokens == 32      # the openai package reads it


def test_prompt_tokens_count_each_prompt_once_with_n(srv):
    srv.wait_idle()
    before = value(scrape(srv), "servelab_prompt_tokens_total")
    body = {"prompt": [[7, 8], [9, 10]], "n": 2, "max_tokens": 2, "ignore_eos": True}
    usage = httpx.post(f"{srv.url}/completions", json=body, timeout=30).json()["usage"]
    assert usage["prompt_tokens"] == 4
    srv.wait_idle()
    assert value(scrape(srv), "servelab_prompt_tokens_total") - before == 4
    # n choices of one cached prompt: the prompt's hits once (its first choice's), not n times
    httpx.post(f"{srv.url}/completions", json={"prompt": SHARED + [104], "max_tokens": 1}, timeout=30)
    usage = streamed_usage(srv, {"prompt": SHARED + [105], "n": 3, "max_tokens": 2, "ignore_eos": True})
    assert usage["prompt_tokens"] == 41 and usage["prompt_tokens_details"]["cached_tokens"] == 32


def test_a_model_not_served_is_404_as_openai_and_vllm_say(srv):
    r = httpx.post(f"{srv.url}/completions", json={"model": "nope", "prompt": [1], "max_tokens": 1}, timeout=30)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("NotFoundError", "model_not_found", "model")
    assert "nope" in err["message"] and "tiny" in err["message"]
    client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "w1"}], max_tokens=1)


def test_models_card_tells_the_servers_scheduler(srv):
    card = httpx.get(f"{srv.url}/models", timeout=30).json()["data"][0]
    facts = card["servelab"]
    assert facts["scheduler"] == "vllm" and facts["eviction"] == "lru" and facts["vocab_size"] == 512
    assert facts["num_kvcache_blocks"] == 128 and facts["block_size"] == 16 and facts["max_num_seqs"] == 16
    assert facts["max_num_batched_tokens"] >= 128 and facts["num_cpu_blocks"] == 0
    assert facts["max_model_len"] == card["max_model_len"] == 128
