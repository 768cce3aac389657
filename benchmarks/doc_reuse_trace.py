"""A Mooncake-format trace whose prompts reuse a few long documents: the prefix cache's CPU tier at work.

    python benchmarks/doc_reuse_trace.py --out docs.jsonl [--docs 32] [--doc-blocks 7] [--requests 300]
        [--rate-rps 4] [--seed 0]

Each request asks a question (60 tokens, its own hash block) about one of `docs` documents of
doc-blocks x 512 tokens (the trace's prefix-hash blocks, shared by every request on that document),
chosen uniformly at random; Poisson arrivals at rate-rps; outputs of 16 tokens. The documents' working
set (docs x doc-blocks x 512 tokens) is meant to exceed the GPU prefix cache and fit in the CPU tier,
so requests hit the tier for their whole document. The lines are what
experiments.workloads.read_mooncake_trace reads (timestamp ms, input_length, output_length, hash_ids).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

BLOCK_TOKENS = 512          # the Mooncake trace's prefix-hash block
QUESTION_TOKENS = 60
OUTPUT_TOKENS = 16


def lines(docs: int, doc_blocks: int, requests: int, rate_rps: float, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    t_ms = np.cumsum(rng.exponential(1000.0 / rate_rps, size=requests))
    which = rng.integers(0, docs, size=requests)
    out = []
    for i, (t, d) in enumerate(zip(t_ms, which)):
        ids = [int(d) * doc_blocks + j for j in range(doc_blocks)] + [docs * doc_blocks + i]
        out.append(json.dumps({"timestamp": int(t), "input_length": doc_blocks * BLOCK_TOKENS + QUESTION_TOKENS,
                               "output_length": OUTPUT_TOKENS, "hash_ids": ids}))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--doc-blocks", type=int, default=7)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate-rps", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for name in ("docs", "doc_blocks", "requests"):
        if getattr(a, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not a.rate_rps > 0:
        raise SystemExit(f"error: --rate-rps must be > 0, got {a.rate_rps}")
    with open(a.out, "w") as f:
        f.write("\n".join(lines(a.docs, a.doc_blocks, a.requests, a.rate_rps, a.seed)) + "\n")
    print(f"{a.requests} requests on {a.docs} documents of {a.doc_blocks * BLOCK_TOKENS} tokens -> {a.out}")


if __name__ == "__main__":
    main()
