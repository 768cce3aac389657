"""Where a first token's time goes on the HTTP path: the median of each hop, client to engine and back.

    python benchmarks/serve_hops.py                               # the tiny CPU model, 150 requests, 400-token prompts
    python benchmarks/serve_hops.py --model-path DIR --device cuda --prompt-len 1000 --vocab-size 151936 --out hops.json
    python benchmarks/serve_hops.py --serve-arg serve.spin_window_ms=0        # any servelab-serve override, repeatable

It copies the tree's packages to a temporary folder and adds time stamps to the copy (time.perf_counter,
CLOCK_MONOTONIC: one clock for every process of the host) at each hop: the request's bytes reaching uvicorn, the ASGI
task starting, the route, the body read, parsed and validated, the prompt checked, the sequences built, the request
queued on the engine, the engine process receiving and admitting it, its step (first token stamped, step over), the
step's message sent and read by the server, the tokens handed to the request, text, the chunk framed and written, and
the client reading it. Then it starts `python -m experiments.serve` from the copy and sends streamed completions one
at a time, --gap-s apart, with the HTTP replay's client (aiohttp, as experiments/http_replay.py): an idle engine, so
every hop is the path's own cost, nothing queued. It prints each hop's median (a hop between processes can be
negative: the receiver ran before the sender's stamp after its send) and the HTTP overhead: the client's TTFT minus
what the in-process replay would count (the engine's admission to its first token). --out writes them as JSON. Only
the copy has the stamps. A hop whose anchor the code no longer has stops it, naming the anchor.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_overhead import start_server  # noqa: E402  (the server's start-up, shared with serve_overhead.py)

# each process appends its stamps (key -> {hop: time}) to $HOPS_DIR at its end
HOP_MODULE = '''
import json, os, time
T, LAST, TASK = {}, [0.0], [0.0]
def put(key, name, t=None):
    T.setdefault(key, {}).setdefault(name, time.perf_counter() if t is None else t)
def dump(tag):
    with open(os.path.join(os.environ["HOPS_DIR"], f"{tag}_{os.getpid()}.json"), "w") as f:
        json.dump(T, f)
def patch_uvicorn():
    from uvicorn.protocols.http import h11_impl, httptools_impl
    for proto in (httptools_impl.HttpToolsProtocol, h11_impl.H11Protocol):
        def data_received(self, data, _orig=proto.data_received):
            LAST[0] = time.perf_counter()
            return _orig(self, data)
        proto.data_received = data_received
    for cycle in (httptools_impl.RequestResponseCycle, h11_impl.RequestResponseCycle):
        async def run_asgi(self, app, _orig=cycle.run_asgi):
            TASK[0] = time.perf_counter()
            return await _orig(self, app)
        cycle.run_asgi = run_asgi
'''

H = "from experiments.serve import _hop; "
# (file, anchor, replacement): the anchor's first occurrence gets the replacement
EDITS = [
    ("experiments/serve/cli.py", "    app = create_app(llm, name, options)\n",
     "    from experiments.serve import _hop\n    _hop.patch_uvicorn()\n    app = create_app(llm, name, options)\n"),
    ("experiments/serve/app.py", "        yield\n        server.engine.stop()",
     f"        yield\n        {H}_hop.dump('server')\n        server.engine.stop()"),
    ("experiments/serve/app.py", "        arrival = time.perf_counter()\n        raw = await request.body()\n",
     f"        arrival = time.perf_counter()\n        {H}request.state.hop = {{'begin': _hop.LAST[0], 'task': "
     "_hop.TASK[0], 'route': arrival}\n        raw = await request.body()\n        request.state.hop['body'] = "
     "time.perf_counter()\n"),
    ("experiments/serve/app.py", "            req = schema.model_validate_json(raw)\n",
     "            request.state.hop['json'] = time.perf_counter()\n"
     "            req = schema.model_validate_json(raw)\n"),
    ("experiments/serve/app.py", "        req, arrival = await self._parse(request, CompletionRequest)\n",
     "        req, arrival = await self._parse(request, CompletionRequest)\n        request.state.hop['validated'] = "
     "time.perf_counter()\n"),
    ("experiments/serve/app.py", '        rid = f"cmpl-{uuid.uuid4().hex}"\n',
     '        request.state.hop["prompt"] = time.perf_counter()\n        rid = f"cmpl-{uuid.uuid4().hex}"\n'),
    ("experiments/serve/app.py", "        return await self._respond(request, req, rid, \"text_completion\"",
     f"        request.state.hop['sequences'] = time.perf_counter()\n        {H}"
     "[_hop.put(rid + '-0', k, v) for k, v in request.state.hop.items()]\n"
     "        return await self._respond(request, req, rid, \"text_completion\""),
    ("experiments/serve/app.py", "        choices = self.engine.submit(entries, queue)\n",
     f"        {H}_hop.put(entries[0][1].request_id, 'queue')\n        choices = self.engine.submit(entries, queue)\n"
     "        _hop.put(entries[0][1].request_id, 'submitted')\n"),
    ("experiments/serve/app.py", "                choice = open_.get(index)\n",
     f"                choice = open_.get(index)\n                {H}choice is not None and _hop.put("
     "choice.seq.request_id, 'handed')\n"),
    ("experiments/serve/app.py", "                yield index, text, ts.token_ids[kept:], fin\n",
     f"                {H}_hop.put(choice.seq.request_id, 'text'); _hop.RID = choice.seq.request_id\n"
     "                yield index, text, ts.token_ids[kept:], fin\n"),
    ("experiments/serve/app.py", "            chunk = make_chunk(index, text, fin, ids if token_ids else None)\n",
     f"            chunk = make_chunk(index, text, fin, ids if token_ids else None)\n            {H}_hop.put(_hop.RID, "
     "'framed')\n"),
    ("experiments/serve/asgi.py",
     '                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})\n',
     '                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})\n'
     f'                {H}\'"token_ids"\' in chunk and _hop.put(_hop.RID, "written")\n'),
    ("experiments/serve/engine_client.py", "            msg = pickle.loads(data)\n",
     "            t_read = time.perf_counter()\n            msg = pickle.loads(data)\n"
     f"            {H}[_hop.put(r[0], 'server_read', t_read) for r in (msg[1] if msg[0] == 'step' else ()) if r[1]]\n"),
    ("experiments/serve/engine_process.py", "        llm.close()\n        ch.close()",
     f"        {H}_hop.dump('engine')\n        llm.close()\n        ch.close()"),
    ("experiments/serve/engine_process.py", "                batch, finished, rejected = llm.step_batch()\n",
     "                t_step = time.perf_counter()\n                batch, finished, rejected = llm.step_batch()\n"
     "                t_done = time.perf_counter()\n"),
    ("experiments/serve/engine_process.py",
     "                self._send_step(self._records(batch.seqs), gone, "
     "len(batch.preempted) + len(batch.swapped_out))\n",
     f"                records = self._records(batch.seqs)\n                {H}[(_hop.put(r[0], 'step', t_step), "
     "_hop.put(r[0], 'first_token', r[3]), _hop.put(r[0], 'step_done', t_done)) for r in records if r[1]]\n"
     "                self._send_step(records, gone, len(batch.preempted) + len(batch.swapped_out))\n"
     "                [_hop.put(r[0], 'engine_sent') for r in records if r[1]]\n"),
    ("experiments/serve/engine_process.py", "            msg = pickle.loads(data)\n",
     "            t_read = time.perf_counter()\n            msg = pickle.loads(data)\n"
     f"            {H}[_hop.put(f[0], 'engine_read', t_read) for f in (msg[1] if msg[0] == 'add' else ())]\n"),
    ("experiments/serve/engine_process.py", "            self._sent[seq.request_id] = 0\n",
     f"            self._sent[seq.request_id] = 0\n            {H}_hop.put(seq.request_id, 'admitted')\n"),
]
# the hops in path order (client_sent and client_read are the client's)
ORDER = ["client_sent", "begin", "task", "route", "body", "json", "validated", "prompt", "sequences", "queue",
         "engine_read", "admitted", "step", "first_token", "step_done", "engine_sent", "server_read", "handed", "text",
         "framed", "written", "client_read"]
WHAT = {"begin": "bytes reach uvicorn", "task": "ASGI task starts", "route": "handler", "body": "body read",
        "json": "(parsed with the checks)", "validated": "JSON parsed, pydantic, checks", "prompt": "prompt checked",
        "sequences": "Sequences built",
        "queue": "text streams, queue", "engine_read": "socket to the engine", "admitted": "LLM.submit",
        "step": "next step starts", "first_token": "step stamps token", "step_done": "step returns",
        "engine_sent": "records, pickled, sent", "server_read": "socket to the server", "handed": "to the request",
        "text": "detokenized", "framed": "SSE chunk", "written": "transport write", "client_read": "client reads it"}


def instrument(copy: Path) -> None:
    (copy / "experiments/serve/_hop.py").write_text(HOP_MODULE)
    for rel, anchor, new in EDITS:
        path = copy / rel
        text = path.read_text()
        if anchor not in text:
            raise SystemExit(f"error: {rel} no longer has the anchor {anchor.strip()[:70]!r}; update EDITS in "
                             f"benchmarks/serve_hops.py")
        path.write_text(text.replace(anchor, new, 1))


def copy_tree(dest: Path) -> None:
    """The packages the server imports and the test model's maker (a GPU machine's copy need not be a git tree)."""
    for name in ("engine", "policies", "sim", "experiments", "conf", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


async def client(base: str, args, stamps: dict) -> None:
    from experiments.http_replay import JSON_HEADERS, HttpTarget, open_pool
    session, url = open_pool(HttpTarget(base))
    for i in range(args.requests + args.warmup):
        prompt = [(7 * i + 3 * p) % (args.vocab_size - 1) + 1 for p in range(args.prompt_len)]
        body = json.dumps({"prompt": prompt, "max_tokens": 3, "ignore_eos": True, "temperature": 0.6, "stream": True,
                           "stream_options": {"include_usage": True}, "return_token_ids": True},
                          separators=(",", ":")).encode()
        sent = time.perf_counter()
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            async for raw in resp.content:
                line = raw.decode()
                if line.startswith("data: {") and '"token_ids"' in line:
                    t = time.perf_counter()
                    rid = json.loads(line[6:])["id"] + "-0"
                    if i >= args.warmup:
                        stamps.setdefault(rid, {"client_sent": sent, "client_read": t})
        await asyncio.sleep(args.gap_s)
    await session.close()


def report(stamps: dict) -> dict:
    keys = [k for k, d in stamps.items() if all(h in d for h in ORDER)]
    if not keys:
        raise SystemExit("error: no request has every stamp (see the server's log above)")
    hops = {}
    for a, b in zip(ORDER, ORDER[1:]):
        hops[f"{a} -> {b}"] = statistics.median((stamps[k][b] - stamps[k][a]) * 1e6 for k in keys)
    ttft = [(stamps[k]["client_read"] - stamps[k]["client_sent"]) * 1e6 for k in keys]
    inproc = [(stamps[k]["first_token"] - stamps[k]["admitted"]) * 1e6 for k in keys]
    over = sorted(t - i for t, i in zip(ttft, inproc))
    return {"num_requests": len(keys), "hop_median_us": hops, "client_ttft_us_p50": statistics.median(ttft),
            "admission_to_first_token_us_p50": statistics.median(inproc),
            "http_overhead_us_p50": statistics.median(over), "http_overhead_us_p90": over[int(0.9 * (len(over) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", help="checkpoint directory (default: a tiny random Qwen3 built in a temp dir)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prompt-len", type=int, default=400)
    ap.add_argument("--vocab-size", type=int, default=500, help="prompt token ids are drawn below this")
    ap.add_argument("--gap-s", type=float, default=0.03, help="pause between requests (the engine idles)")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: prompt length + 64")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="a servelab-serve override for the server, e.g. serve.spin_window_ms=0 (repeatable)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    bad = [a for a in args.serve_arg if "=" not in a]
    if bad:
        ap.error(f"--serve-arg {bad[0]!r}: give KEY=VALUE, e.g. serve.spin_window_ms=0")

    work = Path(tempfile.mkdtemp(prefix="serve_hops_"))
    try:
        copy = work / "tree"
        copy_tree(copy)
        instrument(copy)
        ckpt = args.model_path
        if ckpt is None:
            sys.path.insert(0, str(ROOT))
            from tests.engine.tiny_model import make_tiny_qwen3
            ckpt = str(work / "model")
            make_tiny_qwen3(ckpt)
        hops_dir = work / "hops"
        hops_dir.mkdir()
        path = os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))   # carried wheels stay found
        env = {**os.environ, "HOPS_DIR": str(hops_dir), "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        max_len = args.max_model_len or args.prompt_len + 64
        proc, base, _ = start_server([f"backend.model_path={ckpt}", f"backend.device={args.device}", "serve.port=0",
                                      f"max_model_len={max_len}", "serve.log_level=info", *args.serve_arg],
                                     copy, {**env, "PYTHONUNBUFFERED": "1"})
        stamps: dict = {}
        sys.path.insert(0, str(ROOT))
        try:
            import uvloop
            uvloop.run(client(base, args, stamps))
        except ImportError:
            asyncio.run(client(base, args, stamps))
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        for f in hops_dir.glob("*.json"):
            for k, d in json.loads(f.read_text()).items():
                stamps.setdefault(k, {}).update(d)
        out = report(stamps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["settings"] = {k: getattr(args, k) for k in ("device", "requests", "prompt_len", "gap_s", "serve_arg")}
    print(f"{out['num_requests']} streamed requests one at a time, {args.prompt_len}-token prompts, device "
          f"{args.device}{', ' + ' '.join(args.serve_arg) if args.serve_arg else ''}; median of each hop, "
          "microseconds:")
    for hop, us in out["hop_median_us"].items():
        print(f"  {hop:34s} {us:8.0f}   {WHAT.get(hop.split(' -> ')[1], '')}")
    print(f"client TTFT p50 {out['client_ttft_us_p50']:.0f} us; the engine's admission to its first token (what the "
          f"in-process replay counts) p50 {out['admission_to_first_token_us_p50']:.0f} us; HTTP overhead p50 "
          f"{out['http_overhead_us_p50']:.0f} us, p90 {out['http_overhead_us_p90']:.0f} us")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
