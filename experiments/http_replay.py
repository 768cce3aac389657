"""Real-time replay of requests against an OpenAI-compatible server, timed on the client (torch-free, Hydra-free).

    target = HttpTarget("http://127.0.0.1:8000")             # model=None: the server's first /v1/models entry
    reqs = [HttpRequest(request_id, arrival_time_s, prompt, max_tokens), ...]   # prompt: token ids or text
    outcome = replay(reqs, target)      # ReplayOutcome: one HttpRecord per request, in the order given

Before the clock starts, `check_server` asks /v1/models (the server is reachable, the model name is served;
servelab-serve's entry also tells its scheduler and KV cache: ReplayOutcome.server_facts) and sends
one 1-token completion of the prompt format the replay uses (a server that refuses token-id prompts says so now, in one
line, not 300 times). Then each request is sent at its arrival_time_s on the replay clock (time.perf_counter; 0 = the
moment the replay starts; never early, rarely more than tens of microseconds late: sleep_until), concurrently with every
request still in flight (one connection each, no limit: the trace alone bounds the concurrency; a connection whose
response ended serves a later request), its body encoded before the clock starts and sent by aiohttp's client
(httpx's own cost per request and chunk, most of a millisecond on a small CPU, is latency the in-process replay
does not pay: benchmarks/serve_hops.py), as

    POST {url}/v1/completions {model, prompt, max_tokens, ignore_eos: true, temperature, stream: true,
                               stream_options: {include_usage: true}}

(plus `return_token_ids: true`, servelab-serve's and vLLM's extension, unless return_token_ids=False) and timed as its
server-sent events arrive: a chunk's tokens arrive with it, counted by its `token_ids` where the server sends them (a
server may hold a token back until its text is whole, then send two in one chunk), else one per chunk (a closing chunk
with empty text and a finish_reason is none); the first token's chunk is the first token, the one with the
finish_reason the finish. Token counts come from the final usage chunk
(prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens) where the server sends one, else from the
prompt's length and the number of token chunks. A request that fails (an HTTP error status, a dropped connection, a
timeout, an error event) keeps its record with `error` set: it is counted, never dropped. One the server's scheduling
policy rejected (servelab-serve's error code "policy_rejected", as a 503 or an error event) is marked `rejected`.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

from experiments.ctrl_c import interruptible

PROMPT_FORMATS = ("token_ids", "text")
JSON_HEADERS = {"Content-Type": "application/json"}


class HttpBackendError(ValueError):
    """The server cannot run the replay as configured (unreachable, unknown model, refused prompt format)."""


@dataclass(frozen=True)
class HttpTarget:
    url: str                                # base URL: http://host:port or http://host:port/v1
    model: str | None = None                # served model name; None: the server's first /v1/models entry
    prompt_format: str = "token_ids"        # how prompts are sent: "token_ids" (a list of ints) or "text"
    temperature: float = 0.6
    api_key: str | None = None              # sent as `Authorization: Bearer ...`
    request_timeout_s: float = 600.0        # one request, first byte to last
    return_token_ids: bool = True           # ask for each chunk's token ids (servelab-serve's and vLLM's extension)
    connect_timeout_s: float = 10.0

    def __post_init__(self):
        if not str(self.url).startswith(("http://", "https://")):
            raise HttpBackendError(f"backend.url must start with http:// or https://, got {self.url!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise HttpBackendError(f"backend.prompt must be one of {PROMPT_FORMATS}, got {self.prompt_format!r}")
        if not self.request_timeout_s > 0:
            raise HttpBackendError(f"backend.request_timeout_s must be > 0 seconds, got {self.request_timeout_s}")

    @property
    def api_base(self) -> str:
        """The URL that /completions and /models hang off: `.../v1`."""
        base = str(self.url).rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"


@dataclass
class HttpRequest:
    request_id: int
    arrival_time_s: float                   # replay clock, seconds
    prompt: list | str                      # token ids, or text (prompt_format="text")
    max_tokens: int
    num_prompt_tokens: int | None = None    # the intended prompt length; None: len(prompt) (token ids)


@dataclass
class HttpRecord:
    """What the client saw of one request; times on the replay clock (seconds), None where it never happened."""
    request_id: int
    arrival_time_s: float
    max_tokens: int
    num_prompt_tokens_sent: int             # the prompt's length in tokens as meant (token ids: as sent)
    send_time_s: float | None = None        # when the client sent the request (arrival + client lateness)
    token_times_s: list = field(default_factory=list)   # one per output token: the arrival of its chunk
    num_chunks: int = 0                     # streamed chunks that carried a token
    finish_time_s: float | None = None
    finish_reason: str | None = None
    usage: dict | None = None               # the server's final usage object
    error: str | None = None
    http_status: int | None = None
    # the server's scheduling policy gave up on the request (servelab-serve's error code "policy_rejected"):
    # a rejection, as the other backends record it, not a failure; `error` holds the reason
    rejected: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_time_s is not None

    @property
    def num_output_tokens(self) -> int:
        if self.usage and self.usage.get("completion_tokens") is not None:
            return int(self.usage["completion_tokens"])
        return len(self.token_times_s)

    @property
    def num_prompt_tokens(self) -> int:
        if self.usage and self.usage.get("prompt_tokens") is not None:
            return int(self.usage["prompt_tokens"])
        return self.num_prompt_tokens_sent

    @property
    def num_cached_tokens(self) -> int:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)


@dataclass
class ReplayOutcome:
    records: list                           # HttpRecord per request, in the order given
    model: str                              # the model name sent
    wall_s: float                           # replay start to the last response's end
    t0_perf_s: float                        # time.perf_counter() at replay time 0
    interrupted: bool = False
    # servelab-serve's facts of the served model (scheduler, eviction, KV blocks, ...: its /v1/models entry's
    # `servelab` object, servelab's config keys); {} from another server
    server_facts: dict = field(default_factory=dict)

    @property
    def num_failed(self) -> int:
        return sum(not r.ok and not r.rejected for r in self.records)


def _error_text(status: int, body: bytes) -> str:
    """`HTTP 400: message` from an OpenAI-style error body ({"error": {"message": ...}}) or the raw body."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") or err.get("detail") or text if isinstance(err, dict) else str(err)
    except (json.JSONDecodeError, AttributeError):
        msg = text
    msg = " ".join(str(msg).split())
    return f"HTTP {status}: {msg[:300]}" if msg else f"HTTP {status}"


