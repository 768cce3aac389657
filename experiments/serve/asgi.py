"""The generation routes' ASGI plumbing, lighter than FastAPI's: a direct dispatch and a server-sent-event writer.

    app = ServeApp(title=..., lifespan=...)              # a FastAPI app; every route is declared on it as usual
    app.direct[("POST", "/v1/completions")] = handler    # async handler(Request) -> ASGI response, on the hot path
    return EventStream(chunks, on_close, headers={...})  # chunks: an async iterator of str (whole events)
    ... yield LastEvent(text)                            # the stream's last chunk: written with the response's end

A request whose method and path are in `direct` goes straight to its handler: not through FastAPI's middleware
stack, router and request wrapper (about 0.3 ms of a small CPU a request, most of what the HTTP path added to a
first token's latency after the client), with the errors the app's exception handlers would give (error_response).
Every other request, the same paths with another method included, is FastAPI's. The app has no body size limit
and no user middleware, so nothing those layers do is skipped.

EventStream writes each chunk as it comes. It watches the connection in one small task (Starlette's
StreamingResponse starts an anyio task group per response for that, on uvicorn's ASGI 2.3): a client that
disconnects cancels the writing, the chunk iterator is closed and on_close() runs, however the stream ends
(done, client gone, cancelled at shutdown).
"""
from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request

from experiments.serve.errors import APIError, error_body

log = logging.getLogger("servelab.serve")


def error_response(exc: Exception) -> Response:
    """The response the app gives for an exception a route raised (its exception handlers use it too)."""
    if isinstance(exc, APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
    if isinstance(exc, StarletteHTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)
    if isinstance(exc, ClientDisconnect):
        return Response(status_code=499)        # left before its body arrived: nothing was queued
    log.error("request failed", exc_info=exc)
    return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}"), status_code=500)


class ServeApp(FastAPI):
    """FastAPI, plus `direct`: (method, path) -> async handler(Request) returning an ASGI response."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.direct: dict = {}

    async def __call__(self, scope, receive, send) -> None:
        handler = self.direct.get((scope.get("method"), scope.get("path"))) if scope["type"] == "http" else None
        if handler is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        try:
            response = await handler(Request(scope, receive))
        except Exception as e:      # noqa: BLE001 (every error is a response, as the exception handlers make it)
            response = error_response(e)
        await response(scope, receive, send)


class LastEvent(str):
    """The chunk that ends an EventStream: it goes out with the response's end in one send (uvicorn writes the
    chunk and the chunked encoding's last-chunk together: one system call, one read of the client)."""
    __slots__ = ()


class EventStream:
    """An ASGI response of server-sent events (module docstring)."""

    def __init__(self, chunks, on_close, headers: dict | None = None):
        self.chunks = chunks
        self.on_close = on_close
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")] + [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        gone = False

        async def watch():
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            last = ""
            async for chunk in self.chunks:
                if type(chunk) is LastEvent:
                    last = chunk
                    break
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
            watcher.cancel()
            await send({"type": "http.response.body", "body": last.encode(), "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()     # the cancel was ours (the client left): the request ends normally
        finally:
            watcher.cancel()
            try:
                await self.chunks.aclose()
            finally:
                self.on_close()
