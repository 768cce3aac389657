"""/health follows the engine; a failed engine step fails its requests (500, or an error event) and the server
refuses new ones with 503; a checkpoint without tokenizer serves token-id prompts."""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tests.experiments.serve.server import running_server  # noqa: E402


def test_a_failed_step_fails_the_requests_and_health(ckpt, monkeypatch):
    with running_server(ckpt) as srv:
        assert httpx.get(f"{srv.base}/health", timeout=30).status_code == 200

        def broken(batch):
            raise RuntimeError("device lost")
        monkeypatch.setattr(srv.llm.runner, "execute", broken)
        r = httpx.post(f"{srv.url}/completions", json={"prompt": [1, 2], "max_tokens": 3}, timeout=30)
        assert r.status_code == 500 and "device lost" in r.json()["error"]["message"]
        deadline = time.monotonic() + 10
        while srv.engine.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        h = httpx.get(f"{srv.base}/health", timeout=30)
        assert h.status_code == 503 and "device lost" in h.json()["error"]["message"]
        r = httpx.post(f"{srv.url}/completions", json={"prompt": [1, 2], "max_tokens": 3}, timeout=30)
        assert r.status_code == 503


def test_a_failed_step_ends_a_stream_with_an_error_event(ckpt, monkeypatch):
    with running_server(ckpt) as srv:
        execute, calls = srv.llm.runner.execute, []

        def fails_later(batch):
            calls.append(1)
            if len(calls) > 3:
                raise RuntimeError("device lost")
            return execute(batch)
        monkeypatch.setattr(srv.llm.runner, "execute", fails_later)
        body = {"prompt": [1, 2], "max_tokens": 20, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.url}/completions", json=body, timeout=30) as r:
            data = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert '"error"' in data[-2] and "device lost" in data[-2] and data[-1] == "data: [DONE]"
        assert 2 <= len(data) <= 3 + 2     # up to one chunk per step that ran, the error, [DONE]


def test_without_tokenizer_token_ids_are_served_and_text_refused(tmp_path):
    from tests.engine.tiny_model import make_tiny_qwen3
    make_tiny_qwen3(tmp_path)
    with running_server(str(tmp_path)) as srv:
        body = {"prompt": [1, 2], "max_tokens": 3, "ignore_eos": True, "return_token_ids": True}
        r = httpx.post(f"{srv.url}/completions", json=body, timeout=30)
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        assert choice["text"] == "" and len(choice["token_ids"]) == 3
        with httpx.stream("POST", f"{srv.url}/completions", json={**body, "stream": True}, timeout=30) as s:
            data = [line for line in s.iter_lines() if line.startswith("data: ")]
        # chunks even without text (one per step, or fewer when the reader falls behind), then [DONE]
        chunks = [json.loads(line[6:]) for line in data[:-1]]
        assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 3 and data[-1] == "data: [DONE]"
        r = httpx.post(f"{srv.url}/completions", json={"prompt": "w1", "max_tokens": 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = httpx.post(f"{srv.url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                       timeout=30)
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