POLICY_REJECTED = "policy_rejected"     # servelab-serve's error code for a request its policy rejected


def _error_code(body: bytes) -> str | None:
    """The `error.code` of an OpenAI-style error body, None when there is none."""
    try:
        err = json.loads(body).get("error")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return err.get("code") if isinstance(err, dict) else None


def _headers(target: HttpTarget) -> dict:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


def _client(target: HttpTarget, timeout_s: float):
    import httpx
    # No connection limit: concurrency is the trace's. Keep-alive connections are reused between requests.
    return httpx.AsyncClient(headers=_headers(target),
                             timeout=httpx.Timeout(timeout_s, connect=target.connect_timeout_s),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))


def _unreachable(target: HttpTarget, exc) -> HttpBackendError:
    return HttpBackendError(f"cannot reach the server at backend.url={target.url} ({type(exc).__name__}: "
                            f"{exc or 'no answer'}); start it (e.g. servelab-serve) or fix backend.url")


def _no_api(target: HttpTarget, method: str, path: str, resp) -> HttpBackendError:
    return HttpBackendError(f"no OpenAI API at {target.api_base} ({method} {path}: "
                            f"{_error_text(resp.status_code, resp.content)}); backend.url is the server's base URL, "
                            "e.g. http://127.0.0.1:8000")


