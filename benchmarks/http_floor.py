"""The least a first token can cost over HTTP from Python: a streamed completion's TTFT against servers that do
nothing, with the HTTP replay's client.

    python benchmarks/http_floor.py                                   # 300 requests a server, 1,000-token prompts
    python benchmarks/http_floor.py --inproc-ttft-ms 5.33 --out floor.json

`servelab backend=http` is compared with the in-process replay, which pays no HTTP at all, so what the HTTP path may
add to TTFT is bounded below by what an HTTP round trip costs on the host whatever the server does. This measures it
on two servers started with uvicorn as `servelab-serve` starts it (its default event loop and HTTP parser: uvloop and
httptools where they are installed), each a few lines of raw ASGI:

  asgi       reads the body, parses the JSON, and answers at once with a server-sent event holding one token and
             then `data: [DONE]`: any Python ASGI server's cost of a first token.
  asgi_proc  the same, but the first event is written after a round trip to a second process over a Unix socket
             (asyncio streams; the second process blocks on its socket): the least a server whose engine runs in
             its own process pays.

The client (experiments/http_replay.py's aiohttp pool, uvloop where installed) sends the requests one at a time,
--gap-s apart, as `benchmarks/serve_hops.py` does (token-id prompts, stream, ignore_eos), and times each from its
send to the first event's bytes. It prints each server's TTFT p50 and p90 in microseconds and, given the in-process
replay's TTFT p50 (--inproc-ttft-ms), the HTTP time a ratio goal allows (--goal-ratio, default 1.05) beside them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SERVERS = ("asgi", "asgi_proc")
FIRST_EVENT = (b'data: {"id":"cmpl-0","object":"text_completion","choices":[{"index":0,"text":"a","token_ids":[1],'
               b'"finish_reason":null}]}\n\n')


def serve(mode: str, port: int) -> None:
    """The server process of one mode: uvicorn on 127.0.0.1:port until killed."""
    import uvicorn

    peer = None
    if mode == "asgi_proc":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.fork() == 0:                    # the second process: one byte back for each request it reads
            ours.close()
            while True:
                head = theirs.recv(4)
                if not head:
                    os._exit(0)
                size = int.from_bytes(head, "little")
                while size:
                    size -= len(theirs.recv(min(size, 1 << 16)))
                theirs.sendall(b"\x01")
        theirs.close()
        peer = ours
    streams: list = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                if msg["type"] == "lifespan.startup":
                    if peer is not None:
                        streams.extend(await asyncio.open_unix_connection(sock=peer))
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        prompt = json.loads(body)["prompt"]
        if streams:
            reader, writer = streams
            payload = json.dumps(prompt).encode()
            writer.write(len(payload).to_bytes(4, "little") + payload)
            await reader.readexactly(1)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": FIRST_EVENT, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_up(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"error: the bare server on port {port} did not start in {timeout_s:.0f} s")
            await asyncio.sleep(0.1)


async def client(port: int, args) -> list[float]:
    """Each timed request's TTFT in microseconds."""
    from experiments.http_replay import JSON_HEADERS, HttpTarget, open_pool
    await wait_up(port)
    session, url = open_pool(HttpTarget(f"http://127.0.0.1:{port}/v1"))
    ttft_us = []
    for i in range(args.requests + args.warmup):
        prompt = [(7 * i + 3 * p) % 151_935 + 1 for p in range(args.prompt_len)]
        body = json.dumps({"prompt": prompt, "max_tokens": 3, "ignore_eos": True, "temperature": 0.6, "stream": True,
                           "stream_options": {"include_usage": True}, "return_token_ids": True},
                          separators=(",", ":")).encode()
        sent = time.perf_counter()
        first = None
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            async for raw in resp.content:
                if first is None and raw.startswith(b"data: {"):
                    first = time.perf_counter()
        if first is None:
            raise SystemExit("error: the bare server sent no event")
        if i >= args.warmup:
            ttft_us.append((first - sent) * 1e6)
        await asyncio.sleep(args.gap_s)
    await session.close()
    return ttft_us


def measure(mode: str, args) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, "--port", str(port)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
                                "PYTHONPATH")]))})
    try:
        try:
            import uvloop
            ttft = uvloop.run(client(port, args))
        except ImportError:
            ttft = asyncio.run(client(port, args))
    finally:
        proc.terminate()
        proc.wait(30)
    ttft.sort()
    return {"num_requests": len(ttft), "ttft_us_p50": statistics.median(ttft),
            "ttft_us_p90": ttft[int(0.9 * (len(ttft) - 1))], "ttft_us_min": ttft[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--gap-s", type=float, default=0.03, help="seconds between requests (default 0.03)")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    ap.add_argument("--inproc-ttft-ms", type=float, help="the in-process replay's TTFT p50 the goal is relative to")
    ap.add_argument("--goal-ratio", type=float, default=1.05)
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)      # the server processes' own entry
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    for name in ("requests", "prompt_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")

    out: dict = {"settings": {k: getattr(args, k) for k in ("requests", "warmup", "prompt_len", "gap_s")}}
    budget_us = None
    if args.inproc_ttft_ms is not None:
        budget_us = (args.goal_ratio - 1) * args.inproc_ttft_ms * 1e3
        out.update(inproc_ttft_ms_p50=args.inproc_ttft_ms, goal_ratio=args.goal_ratio, http_budget_us=budget_us)
    for mode in args.servers:
        out[mode] = r = measure(mode, args)
        line = (f"{mode:10s} TTFT p50 {r['ttft_us_p50']:7.0f} us, p90 {r['ttft_us_p90']:7.0f} us, min "
                f"{r['ttft_us_min']:6.0f} us ({r['num_requests']} requests, {args.prompt_len}-token prompts)")
        if budget_us is not None:
            r["p50_over_budget"] = r["ttft_us_p50"] / budget_us
            line += f"; {r['p50_over_budget']:.2f}x the {budget_us:.0f} us a {args.goal_ratio}x goal allows"
        print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
