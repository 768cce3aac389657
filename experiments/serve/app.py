"""The OpenAI-compatible HTTP API over one LLM (FastAPI; uvicorn serves it, experiments/serve/cli.py).

    app = create_app(llm, served_model_name="qwen3", options=ServeOptions())
    app = create_app(ProcessEngine.launch(factory), "qwen3", options)   # the engine in its own process

`llm` is an LLM (stepped in a thread of this process, experiments/serve/engine_loop.py) or a launched
ProcessEngine (its own process, experiments/serve/engine_client.py): the routes are the same.

Routes: POST /v1/completions, POST /v1/chat/completions (server-sent events with "stream": true),
GET /v1/models (with the server's scheduler and KV cache sizes), GET /health (200 while the engine runs, 503
after it failed or while it stops), GET /metrics (Prometheus text, experiments/serve/metrics.py).

A request's life: the body is checked (400 naming the field, experiments/serve/protocol.py), its
prompts tokenized here (strings through the checkpoint's tokenizer, chat messages through its chat
template; token-id prompts as given), one Sequence per choice (prompts x n) stamped with its arrival
time, then queued on the engine unless more than
serve.max_waiting_requests are waiting (429 with Retry-After). Tokens come back per step and are
turned into text (experiments/serve/text_stream.py). A request the scheduling policy rejects while
it waits (a policy with may_reject, e.g. scheduler=edf_reject) is answered 503 with code
"policy_rejected" and the policy's reason (an error event when it streams). A client that disconnects, streaming or not,
has its sequences aborted: the engine drops them and frees their KV blocks.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from engine.core.sequence import SamplingParams
from experiments.serve.asgi import EventStream, LastEvent, ServeApp, error_response
from experiments.serve.config import ServeOptions
from experiments.serve.delivery import PromptUsage
from experiments.serve.engine_client import ProcessEngine
from experiments.serve.engine_loop import AsyncEngine
from experiments.serve.errors import APIError
from experiments.serve.metrics import ServerMetrics
from experiments.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_messages,
    check_common,
    completion_prompts,
    unsupported,
)
from experiments.serve.text_stream import TextStream

log = logging.getLogger("servelab.serve")

COMPLETION_DEFAULT_MAX_TOKENS = 16          # OpenAI's default for /v1/completions


def create_app(llm, served_model_name: str, options: ServeOptions | None = None) -> FastAPI:
    server = _Server(llm, served_model_name, options or ServeOptions())

    @asynccontextmanager
    async def lifespan(app):
        server.engine.start(asyncio.get_running_loop())
        log.info("serving %s (max_model_len %d, %d KV blocks of %d tokens, scheduler %s, engine %s, event loop %s)",
                 served_model_name, server.max_model_len, server.num_kv_blocks, server.block_size,
                 server.engine.info.policy_name,
                 f"process {llm.pid}, spin window {llm.spin.window_s * 1000:g} ms" if isinstance(llm, ProcessEngine)
                 else "thread",
                 type(asyncio.get_running_loop()).__module__.split(".")[0])     # uvloop where it is installed
        yield
        server.engine.stop()

    app = ServeApp(title="servelab", lifespan=lifespan)
    app.state.server = server

    async def error(request, exc):
        return error_response(exc)

    for kind in (APIError, StarletteHTTPException, ClientDisconnect, Exception):
        app.add_exception_handler(kind, error)

    @app.api_route("/health", methods=["GET", "HEAD"])     # HEAD: what some load balancers' probes send
    async def health():
        if not server.engine.alive:
            raise APIError(503, f"the engine is not running ({server.engine.error or 'shutting down'})")
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(request: Request):
        server.authorize(request)
        return {"object": "list", "data": [server.model_card()]}

    @app.get("/v1/models/{model_id:path}")      # the openai package's models.retrieve; ids may hold slashes
    async def model(model_id: str, request: Request):
        server.authorize(request)
        if model_id != server.name:
            raise APIError(404, f"model {model_id!r} is not served here; this server serves {server.name!r}",
                           param="model", code="model_not_found")
        return server.model_card()

    @app.get("/metrics")
    async def metrics():
        body, content_type = server.metrics.scrape()
        return Response(body, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(request: Request):
        server.authorize(request)
        return await server.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        server.authorize(request)
        return await server.chat(request)

    # the generation routes skip FastAPI's middleware and request wrapper (experiments/serve/asgi.py); other
    # methods on their paths still get FastAPI's answers (405)
    app.direct[("POST", "/v1/completions")] = completions
    app.direct[("POST", "/v1/chat/completions")] = chat_completions
    return app


class _Server:
    def __init__(self, llm, name: str, options: ServeOptions):
        self.name = name
        self.options = options
        if isinstance(llm, ProcessEngine):
            self.metrics = ServerMetrics(name, queue_stats=llm.queue_stats)
            llm.metrics = self.metrics
            self.engine = llm
        else:
            self.metrics = ServerMetrics(name, llm.scheduler)
            self.engine = AsyncEngine(llm, self.metrics)
        self.info = info = self.engine.info
        self.tokenizer = self.engine.tokenizer
        self.model_path = info.model_path
        self.max_model_len = info.max_model_len
        self.block_size = info.block_size
        self.num_kv_blocks = info.num_kv_blocks
        self.vocab_size = info.vocab_size
        self.created = int(time.time())
        self._warned: set[str] = set()

    def authorize(self, request: Request) -> None:
        key = self.options.api_key
        scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
        if key is not None and (scheme.lower() != "bearer" or given.strip() != key):    # scheme: any case (RFC 7235)
            raise APIError(401, "missing or wrong API key: send the header Authorization: Bearer <serve.api_key>",
                           code="invalid_api_key")

    def model_card(self) -> dict:
        """OpenAI's model object, vLLM's max_model_len, and `servelab`: the server's scheduler and KV cache as
        servelab's config keys name them (what `servelab backend=http` records of the server)."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "servelab",
                "root": self.model_path, "max_model_len": self.max_model_len,
                "servelab": self.info.scheduler_facts()}

    # -- request bodies -------------------------------------------------------------------------
    async def _parse(self, request: Request, schema):
        arrival = time.perf_counter()
        raw = await request.body()
        try:    # parsed and checked in one pass (pydantic's JSON parser: a third of json.loads + model_validate)
            req = schema.model_validate_json(raw)
        except ValidationError as e:
            raise _body_error(e) from None
        extra = sorted(set(req.model_extra or ()) - self._warned)
        if extra and len(self._warned) < 256:      # each name logged once (and the set kept small)
            self._warned.update(extra)
            log.warning("ignoring request field(s) this server does not know: %s", ", ".join(extra))
        if req.model is not None and req.model != self.name:     # 404 as OpenAI's and vLLM's
            raise APIError(404, f"model {req.model!r} is not served here; this server serves {self.name!r} "
                                f"(GET /v1/models)", param="model", code="model_not_found")
        unsupported(req)
        return req, arrival

    def _token_ids(self, prompt, field: str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise APIError(400, f"{field} is text but the checkpoint has no tokenizer; send token ids",
                               param=field)
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise APIError(400, f"{field} is empty; give at least one token", param=field)
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"{field} holds token id {bad}, outside [0, {self.vocab_size}) (vocab_size)",
                           param=field)
        return ids

    def _max_tokens(self, given: int | None, field: str, num_prompt: int, prompt_field: str, default: int | None):
        """The output cap of one choice: `given`, checked, else `default` (None: all the room left), cut to
        the room the context window and the KV cache leave."""
        room_len = self.max_model_len - num_prompt
        room_kv = self.num_kv_blocks * self.block_size - num_prompt
        if room_len < 1:
            raise APIError(400, f"{prompt_field} has {num_prompt} tokens, max_model_len is {self.max_model_len}; "
                                f"shorten it to at most {self.max_model_len - 1} tokens", param=prompt_field)
        if room_kv < 1:         # the prompt alone fills the cache: no max_tokens could help
            raise APIError(400, f"{prompt_field} has {num_prompt} tokens, more than the KV cache holds "
                                f"({self.num_kv_blocks} blocks of {self.block_size}) with room for one output "
                                f"token; shorten it to at most {self.num_kv_blocks * self.block_size - 1} tokens",
                           param=prompt_field)
        if given is None:
            room = min(room_len, room_kv)
            return room if default is None else min(default, room)
        if given < 1:
            raise APIError(400, f"{field} must be >= 1, got {given}", param=field)
        if given > room_len:
            raise APIError(400, f"{prompt_field} ({num_prompt} tokens) + {field} ({given}) exceeds max_model_len "
                                f"({self.max_model_len}); lower {field} to at most {room_len}", param=field)
        if given > room_kv:
            raise APIError(400, f"{prompt_field} ({num_prompt} tokens) + {field} ({given}) needs more KV blocks "
                                f"than the cache has ({self.num_kv_blocks} of {self.block_size} tokens); lower "
                                f"{field} to at most {room_kv}", param=field)
        return given

    def _sequences(self, rid: str, prompts: list[list[int]], common: dict, n: int, max_tokens_of, arrival: float,
                   priority: int = 0):
        """(index, Sequence) per choice (prompt-major) and its TextStream arguments."""
        entries, texts = [], []
        for p, ids in enumerate(prompts):
            max_tokens = max_tokens_of(ids)
            for j in range(n):
                seed = common["seed"]
                params = SamplingParams(temperature=common["temperature"], top_k=common["top_k"],
                                        top_p=common["top_p"], max_tokens=max_tokens,
                                        ignore_eos=common["ignore_eos"],
                                        seed=None if seed is None else seed + j)  # n > 1: seed, seed + 1, ...
                index = p * n + j
                try:
                    seq = self.engine.make_sequence(ids, params, f"{rid}-{index}", arrival)
                except ValueError as e:
                    raise APIError(400, str(e)) from None
                seq.priority = priority
                entries.append((index, seq))
                texts.append(ids)
        return entries, texts

    def _admit_or_429(self, count: int, n: int) -> None:
        """count: the request's sequences (n per prompt), each waiting until the engine admits it."""
        limit = self.options.max_waiting_requests
        if limit is None:
            return
        if 0 < limit < count:       # no wait would help: say so, not "retry"
            raise APIError(400, f"the request has {count} sequences (n={n} for each of {count // n} prompts), more "
                                f"than serve.max_waiting_requests={limit} lets wait at once; lower n or send fewer "
                                f"prompts per request", param="n" if n > 1 else "prompt")
        waiting = self.engine.num_waiting()
        if waiting + count > limit:
            self.metrics.rejected.inc()
            retry = self.options.retry_after_s
            raise APIError(429, f"the server is busy: {waiting} requests are waiting (serve.max_waiting_requests="
                                f"{limit}); retry after {retry} s", code="too_many_requests",
                           headers={"Retry-After": str(retry)})

    # -- the two endpoints ------------------------------------------------------------------------
    async def completions(self, request: Request):
        req, arrival = await self._parse(request, CompletionRequest)
        common = check_common(req, self.vocab_size)
        prompts = [self._token_ids(p, "prompt") for p in completion_prompts(req.prompt)]

        def cap(ids):
            return self._max_tokens(req.max_tokens, "max_tokens", len(ids), "prompt", COMPLETION_DEFAULT_MAX_TOKENS)

        rid = f"cmpl-{uuid.uuid4().hex}"
        entries, prompt_ids = self._sequences(rid, prompts, common, req.n, cap, arrival, req.priority)
        return await self._respond(request, req, rid, "text_completion", entries, prompt_ids, prompts, common)

    async def chat(self, request: Request):
        req, arrival = await self._parse(request, ChatCompletionRequest)
        common = check_common(req, self.vocab_size)
        if req.max_completion_tokens is not None and req.max_tokens is not None \
                and req.max_completion_tokens != req.max_tokens:
            raise APIError(400, f"max_tokens ({req.max_tokens}) and max_completion_tokens "
                                f"({req.max_completion_tokens}) differ; give one of them",
                           param="max_completion_tokens")
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        given = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        ids = self._chat_token_ids(req)

        def cap(ids):
            return self._max_tokens(given, field, len(ids), "messages", None)

        rid = f"chatcmpl-{uuid.uuid4().hex}"
        entries, prompt_ids = self._sequences(rid, [ids], common, req.n, cap, arrival, req.priority)
        return await self._respond(request, req, rid, "chat.completion", entries, prompt_ids, [ids], common)

    def _chat_token_ids(self, req: ChatCompletionRequest) -> list[int]:
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError(400, "this checkpoint has no chat template (tokenizer_config.json chat_template); use "
                                "/v1/completions", param="messages")
        messages = chat_messages(req.messages)
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=req.add_generation_prompt,
                                           **(req.chat_template_kwargs or {}))
        except Exception as e:      # the template's own checks (roles alternating, ...): the user's input
            raise APIError(400, f"the chat template refused the messages: {type(e).__name__}: {e}",
                           param="messages") from None
        return self._token_ids(tok.encode(text, add_special_tokens=False), "messages")

    async def _respond(self, request, req, rid, kind, entries, prompt_ids, prompts, common):
        self._admit_or_429(len(entries), req.n)
        queue: asyncio.Queue = asyncio.Queue()
        # queued first: the engine can admit the request while its text streams are set up here
        choices = self.engine.submit(entries, queue)
        prompt_usages = _share_prompts(choices, req.n)
        try:
            streams = {i: TextStream(self.tokenizer, ids, common["stop"], common["stop_token_ids"],
                                     hold_back=req.stream) for (i, _), ids in zip(entries, prompt_ids)}
        except BaseException:
            self.engine.abort(choices)
            raise
        open_ = {c.index: c for c in choices}       # choices not finished yet

        def abort_open():
            if open_:
                self.engine.abort(list(open_.values()))
                open_.clear()

        events = self._events(open_, streams, queue)
        num_prompt_tokens = sum(len(p) for p in prompts)

        def usage(completion_tokens: int) -> dict:      # once every choice ended: all were admitted
            return _usage(num_prompt_tokens, completion_tokens, sum(u.num_cached_tokens for u in prompt_usages))

        head = {"id": rid, "created": int(time.time()), "model": self.name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            chunks = _chat_chunks if kind == "chat.completion" else _completion_chunks
            sse = chunks(events, head, streams, usage, include_usage, req.return_token_ids,
                         always=self.tokenizer is None)
            return EventStream(sse, abort_open, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            results = await _unless_disconnected(request, _collect(events))
        finally:
            abort_open()
        if results is None:
            return Response(status_code=499)        # nobody is listening; the sequences were aborted
        body = {**head, "object": kind, "choices": []}
        completion_tokens = 0
        for index in sorted(results):
            text, reason = results[index]
            ts = streams[index]
            completion_tokens += len(ts.token_ids)
            if kind == "chat.completion":
                choice = {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
                          "finish_reason": reason}
            else:
                choice = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
            if req.return_token_ids:
                choice["token_ids"] = list(ts.token_ids)
            body["choices"].append(choice)
        if req.return_token_ids:
            body["prompt_token_ids"] = prompts[0] if len(prompts) == 1 else prompts
        body["usage"] = usage(completion_tokens)
        return JSONResponse(body)

    async def _events(self, open_: dict, streams, queue):
        """(index, text, new token ids, finish_reason or None) as the engine produces them, for the choices
        of open_ (index -> Choice; each leaves it with its last event, which has its finish_reason "stop" |
        "length" | "abort"). Aborts the choices left when the caller stops early (client gone, cancelled)."""
        try:
            while open_:
                index, ids, reason, error = await queue.get()
                choice = open_.get(index)
                if choice is None:
                    continue            # tokens a stopped choice's sequence made before its abort arrived
                if reason == "error":
                    raise APIError(500, f"the engine failed: {error}")
                if reason == "rejected":    # the other choices of the request are aborted below
                    raise APIError(503, f"the scheduling policy rejected the request while it waited ({error})",
                                   code="policy_rejected")
                ts = streams[index]
                kept = len(ts.token_ids)
                text = ts.push(ids, eos=reason == "eos")
                if ts.stopped and reason is None:   # a stop string or stop token: the engine must drop it
                    self.engine.abort([choice], count_as_aborted=False)
                    self.metrics.finished("stop")
                    self.metrics.e2e.observe([time.perf_counter() - choice.seq.arrival_time_s])
                fin = None
                if ts.stopped or reason is not None:
                    text += ts.flush()
                    fin = "stop" if ts.stopped or reason == "eos" else reason
                    del open_[index]
                yield index, text, ts.token_ids[kept:], fin
        finally:
            if open_:
                self.engine.abort(list(open_.values()))
                open_.clear()


async def _collect(events) -> dict:
    texts: dict[int, list[str]] = {}
    reasons: dict[int, str] = {}
    async for index, text, _, fin in events:
        texts.setdefault(index, []).append(text)
        if fin is not None:
            reasons[index] = fin
    return {i: ("".join(texts.get(i, [])), reasons[i]) for i in reasons}


async def _unless_disconnected(request: Request, work):
    """Awaits `work`; None (work cancelled, so its sequences are aborted) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return None


def _share_prompts(choices, n: int) -> list[PromptUsage]:
    """One PromptUsage per prompt, shared by its n choices (index p * n + j): right after submit, before any step
    record can reach the choices (no await between)."""
    usages: dict = {}
    for c in choices:
        c.prompt = usages.setdefault(c.index // n, c.prompt)
    return list(usages.values())


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: prompt tokens the prefix cache served (each
    prompt counted once, experiments/serve/delivery.py)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(events, make_chunk, head, streams, usage, include_usage, token_ids, always, first=None):
    """Server-sent events: one chunk per choice and step (empty text skipped unless `always`), then the
    usage chunk when asked, then [DONE]; an engine failure becomes an error event. make_chunk(index,
    text, finish_reason, token_ids or None) -> the event's text; usage(completion_tokens) -> the usage object.
    The last choice's last chunk, the usage chunk and [DONE] are ready at the same moment: they go out as one
    LastEvent, written with the response's end (one write and one read of the client, not four)."""
    left = len(streams)         # choices whose last chunk has not come
    tail = ""
    try:
        if first is not None:
            for chunk in first:
                yield _sse(chunk)
        async for index, text, ids, fin in events:
            if not (text or fin or always or token_ids):
                continue
            chunk = make_chunk(index, text, fin, ids if token_ids else None)
            if fin is not None:
                left -= 1
                if not left:    # the events end here (no choice open): nothing is waited for after it
                    tail = chunk
                    continue
            yield chunk
        if include_usage:
            done = sum(len(ts.token_ids) for ts in streams.values())
            tail += _sse({**head, "choices": [], "usage": usage(done)})
    except APIError as e:
        tail += _sse(e.body())
    yield LastEvent(tail + "data: [DONE]\n\n")


# A chunk is written by hand around json.dumps of the text: a streamed token costs one small dumps,
# not the dumps of a whole dict (the fields and their order are those json.dumps gives the dict).
def _chunk_prefix(head: dict) -> str:
    return _sse({**head, "choices": [{"index": 0}]}).split('"choices":[{"index":', 1)[0] + '"choices":[{"index":'


def _tail(fin, ids) -> str:
    fin_json = "null" if fin is None else f'"{fin}"'
    extra = "" if ids is None else f',"token_ids":{json.dumps(ids, separators=(",", ":"))}'
    return f',"logprobs":null,"finish_reason":{fin_json}{extra}}}]}}\n\n'


def _completion_chunks(events, head, streams, usage, include_usage, token_ids, always):
    head = {**head, "object": "text_completion"}
    prefix = _chunk_prefix(head)

    def chunk(index, text, fin, ids):
        return f'{prefix}{index},"text":{json.dumps(text)}{_tail(fin, ids)}'

    return _stream(events, chunk, head, streams, usage, include_usage, token_ids, always)


def _chat_chunks(events, head, streams, usage, include_usage, token_ids, always):
    head = {**head, "object": "chat.completion.chunk"}
    first = [{**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None}]} for i in sorted(streams)]
    prefix = _chunk_prefix(head)

    def chunk(index, text, fin, ids):
        delta = f'{{"content":{json.dumps(text)}}}' if text or fin is None else "{}"
        return f'{prefix}{index},"delta":{delta}{_tail(fin, ids)}'

    return _stream(events, chunk, head, streams, usage, include_usage, token_ids, always, first)


def _body_error(e: ValidationError) -> APIError:
    """A body that is not JSON, or not an object, as the 400 json.loads' errors gave; else _validation_error's."""
    err = e.errors()[0]
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON ({err.get('msg')})")
    if err.get("type") == "model_type" and not err.get("loc"):
        return APIError(400, f"the request body must be a JSON object, got {type(err.get('input')).__name__}")
    return _validation_error(e)


def _validation_error(e: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field (`messages[0].content`)."""
    err = e.errors()[0]
    loc = [p for p in err.get("loc", ()) if isinstance(p, int) or p.isidentifier()]
    # a union's branch names (str, list[int], ...) are not fields: keep the path up to the first one
    parts = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("str", "int", "float", "bool", "list", "dict"):
            break
        else:
            parts.append(("." if parts else "") + p)
    param = "".join(parts) or None
    if err.get("type") == "missing":
        return APIError(400, f"{param} is required", param=param)
    if param == "prompt":
        return APIError(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                             f"token-id lists, got {str(err.get('input'))[:80]!r}", param=param)
    return APIError(400, f"{param}: {err.get('msg')}, got {str(err.get('input'))[:80]!r}", param=param)