async def check_server(target: HttpTarget, probe_prompt, prompt_vocabulary: str | None = None) -> tuple[str, dict]:
    """(the model name to send, the server's facts: servelab-serve's `servelab` object of that model's /v1/models
    entry, {} from another server); raises HttpBackendError (one line) when the server cannot serve the replay.
    prompt_vocabulary: where the token-id prompts come from (e.g. "model=qwen3_8b, vocab_size 151936"), for the
    fix of a server that finds a token id outside its vocabulary."""
    import httpx
    async with _client(target, target.connect_timeout_s + 30) as client:
        try:
            resp = await client.get(target.api_base + "/models")
        except httpx.HTTPError as exc:
            raise _unreachable(target, exc) from None
        served, cards = [], {}
        if resp.status_code == 200:
            try:
                cards = {m["id"]: m for m in resp.json().get("data", [])}
                served = list(cards)
            except (ValueError, KeyError, TypeError, AttributeError):
                served, cards = [], {}
        elif resp.status_code in (401, 403):
            raise HttpBackendError(f"the server at {target.url} refused the request "
                                   f"({_error_text(resp.status_code, resp.content)}); give its key as backend.api_key")
        model = target.model
        if model is None and resp.status_code == 404:
            raise _no_api(target, "GET", "/models", resp)
        if model is None:
            if not served:
                raise HttpBackendError(f"{target.api_base}/models lists no model "
                                       f"({_error_text(resp.status_code, resp.content)}); give the served model name "
                                       "as backend.model")
            model = served[0]
        elif served and model not in served:
            raise HttpBackendError(f"backend.model={model!r} is not served at {target.url} (it serves: "
                                   f"{', '.join(served)}); set backend.model={served[0]}")
        body = {"model": model, "prompt": probe_prompt, "max_tokens": 1, "temperature": target.temperature,
                "ignore_eos": True}
        if target.return_token_ids:
            body["return_token_ids"] = True
        try:
            resp = await client.post(target.api_base + "/completions", json=body)
        except httpx.HTTPError as exc:
            raise _unreachable(target, exc) from None
        if resp.status_code == 404 and "model" not in resp.text.lower():
            raise _no_api(target, "POST", "/completions", resp)
        if resp.status_code != 200:
            what = "a token-id prompt" if target.prompt_format == "token_ids" else "a text prompt"
            fix = ""
            if resp.status_code in (400, 422):
                fix = "; if it takes text only, give backend.prompt=text backend.tokenizer=PATH" \
                    if target.prompt_format == "token_ids" else ""
                if target.return_token_ids and "return_token_ids" in resp.text:
                    fix = "; it does not take return_token_ids: give backend.return_token_ids=false"
                if target.prompt_format == "token_ids" and _outside_vocabulary(resp.text):
                    fix = _vocabulary_fix(resp.text, facts_of(cards.get(model)), prompt_vocabulary)
            raise HttpBackendError(f"the server at {target.url} refused {what} on /v1/completions "
                                   f"({_error_text(resp.status_code, resp.content)}){fix}")
        return model, facts_of(cards.get(model))


