"""The HTTP replay's client (experiments/http_replay.py on aiohttp) and its send timing, on loopback servers."""
import asyncio
import statistics
import time

import pytest

from experiments.http_replay import sleep_until


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


def test_events_of_sequential_requests_come_over_one_kept_connection():
    """The replay's client (aiohttp): chunked server-sent events, each request's tokens timed as they arrive, and
    a connection whose response ended serves the next request."""
    from experiments import http_replay
    from experiments.http_replay import HttpRecord, HttpTarget
    connections = []

    async def handle(reader, writer):
        connections.append(writer)
        while await _read_request(reader) is not None:
            events = [b'data: {"choices":[{"text":"a","token_ids":[5],"finish_reason":null}]}\n\n',
                      b'data: {"choices":[{"text":"b","token_ids":[6],"finish_reason":"length"}]}\n\n',
                      b"data: [DONE]\n\n"]
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         + _chunked(*events))
            await writer.drain()

    async def main():
        server, url = await _server(handle)
        target = HttpTarget(url)
        pool = http_replay.open_pool(target)
        recs = [HttpRecord(i, 0.0, 4, 2) for i in range(3)]
        for rec in recs:
            await http_replay._one(pool, target, b"{}", rec, time.perf_counter())
        await pool[0].close()
        server.close()
        return recs

    recs = _run(main())
    assert [r.error for r in recs] == [None] * 3 and [r.http_status for r in recs] == [200] * 3
    assert all(len(r.token_times_s) == 2 and r.finish_time_s is not None for r in recs)
    assert len(connections) == 1


def test_a_connection_lost_mid_stream_is_recorded_as_an_error():
    from experiments import http_replay
    from experiments.http_replay import HttpRecord, HttpTarget

    async def handle(reader, writer):       # headers and one event, then the connection drops
        await _read_request(reader)
        event = b'data: {"choices":[{"text":"a","token_ids":[5],"finish_reason":null}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % 200 + event)
        await writer.drain()
        writer.close()

    async def main():
        server, url = await _server(handle)
        target = HttpTarget(url)
        pool = http_replay.open_pool(target)
        rec = HttpRecord(0, 0.0, 4, 3)
        await http_replay._one(pool, target, b"{}", rec, time.perf_counter())
        await pool[0].close()
        server.close()
        return rec

    rec = _run(main())
    assert rec.error is not None and rec.finish_time_s is None


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
        pool = http_replay.open_pool(target)
        t = time.perf_counter()
        await http_replay._one(pool, target, b"{}", rec, t)
        took = time.perf_counter() - t
        await pool[0].close()
        server.close()
        return rec, took

    rec, took = _run(main())
    assert rec.error == "timed out after backend.request_timeout_s=0.2 s" and rec.http_status == 200
    assert 0.2 - 0.002 <= took < 2        # asyncio runs a timer up to its clock resolution (~1 ms) early


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
        pool = http_replay.open_pool(target)
        await http_replay._one(pool, target, b"{}", rec, time.perf_counter())
        await pool[0].close()
        server.close()
        return rec

    assert _run(main()).error == "malformed event from the server: '1'"
