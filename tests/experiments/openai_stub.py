"""A small OpenAI-compatible server for client tests: streams known tokens at known times (Starlette + uvicorn).

    with StubServer(ttft_s=0.05, itl_s=0.01) as stub:      # listens on 127.0.0.1, a free port, in a thread
        stub.url                                            # http://127.0.0.1:PORT
        stub.sent[request_index]                            # perf_counter times the server sent each token chunk

/v1/completions answers every request with max_tokens chunks (text "t<i>", one per token), the first ttft_s after
the request arrived and then one every itl_s, the last with finish_reason "length", then a usage chunk when
stream_options.include_usage is set, then [DONE]. Non-streaming requests get one JSON body. Faults by max_tokens, so a
workload picks them per request: FAIL_TOKENS -> HTTP 500 with an OpenAI error body, DROP_TOKENS -> the connection
closes after two chunks. token_ids=False refuses list prompts with HTTP 400; /v1/models lists `model` (with vLLM's
`max_model_len` when one is given); /health answers 200.
The clock is time.perf_counter (the same clock the client uses, in this process).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

FAIL_TOKENS = 7        # a request with this max_tokens gets HTTP 500
DROP_TOKENS = 9        # ... loses its connection after two chunks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error(status: int, message: str, param: str | None = None):
    from starlette.responses import JSONResponse
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": status}}, status_code=status)


class StubServer:
    def __init__(self, ttft_s: float = 0.05, itl_s: float = 0.01, model: str = "stub-model", token_ids: bool = True,
                 cached_tokens: int = 0, token_ids_field: bool = True, max_model_len: int | None = None):
        self.ttft_s, self.itl_s, self.model, self.token_ids = ttft_s, itl_s, model, token_ids
        self.cached_tokens = cached_tokens
        self.max_model_len = max_model_len      # told on /v1/models only (requests are not checked against it)
        self.token_ids_field = token_ids_field      # answer return_token_ids with each chunk's token_ids
        self.received: list[dict] = []          # request bodies, in arrival order
        self.arrived: list[float] = []          # perf_counter when each body was read
        self.sent: dict[int, list[float]] = {}  # index into received -> perf_counter of each token chunk
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = self._thread = None

    # -- the app --------------------------------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def health(request):
            return JSONResponse({})

        async def models(request):
            card = {"id": self.model, "object": "model"}
            if self.max_model_len is not None:
                card["max_model_len"] = self.max_model_len
            return JSONResponse({"object": "list", "data": [card]})

        async def completions(request):
            body = await request.json()
            t_arr = time.perf_counter()
            index = len(self.received)
            self.received.append(body)
            self.arrived.append(t_arr)
            if body.get("model") != self.model:
                return _error(404, f"The model `{body.get('model')}` does not exist.", "model")
            prompt = body.get("prompt")
            if isinstance(prompt, list) and not self.token_ids:
                return _error(400, "prompt must be a string", "prompt")
            n = int(body.get("max_tokens", 16))
            if n == FAIL_TOKENS:
                return _error(500, "stub failure on purpose")
            n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n,
                     "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
            if not body.get("stream"):
                return JSONResponse({"id": f"cmpl-{index}", "object": "text_completion", "model": self.model,
                                     "choices": [{"index": 0, "text": " ".join(f"t{i}" for i in range(n)),
                                                  "finish_reason": "length"}], "usage": usage})
            times = self.sent.setdefault(index, [])

            async def events():
                for i in range(n):
                    due = t_arr + self.ttft_s + i * self.itl_s
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    if n == DROP_TOKENS and i == 2:
                        raise ConnectionResetError("stub drops the connection on purpose")
                    choice = {"index": 0, "text": f"t{i}", "finish_reason": "length" if i == n - 1 else None}
                    if body.get("return_token_ids") and self.token_ids_field:
                        choice["token_ids"] = [i]
                    times.append(time.perf_counter())
                    yield "data: " + json.dumps({"id": f"cmpl-{index}", "object": "text_completion",
                                                 "model": self.model, "choices": [choice], "usage": None}) + "\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield "data: " + json.dumps({"id": f"cmpl-{index}", "choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                                 Route("/v1/completions", completions, methods=["POST"])])

    # -- running it -------------------------------------------------------------------------------------
    def __enter__(self):
        import uvicorn
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="critical", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the stub server did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self._server.should_exit = True
        self._thread.join(timeout=10)
