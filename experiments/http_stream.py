"""A small HTTP/1.1 client for the replay's streamed POSTs: keep-alive connections, one write a request.

    pool = ConnectionPool("http://127.0.0.1:8000", headers={"Authorization": "Bearer k"}, connect_timeout_s=10)
    async with pool.post("/v1/completions", body_bytes) as resp:     # the request's JSON body, encoded already
        resp.status                          # 200, 400, ...
        async for line in resp.lines():      # the body's lines (str, without the line break): server-sent events
            ...
        body = await resp.read()             # or the whole body (an error's JSON)
    await pool.close()

Why not httpx here: on the replay's hot path (a POST, then its server-sent events) httpx spends most of a
millisecond of a small CPU between the call and the request's bytes reaching the socket, and ~0.1 ms on each
chunk, latency the in-process replay never pays (benchmarks/serve_hops.py measures it). This writes the
request line, headers and body in one write and reads the response with asyncio's buffered reader (chunked
transfer encoding or Content-Length). A connection goes back to the pool when its response was read to the
end and the server did not ask to close it; a request sent on a reused connection that the server closed
while it idled (uvicorn closes idle ones after 5 s) is sent again once on a new one, which is safe because
nothing of a response came back. `http://` and `https://` URLs; no proxies, no redirects, no HTTP/2.
Errors: OSError (connect, reset), RemoteProtocolError (the server closed the connection mid-response or
broke the protocol); time limits are the caller's (asyncio.wait_for or asyncio.timeout around the request).
"""
from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit


class RemoteProtocolError(ConnectionError):
    """The server closed the connection before the response ended, or sent something that is not HTTP/1.1."""


class ConnectionPool:
    def __init__(self, base_url: str, headers: dict | None = None, connect_timeout_s: float = 10.0):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http:// or https:// URL: {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.path_prefix = u.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        host_header = u.netloc.rsplit("@", 1)[-1]
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        # everything of a request's head but its first line and its length, made once
        self._head_tail = (f"Host: {host_header}\r\nContent-Type: application/json\r\nAccept: */*\r\n"
                           f"{extra}Content-Length: ").encode("latin-1")
        self._idle: list = []       # (reader, writer) of connections whose last response was read to the end

    def post(self, path: str, body: bytes) -> "_Exchange":
        head = b"POST " + (self.path_prefix + path).encode("latin-1") + b" HTTP/1.1\r\n" + self._head_tail
        return _Exchange(self, head + str(len(body)).encode() + b"\r\n\r\n" + body)

    async def _connect(self):
        return await asyncio.wait_for(asyncio.open_connection(self.host, self.port, ssl=self.ssl,
                                                              limit=1 << 20), self.connect_timeout_s)

    def _take_idle(self):
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            try:
                await writer.wait_closed()
            except OSError:
                pass


class _Exchange:
    """One request and its response (the `async with` of ConnectionPool.post)."""

    def __init__(self, pool: ConnectionPool, request: bytes):
        self.pool, self.request = pool, request
        self.status = 0
        self.headers: dict[str, str] = {}
        self._reader = self._writer = None
        self._chunked = False
        self._remaining: int | None = None      # Content-Length bytes left; None: read until the close
        self._done = False                      # the body was read to its end
        self._keep = True                       # the server lets the connection serve another request

    async def __aenter__(self) -> "_Exchange":
        conn = self.pool._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self.pool._connect()
        self._reader, self._writer = conn
        try:
            try:
                self._writer.write(self.request)
                line = await self._reader.readline()
            except OSError:
                if not reused:
                    raise
                line = b""
            if not line and reused:     # closed while idle, before it read the request: send it again on a new one
                self._writer.close()
                self._reader, self._writer = await self.pool._connect()
                self._writer.write(self.request)
                line = await self._reader.readline()
            await self._read_head(line)
        except BaseException:
            self._writer.close()
            self._writer = None
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._done and self._keep and exc[0] is None:
            self.pool._idle.append((self._reader, writer))
        else:
            writer.close()

    async def _read_head(self, line: bytes) -> None:
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise RemoteProtocolError("the server closed the connection without a response" if not line
                                      else f"not an HTTP/1.1 status line: {line[:80]!r}")
        self.status = int(parts[1])
        reader = self._reader
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n"):
                break
            if not h:
                raise RemoteProtocolError("the server closed the connection in the response's headers")
            name, _, value = h.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        te = self.headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        if "close" in self.headers.get("connection", "").lower() or parts[0] == b"HTTP/1.0":
            self._keep = False
        if not self._chunked:
            length = self.headers.get("content-length")
            if length is not None and length.isdigit():
                self._remaining = int(length)
            else:
                self._remaining, self._keep = None, False
            if self._remaining == 0 or self.status in (204, 304):
                self._done = True

    async def _next_data(self) -> bytes:
        """The next piece of the body; b"" once it ended (then the connection may be reused)."""
        if self._done:
            return b""
        reader = self._reader
        if self._chunked:
            size_line = await reader.readline()
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise RemoteProtocolError("the server closed the connection mid-response" if not size_line else
                                          f"a malformed chunk size line: {size_line[:40]!r}") from None
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):     # trailers
                    pass
                self._done = True
                return b""
            try:
                data = await reader.readexactly(size + 2)
            except asyncio.IncompleteReadError:
                raise RemoteProtocolError("the server closed the connection mid-response") from None
            return data[:-2]
        if self._remaining is None:         # the body ends with the connection
            data = await reader.read(1 << 16)
            if not data:
                self._done = True
            return data
        data = await reader.read(min(self._remaining, 1 << 16))
        if not data:
            raise RemoteProtocolError("the server closed the connection mid-response")
        self._remaining -= len(data)
        if self._remaining == 0:
            self._done = True
        return data

    async def read(self) -> bytes:
        parts = []
        while data := await self._next_data():
            parts.append(data)
        return b"".join(parts)

    async def lines(self):
        """The body's lines as str (UTF-8), without their line break (LF or CRLF)."""
        buf = b""
        while data := await self._next_data():
            buf += data
            if b"\n" not in data:
                continue
            *complete, buf = buf.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        if buf:
            yield buf.rstrip(b"\r").decode("utf-8", errors="replace")
