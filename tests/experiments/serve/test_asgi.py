"""experiments/serve/asgi.py: the direct dispatch of the generation routes and the server-sent-event writer."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from fastapi.responses import JSONResponse  # noqa: E402

from experiments.serve.asgi import EventStream, ServeApp  # noqa: E402
from experiments.serve.errors import APIError  # noqa: E402


async def _call(app, method: str, path: str, body: bytes = b"{}"):
    """(status, headers, body) of one request through the ASGI app."""
    sent = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "root_path": "", "scheme": "http",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def test_direct_routes_skip_the_middleware_stack_and_keep_the_errors():
    app = ServeApp()
    stack_calls = []

    @app.get("/v1/models")
    async def models():
        return {"data": []}

    async def ok(request):
        return JSONResponse({"got": json.loads(await request.body())})

    async def refused(request):
        raise APIError(400, "bad prompt", param="prompt")

    async def broken(request):
        raise RuntimeError("boom")

    @app.post("/v1/completions")
    async def completions_via_fastapi():
        raise AssertionError("the direct route should have served this")

    app.direct[("POST", "/v1/completions")] = ok
    app.direct[("POST", "/refused")] = refused
    app.direct[("POST", "/broken")] = broken

    async def main():
        # a request routed by FastAPI goes through its middleware stack (built on the first call); the direct
        # routes never do
        assert (await _call(app, "GET", "/v1/models"))[0] == 200
        inner = app.middleware_stack

        async def counting(scope, receive, send):
            stack_calls.append(scope["path"])
            await inner(scope, receive, send)
        app.middleware_stack = counting
        got = await _call(app, "POST", "/v1/completions", b'{"prompt": [1, 2]}')
        assert got[0] == 200 and json.loads(got[2]) == {"got": {"prompt": [1, 2]}}
        status, _, body = await _call(app, "POST", "/refused")
        assert status == 400 and json.loads(body)["error"]["param"] == "prompt"
        status, _, body = await _call(app, "POST", "/broken")
        assert status == 500 and "RuntimeError: boom" in json.loads(body)["error"]["message"]
        assert stack_calls == []
        assert (await _call(app, "GET", "/v1/completions"))[0] == 405     # other methods: FastAPI's answer
        assert stack_calls == ["/v1/completions"]

    asyncio.run(main())


def test_event_stream_writes_chunks_and_ends_cleanly_when_the_client_leaves():
    closed = []
    iterator_closed = []

    async def chunks(n):
        try:
            for k in range(n):
                yield f"data: {k}\n\n"
                await asyncio.sleep(0.01)
        finally:
            iterator_closed.append(n)

    async def run(n, leave_after_s):
        sent = []
        left = asyncio.Event()

        async def receive():
            if leave_after_s is None:
                await left.wait()       # stays until the response is complete
            else:
                await asyncio.sleep(leave_after_s)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if not message.get("more_body", True):
                left.set()

        await EventStream(chunks(n), lambda: closed.append(n), headers={"Cache-Control": "no-cache"})(
            {"type": "http"}, receive, send)
        return sent

    sent = asyncio.run(run(3, None))
    assert sent[0]["status"] == 200 and (b"cache-control", b"no-cache") in sent[0]["headers"]
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert [m["body"] for m in sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert closed == [3] and iterator_closed == [3]
    sent = asyncio.run(run(1000, 0.035))        # the client leaves after a few chunks: no error, all closed
    assert 1 < len(sent) < 50 and sent[-1].get("more_body") is True
    assert closed == [3, 1000] and iterator_closed == [3, 1000]


def test_event_stream_writes_its_last_event_with_the_end_of_the_response():
    from experiments.serve.asgi import LastEvent
    iterator_closed = []

    async def chunks():
        try:
            yield "data: 0\n\n"
            yield LastEvent("data: 1\n\ndata: [DONE]\n\n")
        finally:
            iterator_closed.append(True)

    async def run():
        sent = []
        left = asyncio.Event()

        async def receive():
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if not message.get("more_body", True):
                left.set()

        await EventStream(chunks(), lambda: None)({"type": "http"}, receive, send)
        return sent

    sent = asyncio.run(run())
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"data: 0\n\n", True),
                                                               (b"data: 1\n\ndata: [DONE]\n\n", False)]
    assert iterator_closed == [True]


def test_a_request_is_queued_on_the_engine_before_its_text_streams_are_built(monkeypatch):
    from types import SimpleNamespace

    from experiments.serve import app as app_module
    from experiments.serve.delivery import Choice
    from experiments.serve.engine_client import ProcessEngine

    order = []

    class Streams(app_module.TextStream):
        def __init__(self, *args, **kwargs):
            order.append("text stream")
            super().__init__(*args, **kwargs)

    engine = ProcessEngine()
    engine.info = SimpleNamespace(model_path="m", max_model_len=64, block_size=16, num_kv_blocks=8, vocab_size=100,
                                  eos_token_id=None, policy_name="vllm")

    def submit(entries, queue):
        order.append("submit")
        for index, _ in entries:        # the engine's answer: two tokens, then the end
            queue.put_nowait((index, [5, 6], "length", None))
        return [Choice(i, seq, queue) for i, seq in entries]

    engine.submit, engine.abort = submit, lambda choices, count_as_aborted=True: None
    monkeypatch.setattr(app_module, "TextStream", Streams)
    app = app_module.create_app(engine, "m")
    body = json.dumps({"prompt": [1, 2], "max_tokens": 2, "stream": True, "return_token_ids": True}).encode()
    status, _, out = asyncio.run(_call(app, "POST", "/v1/completions", body))
    assert status == 200 and b'"token_ids":[5,6]' in out and out.endswith(b"data: [DONE]\n\n")
    assert order == ["submit", "text stream"]