def server_max_model_len(target: HttpTarget) -> int | None:
    """The served model's max_model_len as its /v1/models entry gives it (servelab-serve's and vLLM's
    `max_model_len`), or None: a server that does not say, or cannot be asked now (check_server then says why)."""
    import httpx

    async def ask():
        async with _client(target, target.connect_timeout_s + 30) as client:
            return await client.get(target.api_base + "/models")
    try:
        resp = _run(ask())
        cards = resp.json().get("data", []) if resp.status_code == 200 else []
        card = next((c for c in cards if target.model is None or c.get("id") == target.model), None)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return None
    value = card.get("max_model_len", facts_of(card).get("max_model_len")) if isinstance(card, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def facts_of(card) -> dict:
    """servelab-serve's `servelab` object of a /v1/models entry (its scheduler and KV cache); {} if none."""
    facts = card.get("servelab") if isinstance(card, dict) else None
    return dict(facts) if isinstance(facts, dict) else {}


def _outside_vocabulary(text: str) -> bool:
    """The server's error says a prompt token id is outside its vocabulary (servelab-serve's and vLLM's words)."""
    text = text.lower()
    return "token id" in text and "vocab" in text


def _vocabulary_fix(text: str, facts: dict, prompt_vocabulary: str | None) -> str:
    """The fix of a token id outside the server's vocabulary: the prompts' vocabulary must be the server's."""
    import re
    size = facts.get("vocab_size")
    if size is None:
        found = re.search(r"\[0, (\d+)\)", text)       # servelab-serve's "outside [0, 512) (vocab_size)"
        size = int(found.group(1)) if found else None
    source = f" ({prompt_vocabulary})" if prompt_vocabulary else ""
    vocab = f"model.vocab_size={size}" if size is not None else "model.vocab_size=<the server's vocabulary size>"
    return (f"; the prompt token ids are drawn from the model= entry's vocabulary{source}, larger than the server's: "
            f"give model=<the entry of the server's checkpoint> or {vocab}")


def _body(target: HttpTarget, model: str, req: HttpRequest) -> bytes:
    """The request's JSON body, encoded before the replay clock starts (the in-process replay encodes nothing)."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": int(req.max_tokens), "ignore_eos": True,
            "temperature": target.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if target.return_token_ids:
        body["return_token_ids"] = True
    return json.dumps(body, separators=(",", ":")).encode()


SPIN_S = 0.002      # the last stretch before a send is yielded through: the loop's timers wake up to ~1 ms late


async def sleep_until(due_s: float, clock=time.perf_counter) -> None:
    """Returns at clock() >= due_s, rarely more than tens of microseconds later: a timer until SPIN_S before it
    (asyncio's and uvloop's timers have millisecond resolution), then turns of the event loop (other tasks run)."""
    while True:
        left = due_s - clock()
        if left <= 0:
            return
        await asyncio.sleep(left - SPIN_S if left > SPIN_S else 0)


def open_pool(target: HttpTarget) -> tuple:
    """(aiohttp session, the completions URL) of the replay's streamed POSTs; close the session when done. No
    connection limit: concurrency is the trace's; a connection whose response was read to its end serves a later
    request. Call it inside the running event loop."""
    session = aiohttp.ClientSession(headers=_headers(target), connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=None, connect=target.connect_timeout_s))
    return session, target.api_base.rstrip("/") + "/completions"


async def _one(pool, target: HttpTarget, body: bytes, rec: HttpRecord, t0: float) -> None:
    clock = time.perf_counter
    rec.send_time_s = clock() - t0
    try:
        async with _time_limit(target.request_timeout_s):
            await _exchange(pool, body, rec, t0)
    except TimeoutError:
        rec.error = f"timed out after backend.request_timeout_s={target.request_timeout_s} s"
        return
    except (OSError, aiohttp.ClientError) as exc:
        rec.error = f"{type(exc).__name__}: {exc or 'connection lost'}"
        return
    if rec.error is None and rec.finish_time_s is None:
        rec.error = f"the stream ended without a finish_reason after {len(rec.token_times_s)} tokens"


async def _exchange(pool, body: bytes, rec: HttpRecord, t0: float) -> None:
    clock = time.perf_counter
    session, url = pool
    async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
        rec.http_status = resp.status
        if resp.status != 200:
            text = await resp.read()
            rec.error = _error_text(resp.status, text)
            rec.rejected = _error_code(text) == POLICY_REJECTED
            return
        async for raw in resp.content:          # the body's lines: server-sent events
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                await resp.read()       # the body's end: the connection can serve the next request
                break
            t = clock() - t0
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                chunk = None
            if not isinstance(chunk, dict):
                rec.error = f"malformed event from the server: {data[:120]!r}"
                return
            if chunk.get("error"):
                err = chunk["error"]
                rec.error = f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
                rec.rejected = isinstance(err, dict) and err.get("code") == POLICY_REJECTED
                return
            for choice in chunk.get("choices") or ():
                reason = choice.get("finish_reason")
                ids = choice.get("token_ids")
                if ids is not None:                 # the server says which tokens this chunk carries
                    n = len(ids)
                else:                               # one token a chunk; a bare closing chunk is none
                    n = 0 if reason and not choice.get("text") else 1
                if n:
                    rec.token_times_s.extend([t] * n)
                    rec.num_chunks += 1
                if reason:
                    rec.finish_reason, rec.finish_time_s = reason, t
            if chunk.get("usage"):
                rec.usage = chunk["usage"]


def _time_limit(seconds: float):
    """asyncio.timeout (Python >= 3.11), else the same limit by a timer that cancels the task."""
    if hasattr(asyncio, "timeout"):
        return asyncio.timeout(seconds)
    return _TimerLimit(seconds)


class _TimerLimit:
    def __init__(self, seconds: float):
        self.seconds, self.handle, self.fired = seconds, None, False

    async def __aenter__(self):
        task = asyncio.current_task()

        def fire():
            self.fired = True
            task.cancel()
        self.handle = asyncio.get_running_loop().call_later(self.seconds, fire)

    async def __aexit__(self, kind, exc, tb):
        self.handle.cancel()
        if self.fired and kind is asyncio.CancelledError:
            raise TimeoutError from None


async def _replay(requests: list[HttpRequest], target: HttpTarget, model: str, records: list, started: list,
                  max_wall_s: float | None) -> None:
    clock = time.perf_counter
    bodies = [_body(target, model, req) for req in requests]
    pool = open_pool(target)
    session = pool[0]
    try:
        t0 = clock()
        started.append(t0)
        tasks = []
        for req, rec, body in zip(requests, records, bodies):
            await sleep_until(t0 + req.arrival_time_s)      # never early, rarely more than tens of microseconds late
            tasks.append(asyncio.create_task(_one(pool, target, body, rec, t0)))
        if not tasks:
            return
        remaining = None if max_wall_s is None else max(0.0, t0 + max_wall_s - clock())
        done, pending = await asyncio.wait(tasks, timeout=remaining)
        for task in pending:
            task.cancel()
        for rec, task in zip(records, tasks):
            if task in pending and rec.error is None:
                rec.error = f"unfinished when the replay hit max_wall_s={max_wall_s} s"
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        await session.close()


def replay(requests: list[HttpRequest], target: HttpTarget, *, max_wall_s: float | None = None,
           prompt_vocabulary: str | None = None) -> ReplayOutcome:
    """Checks the server, then replays `requests` (sorted by arrival here) in real time; see the module docstring.
    prompt_vocabulary: where the token-id prompts come from, named in the fix of a vocabulary mismatch.

    Ctrl-C stops the replay and returns what the client saw so far (interrupted=True; requests in flight or not
    yet sent carry an error)."""
    requests = sorted(requests, key=lambda r: r.arrival_time_s)
    if not requests:
        raise HttpBackendError("the workload has no requests to replay")
    probe = requests[0].prompt[:4] if target.prompt_format == "token_ids" else "Hello"
    model, facts = _run(check_server(target, probe, prompt_vocabulary))
    records = [HttpRecord(r.request_id, float(r.arrival_time_s), int(r.max_tokens),
                          len(r.prompt) if r.num_prompt_tokens is None else int(r.num_prompt_tokens))
               for r in requests]
    started: list = []
    interrupted = False
    try:
        with interruptible():
            _run(_replay(requests, target, model, records, started, max_wall_s))
    except KeyboardInterrupt:
        interrupted = True
        for rec in records:
            if not rec.ok and rec.error is None:
                rec.error = "interrupted (Ctrl-C) before it finished"
    t0 = started[0] if started else time.perf_counter()
    return ReplayOutcome(records, model, time.perf_counter() - t0, t0, interrupted, facts)


def _run(coro):
    """asyncio.run with uvloop's event loop where it is installed (less client overhead per streamed chunk)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
