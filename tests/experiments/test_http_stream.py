"""experiments/http_stream.py (the replay's HTTP/1.1 client) and the replay's send timing, on loopback servers."""
import asyncio
import statistics
import time

import pytest

from experiments.http_replay import sleep_until
from experiments.http_stream import ConnectionPool, RemoteProtocolError


def _run(coro):
    return asyncio.run(coro)


async def _server(handler):
    """A loopback server answering each connection with handler(reader, writer); (server, base URL)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"


async def _read_request(reader):
    """(request line, headers, body) of one request, or None at EOF."""
    line = await reader.readline()
    if not line:
        return None
    headers = {}
    while (h := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = h.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return line, headers, body


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_chunked_events_content_length_bodies_and_one_connection_for_sequential_requests():
    seen, connections = [], []

    async def handle(reader, writer):
        connections.append(writer)
        while (req := await _read_request(reader)) is not None:
            seen.append(req)
            if req[2] == b'{"fail":1}':
                writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 9\r\n\r\n{\"e\": 1}\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                             + _chunked(b"data: 1\n\n", b"data: 2\r\n\r\ndata: ", b"3\n\n", b"data: [DONE]\n\n"))
            await writer.drain()

    async def main():
        server, url = await _server(handle)
        pool = ConnectionPool(url, headers={"Authorization": "Bearer k"})
        got = []
        for _ in range(3):
            async with pool.post("/completions", b'{"a":1}') as resp:
                assert resp.status == 200
                got.append([line async for line in resp.lines() if line])
        async with pool.post("/completions", b'{"fail":1}') as resp:
            assert resp.status == 400 and await resp.read() == b'{"e": 1}\n'
        assert len(pool._idle) == 1
        await pool.close()
        server.close()
        return got

    got = _run(main())
    assert got == [["data: 1", "data: 2", "data: 3", "data: [DONE]"]] * 3
    assert len(connections) == 1            # keep-alive: every request on the one connection
    line, headers, body = seen[0]
    assert line == b"POST /v1/completions HTTP/1.1\r\n" and body == b'{"a":1}'
    assert headers["authorization"] == "Bearer k" and headers["content-type"] == "application/json"
    assert headers["host"].startswith("127.0.0.1:")


def test_a_connection_the_server_closed_while_idle_is_replaced_once():
    connections = []

    async def handle(reader, writer):       # answers one request, then closes without saying so
        connections.append(writer)
        if await _read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    async def main():
        server, url = await _server(handle)
        pool = ConnectionPool(url)
        bodies = []
        for _ in range(3):
            async with pool.post("/x", b"{}") as resp:
                bodies.append(await resp.read())
            await asyncio.sleep(0.05)       # the server's close reaches the idle connection
        await pool.close()
        server.close()
        return bodies

    assert _run(main()) == [b"ok"] * 3
    assert len(connections) == 3


def test_a_connection_lost_mid_stream_is_a_protocol_error_and_not_reused():
    async def handle(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"9\r\ndata: 1\n\n\r\n" + b"20\r\ndata")
        await writer.drain()
        writer.close()

    async def main():
        server, url = await _server(handle)
        pool = ConnectionPool(url)
        lines = []
        with pytest.raises(RemoteProtocolError, match="mid-response"):
            async with pool.post("/x", b"{}") as resp:
                async for line in resp.lines():
                    lines.append(line)
        assert pool._idle == []
        with pytest.raises(ValueError, match="not an http"):
            ConnectionPool("ftp://host/")
        server.close()
        return lines

    assert _run(main()) == ["data: 1", ""]


def test_sleep_until_is_never_early_and_rarely_late():
    # asyncio's timers wake up to a millisecond late (epoll's resolution): a plain sleep loop is ~0.5 ms late at the
    # median, which an HTTP replay would add to every TTFT
    async def main():
        late = []
        for k in range(40):
            due = time.perf_counter() + 0.0003 + (k % 7) * 0.0005
            await sleep_until(due)
            late.append(time.perf_counter() - due)
        return late

    late = _run(main())
    assert min(late) >= 0
    assert statistics.median(late) < 0.0002, late


@pytest.mark.parametrize("limit", ["asyncio", "timer"])
def test_a_request_past_its_time_limit_is_recorded_as_timed_out(limit, monkeypatch):
    # the replay's time limit: asyncio.timeout where Python has it (3.11+), else a timer that cancels the task
    from experiments import http_replay
    from experiments.http_replay import HttpRecord, HttpTarget

    if limit == "timer":
        monkeypatch.setattr(http_replay, "_time_limit", http_replay._TimerLimit)

    async def handle(reader, writer):       # headers, one event, then nothing
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\ndata: {}\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def main():
        server, url = await _server(handle)
        target = HttpTarget(url, request_timeout_s=0.2)
        rec = HttpRecord(0, 0.0, 4, 3)
        pool = ConnectionPool(target.api_base)
        t = time.perf_counter()
        await http_replay._one(pool, target, b"{}", rec, t)
        took = time.perf_counter() - t
        await pool.close()
        server.close()
        return rec, took

    rec, took = _run(main())
    assert rec.error == "timed out after backend.request_timeout_s=0.2 s" and rec.http_status == 200
    assert 0.2 <= took < 2


def test_an_event_that_is_not_a_json_object_is_a_malformed_event():
    from experiments import http_replay
    from experiments.http_replay import HttpRecord, HttpTarget

    async def handle(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(b"data: 1\n\n"))
        await writer.drain()

    async def main():
        server, url = await _server(handle)
        target = HttpTarget(url)
        rec = HttpRecord(0, 0.0, 4, 3)
        pool = ConnectionPool(target.api_base)
        await http_replay._one(pool, target, b"{}", rec, time.perf_counter())
        await pool.close()
        server.close()
        return rec

    assert _run(main()).error == "malformed event from the server: '1'"
