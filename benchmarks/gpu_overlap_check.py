"""Overlap scheduling on the GPU: its tokens against the synchronous loop's (docs/overlap.md).

The same engine (weights, CUDA graphs, KV cache) runs every case twice, synchronously and with
config.overlap_scheduling, each time on a fresh scheduler (so no run sees the other's prefix cache):

    exact cases (the two loops run the same batches, so the tokens must be identical):
      graphs     greedy, decode steps replayed from CUDA graphs (input ids gathered on the device)
      eager      the same with enforce_eager (a second engine)
      chunked    chunked prefill (decodes beside prefill chunks: the padded prefill graphs)
      prefix     two waves sharing a 200-token prefix (prefix-cache hits)
      seeded     temperature 0.8, a seed per request
    reported cases (finishing sequences change the batches, so bf16 batch-shape numerics may flip
    a near-tie of the random weights; the CPU tests hold these exact in float32):
      eos        greedy, ending on the most frequent output token of the graphs case
      recompute  a KV cache of 160 blocks: preemption by recompute
      swap       the same with preemption by swap
      chunked_no_prefill_graphs   chunked with the padded prefill graphs off (where a chunked difference
                 comes from)
    Every case also reports each loop's step count, the paths the steps ran (decode graph, padded prefill
    graph, eager) and the first step whose shape differs between the loops (none: the same batches).

    python benchmarks/gpu_overlap_check.py --model CKPT --out overlap_check.json   # exit 1 if an exact case differs
    python benchmarks/gpu_overlap_check.py --model tiny_ckpt --device cpu --num-requests 6   # smoke run
    python benchmarks/gpu_overlap_check.py --model CKPT --skip-eager      # without the second (eager) engine
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXACT = ("graphs", "eager", "chunked", "prefix", "seeded")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory (random-weight Qwen3-0.6B on the H200)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--max-len", type=int, default=384, help="longest prompt and output (tokens)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--skip-eager", action="store_true", help="leave out the eager case (a second engine)")
    return p.parse_args(argv)


def compare(sync, over) -> dict:
    """Requests whose tokens and finish reason agree, and the first that does not."""
    same = [a == b for a, b in zip(sync, over)]
    first = next((i for i, s in enumerate(same) if not s), None)
    where = None
    if first is not None:
        a, b = sync[first][0], over[first][0]
        where = dict(request=first, position=next((k for k, (x, y) in enumerate(zip(a, b)) if x != y),
                                                  min(len(a), len(b))), sync_len=len(a), overlap_len=len(b))
    return dict(num_requests=len(same), num_identical=sum(same), exact=all(same), first_difference=where)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from engine.core.scheduler import Scheduler
    from engine.core.sequence import SamplingParams
    from engine.llm import LLM
    from policies.scheduling.vllm import VLLMPolicy
    from policies.scheduling.vllm_swap import VLLMSwapPolicy

    rng = random.Random(0)
    n, hi = args.num_requests, args.max_len
    vocab = 500 if args.device == "cpu" else 10_000
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(8, hi))] for _ in range(n)]
    out_lens = [rng.randint(8, hi) for _ in range(n)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in out_lens]
    max_model_len = 2 * hi + 16

    base_config = {}        # each engine's own scheduler config: a case's cache size or chunking ends with it

    def build(**options) -> LLM:
        llm = LLM(args.model, device=args.device, max_num_seqs=64, max_model_len=max_model_len,
                  num_cpu_blocks=1024 if args.device != "cpu" else 256, **options)
        base_config[id(llm)] = llm.scheduler.config
        return llm

    def run(llm, waves, params, overlap, eos=None, policy=None, blocks=None, chunked=None):
        """One loop over `waves` (lists of prompts, generated one after the other) on a fresh scheduler."""
        cfg = base_config[id(llm)]
        cfg = replace(cfg, num_kvcache_blocks=blocks or cfg.num_kvcache_blocks,
                      enable_chunked_prefill=cfg.enable_chunked_prefill if chunked is None else chunked)
        llm.scheduler = Scheduler(cfg, policy=policy or VLLMPolicy())
        llm.config.overlap_scheduling = overlap         # the runner reads it at every launch
        llm.eos_token_id = eos
        shapes.clear()
        outs = []
        for wave, ps in zip(waves, params):
            outs += llm.generate(wave, ps, use_tqdm=False)
        bm = llm.scheduler.block_manager
        bm.check_invariants([])
        assert bm.num_used_blocks == 0, "blocks leaked"
        return [(o.token_ids, o.finish_reason) for o in outs]

    # each launched step's shape (entries, prefill entries, tokens, the path it runs: decode graph, padded
    # prefill graph or eager), to tell a numerics difference from a difference in the batches
    shapes: list[tuple] = []

    def record_shapes(llm):
        launch = llm.runner.launch

        def logged(batch):
            S, P = len(batch.seqs), batch.num_prefill_seqs
            T = sum(batch.num_new_tokens)
            path = ("decode_graph" if P == 0 and llm.runner._graph_size(S) else
                    "prefill_graph" if llm.runner.prefill_graphs and llm.runner.prefill_graphs.size_for(T) else "eager")
            shapes.append((S, P, T, path))
            return launch(batch)
        llm.runner.launch = logged

    def both(llm, *a, **k) -> tuple[list, dict]:
        t0 = time.perf_counter()
        sync = run(llm, *a, overlap=False, **k)
        sync_shapes = list(shapes)
        t1 = time.perf_counter()
        over = run(llm, *a, overlap=True, **k)
        res = compare(sync, over)
        first = next((i for i, (x, y) in enumerate(zip(sync_shapes, shapes)) if x != y), None)
        if first is None and len(sync_shapes) != len(shapes):
            first = min(len(sync_shapes), len(shapes))
        cfg = llm.scheduler.config
        res.update(num_kvcache_blocks=cfg.num_kvcache_blocks, chunked_prefill=cfg.enable_chunked_prefill,
                   num_steps=[len(sync_shapes), len(shapes)], first_step_shape_difference=None if first is None else
                   dict(step=first, sync=sync_shapes[first:first + 3], overlap=shapes[first:first + 3]),
                   paths=dict(Counter(p for *_, p in sync_shapes)))
        res.update(sync_s=t1 - t0, overlap_s=time.perf_counter() - t1,
                   finish_reasons=dict(Counter(r for _, r in over)))
        return sync, res

    cases = {}
    llm = build(overlap_scheduling=True)        # overlap's buffers exist; each run sets the loop
    record_shapes(llm)
    cases["graphs"] = dict(cuda_graphs=bool(llm.runner.graphs), prefill_graphs=llm.runner.prefill_graphs is not None)
    free_run, res = both(llm, [prompts], [greedy])
    cases["graphs"].update(res)
    base = prompts[0][:200] if len(prompts[0]) >= 200 else prompts[0]
    cases["prefix"] = both(llm, [[base], [base + p[:32] for p in prompts[1:]]],
                           [greedy[:1], greedy[1:]])[1]
    seeded = [SamplingParams(temperature=0.8, max_tokens=m, ignore_eos=True, seed=i) for i, m in enumerate(out_lens)]
    cases["seeded"] = both(llm, [prompts], [seeded])[1]
    eos = Counter(t for ids, _ in free_run for t in ids[4:]).most_common(1)[0][0]
    stop = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=False) for m in out_lens]
    cases["eos"] = both(llm, [prompts], [stop], eos=eos)[1]
    blocks = 160 if args.device != "cpu" else 24
    cases["recompute"] = both(llm, [prompts], [greedy], blocks=blocks)[1]
    cases["swap"] = both(llm, [prompts], [greedy], blocks=blocks, policy=VLLMSwapPolicy())[1]
    cases["chunked"] = both(llm, [prompts], [greedy], chunked=True)[1]
    # the same with the padded prefill graphs off (mixed steps eager): where a difference comes from
    graphs, llm.runner.prefill_graphs = llm.runner.prefill_graphs, None
    cases["chunked_no_prefill_graphs"] = both(llm, [prompts], [greedy], chunked=True)[1]
    llm.runner.prefill_graphs = graphs
    del llm, graphs
    gc.collect()                # the shape logger's closure holds the engine in a cycle: free its memory now
    if args.device != "cpu":
        torch.cuda.empty_cache()
    if not args.skip_eager:
        eager = build(overlap_scheduling=True, enforce_eager=True)
        record_shapes(eager)
        cases["eager"] = both(eager, [prompts], [greedy])[1]

    failed = [c for c in EXACT if c in cases and not cases[c]["exact"]]
    result = dict(device=torch.cuda.get_device_name() if args.device != "cpu" else "cpu", model=str(args.model),
                  num_requests=n, max_len=hi, cases=cases, exact_cases=list(EXACT), failed=failed, ok=not failed)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
