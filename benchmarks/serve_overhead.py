"""What the HTTP path costs: the same requests in process (LLM.generate) and through servelab-serve.

    python benchmarks/serve_overhead.py                                  # the tiny CPU model, 256 x 64 tokens
    python benchmarks/serve_overhead.py --model-path ~/models/Qwen3-0.6B --device cuda --requests 256 \
        --prompt-len 512 --output-len 256
    python benchmarks/serve_overhead.py --no-stream                       # whole completions instead of SSE
    python benchmarks/serve_overhead.py --engine thread                   # one layout only (default: both)

All requests are sent at once (greedy, ignore_eos, token-id prompts), first to an in-process LLM,
then, after the in-process engine is gone, to a server started as `python -m experiments.serve`
with the same engine options, from asyncio clients in this process (one connection each): once with
the engine in a thread of the server's process (serve.engine_process=false), once in its own process
(the default). It prints the wall times and output tokens/s, and the server's CPU seconds per 1,000
output tokens: the engine's (its thread, or its process) and the HTTP side's (HTTP, JSON,
detokenization; read from /proc, Linux only). In a thread both share one GIL, so the HTTP side's
seconds are added to an engine step's host time; in a process they run beside it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")      # utime + stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", help="checkpoint directory (default: a tiny random Qwen3 built in a temp dir)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--num-kvcache-blocks", type=int, default=None)
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--engine", choices=("both", "thread", "process"), default="both",
                    help="where the server's engine steps (default: both, one server after the other)")
    args = ap.parse_args()

    ckpt = args.model_path
    if ckpt is None:
        from tests.engine.tiny_model import make_tiny_qwen3
        ckpt = tempfile.mkdtemp(prefix="serve_overhead_")
        make_tiny_qwen3(ckpt)
    max_len = args.prompt_len + args.output_len + 16
    blocks = args.num_kvcache_blocks or args.requests * (-(-max_len // 16))
    opts = dict(device=args.device, max_num_seqs=args.max_num_seqs, num_kvcache_blocks=blocks,
                max_model_len=max_len)
    prompts = [[(7 * i + 3 * p) % 500 + 1 for p in range(args.prompt_len)] for i in range(args.requests)]
    total = args.requests * args.output_len

    from engine.core.sequence import SamplingParams
    from engine.llm import LLM
    llm = LLM(ckpt, **opts)
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:8], sp, use_tqdm=False)            # warm-up (compilation, graphs)
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    inproc = time.perf_counter() - t0
    llm.close()
    del llm

    overrides = [f"backend.model_path={ckpt}", f"backend.device={args.device}", "serve.port=0",
                 "serve.log_level=info", f"max_num_seqs={args.max_num_seqs}", f"num_kvcache_blocks={blocks}",
                 f"max_model_len={max_len}", "swap_space_gib=0"]
    print(f"{args.requests} requests x {args.prompt_len} prompt + {args.output_len} output tokens, "
          f"device {args.device}, {'streaming' if not args.no_stream else 'whole completions'}")
    print(f"in process          {inproc:8.3f} s  {total / inproc:10.0f} output tok/s")
    layouts = ("thread", "process") if args.engine == "both" else (args.engine,)
    for layout in layouts:
        wall, engine_cpu, http_cpu = serve(overrides + [f"serve.engine_process={layout == 'process'}"], prompts,
                                           args.output_len, not args.no_stream, total)
        per_k = 1000 / total
        print(f"over HTTP, {layout:7s}  {wall:8.3f} s  {total / wall:10.0f} output tok/s  "
              f"({wall / inproc:.2f}x the wall time); server CPU per 1,000 output tokens: engine "
              f"{engine_cpu * per_k:.3f} s, HTTP side {http_cpu * per_k:.3f} s")


def start_server(overrides, cwd, env, watch: dict | None = None) -> tuple[subprocess.Popen, str, dict]:
    """Starts `python -m experiments.serve *overrides` and waits for uvicorn's start line: (the process, its base
    URL http://host:port, {name: the first group of watch[name]'s regex, from a line before it}). Its output is
    drained in a thread from then on."""
    proc = subprocess.Popen([sys.executable, "-m", "experiments.serve", *overrides],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base, seen, lines = None, {}, []
    for line in proc.stdout:
        lines.append(line)
        for name, pattern in (watch or {}).items():
            if name not in seen and (found := re.search(pattern, line)):
                seen[name] = found.group(1)
        found = re.search(r"Uvicorn running on (http://[\d.]+:\d+)", line)
        if found:
            base = found.group(1)
            break
    if base is None:
        raise SystemExit("the server did not start:\n" + "".join(lines[-20:]))
    threading.Thread(target=proc.stdout.read, daemon=True).start()     # keep its pipe drained
    return proc, base, seen


def serve(overrides, prompts, output_len: int, stream: bool, total: int) -> tuple[float, float, float]:
    """(wall seconds, engine CPU seconds, HTTP side CPU seconds) of the timed run against a fresh server."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc, base, seen = start_server(overrides, ROOT, env, watch={
        "tid": r"engine thread running \(native thread id (\d+)\)", "pid": r"engine process running \(pid (\d+)\)"})
    tid = int(seen["tid"]) if "tid" in seen else None
    engine_pid = int(seen["pid"]) if "pid" in seen else None

    import httpx

    async def one(client, prompt) -> int:
        body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
                "stream": stream, "stream_options": {"include_usage": True}}
        if not stream:
            r = await client.post(f"{base}/v1/completions", json=body)
            return r.json()["usage"]["completion_tokens"]
        n = 0
        async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    n = json.loads(line[6:])["usage"]["completion_tokens"]
        return n

    async def run(ps) -> tuple[float, int]:
        limits = httpx.Limits(max_connections=len(ps) + 8, max_keepalive_connections=len(ps) + 8)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            t = time.perf_counter()
            done = await asyncio.gather(*[one(client, p) for p in ps])
            return time.perf_counter() - t, sum(done)

    def cpu() -> tuple[float, float]:
        """(engine, HTTP side) CPU seconds so far."""
        server = cpu_seconds(proc.pid)
        if engine_pid is not None:
            return cpu_seconds(engine_pid), server
        engine = cpu_seconds(proc.pid, tid) if tid else 0.0
        return engine, server - engine

    asyncio.run(run(prompts[:8]))                               # warm-up
    e0, h0 = cpu()
    wall, got = asyncio.run(run(prompts))
    e1, h1 = cpu()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert got == total, f"server produced {got} tokens, expected {total}"
    return wall, e1 - e0, h1 - h0


if __name__ == "__main__":
    main()
