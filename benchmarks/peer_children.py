"""The child processes of the peer benchmarks (peer_vllm.py, peer_online.py): one engine each, one after the other.

    engines = parse_engines(args.engines)                  # ["servelab", "vllm"], refusing an unknown name
    if child_main(args, {"servelab": child_servelab, "vllm": child_vllm}): return   # in a child
    run = run_child(__file__, "vllm", model_dir, argv)     # the script again with --child vllm --model DIR
A child prints its result as one JSON line; a child that fails (vLLM not importable, an engine error) gives
{"engine": ..., "error": "exit N: <its last stderr line>"}, never an exception: the other side still lands.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ENGINES = ("servelab", "vllm")


def add_peer_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments both peer benchmarks take: the model preset, device, seed, engines, output file, and the
    hidden ones run_child gives a child."""
    p.add_argument("--preset", choices=["qwen3-0.6b", "tiny"], default="qwen3-0.6b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default="servelab,vllm", help="comma list of " + ", ".join(ENGINES))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)


def parse_engines(text: str) -> list[str]:
    engines = [e.strip() for e in text.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"--engines: unknown {unknown}; give a comma list of {', '.join(ENGINES)}")
    return engines


def run_child(script: str | Path, engine: str, model: Path, argv: list[str]) -> dict:
    """`script` run with the parent's arguments plus --child ENGINE --model MODEL, in a fresh interpreter (its GPU
    memory is freed on exit); its last JSON line, or the error."""
    cmd = [sys.executable, str(Path(script).resolve()), *argv, "--child", engine, "--model", str(model)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stderr[-4000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return dict(engine=engine, error=f"exit {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def child_main(args, children: dict) -> bool:
    """In a child (args.child set): run children[args.child](args), print its JSON line, return True."""
    if not args.child:
        return False
    print(json.dumps(children[args.child](args)))
    return True
