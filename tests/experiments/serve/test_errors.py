"""Bad requests get 400 with an OpenAI-style body naming the field; a full queue gets 429 with Retry-After.
(A model not served is 404: tests/experiments/serve/test_usage.py.)"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from experiments.serve.config import ServeOptions  # noqa: E402
from tests.experiments.serve.server import running_server  # noqa: E402


@pytest.fixture(scope="module")
def srv(ckpt):
    with running_server(ckpt, max_model_len=128) as s:
        yield s


OK = {"prompt": [1, 2, 3], "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}

CASES = [
    # (endpoint, body, param, words the message must hold)
    ("completions", {"max_tokens": 2}, "prompt", ["required"]),
    ("completions", {**OK, "prompt": []}, "prompt", ["empty"]),
    ("completions", {**OK, "prompt": {"a": 1}}, "prompt", ["string", "token ids"]),
    ("completions", {**OK, "prompt": [1, 99999]}, "prompt", ["99999", "512"]),
    ("completions", {**OK, "prompt": list(range(1, 130))}, "prompt", ["129", "max_model_len"]),
    ("completions", {**OK, "max_tokens": 200}, "max_tokens", ["max_model_len", "125"]),
    ("completions", {**OK, "max_tokens": 0}, "max_tokens", [">= 1"]),
    ("completions", {**OK, "max_tokens": "many"}, "max_tokens", ["integer"]),
    ("completions", {**OK, "temperature": -0.5}, "temperature", [">= 0"]),
    ("completions", {**OK, "temperature": "hot"}, "temperature", ["number"]),
    ("completions", {**OK, "top_p": 0}, "top_p", ["(0, 1]"]),
    ("completions", {**OK, "top_p": 1.5}, "top_p", ["(0, 1]"]),
    ("completions", {**OK, "top_k": -2}, "top_k", ["-1"]),
    ("completions", {**OK, "n": 0}, "n", ["[1, 128]"]),
    ("completions", {**OK, "seed": -1}, "seed", ["2**63"]),
    ("completions", {**OK, "stop": [""]}, "stop", ["empty"]),
    ("completions", {**OK, "stop_token_ids": [4096]}, "stop_token_ids", ["4096"]),
    ("completions", {**OK, "logprobs": 2}, "logprobs", ["not supported"]),
    ("completions", {**OK, "logprobs": 0}, "logprobs", ["not supported"]),     # 0 is not False: a logprob each
    ("chat/completions", {**CHAT, "logprobs": True}, "logprobs", ["not supported"]),
    ("completions", {**OK, "presence_penalty": 0.5}, "presence_penalty", ["not supported"]),
    ("completions", {**OK, "ignore_eos": "yes"}, "ignore_eos", ["boolean"]),
    ("chat/completions", {"max_tokens": 2}, "messages", ["required"]),
    ("chat/completions", {**CHAT, "messages": []}, "messages", ["at least 1"]),
    ("chat/completions", {**CHAT, "messages": [{"content": "w1"}]}, "messages[0].role", ["role"]),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]", ["text part"]),
    ("chat/completions", {**CHAT, "max_completion_tokens": 3}, "max_completion_tokens", ["differ"]),
    ("chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools", ["not supported"]),
]


@pytest.mark.parametrize("endpoint, body, param, words", CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in
                                                                     enumerate(CASES)])
def test_bad_request_names_the_field(srv, endpoint, body, param, words):
    r = httpx.post(f"{srv.url}/{endpoint}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    for w in words:
        assert w in err["message"], err["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"[1, 2]", b""])
def test_a_body_that_is_not_a_json_object_is_refused(srv, raw):
    r = httpx.post(f"{srv.url}/completions", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_lone_surrogate_escape_is_a_400_not_a_500(srv, endpoint):
    # "\ud800" alone is no character: json.loads let it through to the tokenizer, which raised (500)
    body = {"completions": b'{"prompt": "w1 \\ud800", "max_tokens": 2}',
            "chat/completions": b'{"messages": [{"role": "user", "content": "w1 \\ud800"}], "max_tokens": 2}'}[endpoint]
    r = httpx.post(f"{srv.url}/{endpoint}", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "not valid JSON" in r.json()["error"]["message"]


def test_the_openai_package_raises_bad_request_with_the_message(srv):
    client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="w1", temperature=-1)
    with pytest.raises(openai.NotFoundError, match="not served"):      # 404, as OpenAI and vLLM answer
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "w1"}])


def test_unknown_route_and_method_get_an_openai_body(srv):
    r = httpx.get(f"{srv.url}/nothing", timeout=30)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{srv.url}/completions", timeout=30)
    assert r.status_code == 405 and "error" in r.json()


def test_no_op_values_of_unsupported_fields_are_accepted(srv):
    body = {**OK, "logprobs": None, "presence_penalty": 0, "frequency_penalty": 0.0, "echo": False, "best_of": 1,
            "user": "someone", "some_new_field": {"x": 1}}
    assert httpx.post(f"{srv.url}/completions", json=body, timeout=30).status_code == 200
    chat = {**CHAT, "logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"}, "tools": []}
    assert httpx.post(f"{srv.url}/chat/completions", json=chat, timeout=30).status_code == 200


def test_refused_requests_leave_nothing_queued(srv):
    for endpoint, body, _, _ in CASES:
        httpx.post(f"{srv.url}/{endpoint}", json=body, timeout=30)
    srv.wait_idle()
    assert srv.llm.scheduler.block_manager.num_used_blocks == 0 and not srv.llm._live
    r = httpx.post(f"{srv.url}/completions", json=OK, timeout=30)      # and the server still serves
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_over_the_waiting_limit_gets_429_with_retry_after(ckpt):
    with running_server(ckpt, serve_options=ServeOptions(max_waiting_requests=0, retry_after_s=7)) as s:
        r = httpx.post(f"{s.url}/completions", json=OK, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and "max_waiting_requests=0" in err["message"]
        client = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="tiny", prompt=[1], max_tokens=1)
        metrics = httpx.get(f"{s.base}/metrics", timeout=30).text
        assert 'servelab_request_rejected_total{model_name="tiny"} 2.0' in metrics


def test_a_request_larger_than_the_waiting_limit_gets_400_naming_n(ckpt):
    """n x prompts sequences that no wait would let in: a 400 that says so, not a 429 to retry for ever."""
    with running_server(ckpt, serve_options=ServeOptions(max_waiting_requests=3)) as s:
        r = httpx.post(f"{s.url}/completions", json={**OK, "n": 4}, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "n" and "max_waiting_requests=3" in err["message"]
        r = httpx.post(f"{s.url}/completions", json={**OK, "prompt": [[1], [2], [3], [4]]}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = httpx.post(f"{s.url}/completions", json={**OK, "n": 3}, timeout=30)      # fits: served
        assert r.status_code == 200 and len(r.json()["choices"]) == 3


def test_a_prompt_the_kv_cache_cannot_hold_names_the_prompt(ckpt):
    """A prompt that fills the whole KV cache (8 blocks of 16 tokens here): no max_tokens could help, so the error
    names the prompt, with and without max_tokens (it blamed max_tokens, advising "at most -72")."""
    with running_server(ckpt, max_model_len=256, num_kvcache_blocks=8) as s:
        for body in ({"prompt": list(range(1, 201)), "max_tokens": 1}, {"prompt": list(range(1, 129))}):
            err = httpx.post(f"{s.url}/completions", json=body, timeout=30).json()["error"]
            assert err["param"] == "prompt" and "at most 127 tokens" in err["message"], err
        r = httpx.post(f"{s.url}/completions", json={"prompt": list(range(1, 128)), "max_tokens": 1}, timeout=30)
        assert r.status_code == 200


def test_an_api_key_is_required_when_set(ckpt):
    with running_server(ckpt, serve_options=ServeOptions(api_key="s3cret")) as s:
        r = httpx.post(f"{s.url}/completions", json=OK, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{s.base}/health", timeout=30).status_code == 200      # health and metrics stay open
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url, api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=s.url, api_key="s3cret", max_retries=0)
        assert client.completions.create(model="tiny", prompt=[1], max_tokens=2).usage.completion_tokens == 2
        # the scheme's case is free (RFC 7235); the key is not
        for header, status in (("bearer s3cret", 200), ("BEARER s3cret", 200), ("Bearer S3CRET", 401),
                               ("Basic s3cret", 401), ("s3cret", 401)):
            r = httpx.get(f"{s.url}/models", headers={"authorization": header}, timeout=30)
            assert r.status_code == status, header


def test_one_model_is_retrieved_by_id_and_health_answers_head(srv):
    client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0)
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.models.retrieve("other/model")
    assert httpx.head(f"{srv.base}/health", timeout=30).status_code == 200


def test_priority_reaches_the_scheduler(ckpt, monkeypatch):
    with running_server(ckpt) as s:
        seen = []
        submit = s.llm.submit
        monkeypatch.setattr(s.llm, "submit", lambda seq: (seen.append(seq.priority), submit(seq)))
        r = httpx.post(f"{s.url}/completions", json={**OK, "priority": -3}, timeout=30)
        assert r.status_code == 200 and seen == [-3]
        r = httpx.post(f"{s.url}/completions", json={**OK, "priority": "high"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
