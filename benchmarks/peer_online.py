"""servelab's engine against vLLM online: one trace slice replayed in real time on each, both timed at a client.

    python benchmarks/peer_online.py --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv \
        --out benchmarks/results/peer_online_h200.json                    # CUDA; vLLM importable (PYTHONPATH)
    python benchmarks/peer_online.py --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv --preset tiny \
        --device cpu --engines servelab --max-requests 8 --rate-rps 20   # a CPU smoke run

The same requests for both (experiments.workloads.read_azure_trace: the first --max-requests rows rescaled to
--rate-rps, prompts from prompt_token_ids), the same random-weight checkpoint
(benchmarks/engine_throughput.make_checkpoint), temperature 0.6, ignore_eos. Each engine runs in a child
process of its own, one after the other, and is driven from an asyncio client in that process, which takes
every timestamp itself (time.perf_counter: submit, first token, finish):
  * servelab: the engine process `servelab-serve` runs (experiments/serve/engine_client.ProcessEngine: the
    engine core in its own process, ZeroMQ IPC), without the HTTP layer;
  * vLLM: AsyncLLM (its engine core in its own process too), with the same max_num_seqs, KV blocks
    (num_gpu_blocks_override) and max_model_len, FlashAttention, CUDA graphs.
Prints and writes each side's TTFT / TPOT / E2E p50 and p90 and output throughput, and servelab / vLLM for
each. The goal (the engine-speed work): TTFT p50 and TPOT p50 no worse than vLLM's. A vLLM that does not
import is recorded as its run's error.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_throughput as et  # noqa: E402
from peer_children import add_peer_arguments, child_main, parse_engines, run_child  # noqa: E402

METRICS = ("ttft_s", "tpot_s", "e2e_s")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="an Azure LLM inference trace CSV")
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--rate-rps", type=float, default=6.0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--num-kvcache-blocks", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384, help="vLLM's (servelab: its default)")
    p.add_argument("--overlap-scheduling", choices=["off", "on"], default="off",
                   help="servelab's loop (vLLM's async scheduling is on by its default)")
    add_peer_arguments(p)
    return p.parse_args(argv)


def requests(args):
    from experiments.workloads import prompt_token_ids, read_azure_trace
    vocab = (et.QWEN3_0P6B if args.preset == "qwen3-0.6b" else et.TINY)["vocab_size"]
    wl = read_azure_trace(str(args.trace), target_rate_rps=args.rate_rps, max_model_len=args.max_model_len,
                          max_requests=args.max_requests)
    return [(s, [int(t) for t in prompt_token_ids(s, vocab, args.seed)]) for s in wl]


def summarize(rows: list[dict], makespan_s: float) -> dict:
    import numpy as np
    out = dict(num_requests=len(rows), makespan_s=makespan_s,
               output_throughput_tps=sum(r["num_output_tokens"] for r in rows) / makespan_s)
    for k in METRICS:
        vals = [r[k] for r in rows if r[k] is not None]
        for q in (50, 90):
            out[f"{k}_p{q}"] = float(np.percentile(vals, q)) if vals else None
    return out


async def replay(reqs, submit) -> tuple[list[dict], float]:
    """submit(spec, ids) is an async iterator of token counts so far; every time is the client's."""
    rows = []

    async def one(spec, ids, t0):
        await asyncio.sleep(max(0.0, t0 + spec.arrival_time_s - time.perf_counter()))
        sent, first, n = time.perf_counter(), None, 0
        async for n in submit(spec, ids):
            if first is None and n > 0:
                first = time.perf_counter()
        fin = time.perf_counter()
        rows.append(dict(request_id=str(spec.request_id), ttft_s=None if first is None else first - sent,
                         e2e_s=fin - sent, tpot_s=(fin - first) / (n - 1) if first is not None and n > 1 else None,
                         num_prompt_tokens=len(ids), num_output_tokens=n))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(s, ids, t0) for s, ids in reqs))
    return rows, time.perf_counter() - t0


def drive(reqs, submit, start=None) -> tuple[list[dict], float]:
    """On a fresh event loop: start(loop) if given, one warm-up request (3 prompt tokens, 4 outputs), the replay."""
    async def main():
        if start is not None:
            start(asyncio.get_running_loop())
        if reqs:
            async for _ in submit(reqs[0][0], [1, 2, 3], max_tokens=4, rid="warm-up"):
                pass
        return await replay(reqs, submit)
    return asyncio.run(main())


def child_servelab(args) -> dict:
    from engine.core.sequence import SamplingParams
    from engine.llm import LLM
    from experiments.serve.engine_client import ProcessEngine
    from experiments.serve.metrics import ServerMetrics

    reqs = requests(args)
    factory = functools.partial(LLM, str(args.model), device=args.device, num_kvcache_blocks=args.num_kvcache_blocks,
                                max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                                overlap_scheduling=args.overlap_scheduling == "on")
    t0 = time.perf_counter()
    engine = ProcessEngine.launch(factory, log_level="warning")
    init_s = time.perf_counter() - t0
    engine.metrics = ServerMetrics("peer")

    async def submit(spec, ids, max_tokens=None, rid=None):
        params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=int(max_tokens or spec.num_output_tokens))
        queue: asyncio.Queue = asyncio.Queue()
        seq = engine.make_sequence(ids, params, rid or str(spec.request_id), time.perf_counter())
        engine.submit([(0, seq)], queue)
        n = 0
        while True:
            _, new, reason, error = await queue.get()
            if error is not None:
                raise RuntimeError(f"request {spec.request_id}: {error}")
            n += len(new)
            yield n
            if reason is not None:
                return

    try:
        rows, makespan = drive(reqs, submit, engine.start)
    finally:
        engine.close()
    return dict(engine="servelab", overlap_scheduling=args.overlap_scheduling == "on", init_s=init_s,
                **summarize(rows, makespan))


def child_vllm(args) -> dict:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # FlashInfer is not carried
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    reqs = requests(args)
    t0 = time.perf_counter()
    eng = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(args.model), dtype="bfloat16", max_model_len=args.max_model_len, gpu_memory_utilization=0.9,
        skip_tokenizer_init=True, generation_config="vllm", seed=args.seed,
        num_gpu_blocks_override=args.num_kvcache_blocks, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, disable_log_stats=True))
    init_s = time.perf_counter() - t0

    async def submit(spec, ids, max_tokens=None, rid=None):
        sp = SamplingParams(temperature=0.6, ignore_eos=True, detokenize=False,
                            max_tokens=int(max_tokens or spec.num_output_tokens))
        async for o in eng.generate(TokensPrompt(prompt_token_ids=ids), sp, request_id=rid or str(spec.request_id)):
            yield len(o.outputs[0].token_ids)

    try:
        rows, makespan = drive(reqs, submit)
    finally:
        eng.shutdown()
    return dict(engine="vllm", vllm=vllm.__version__, init_s=init_s, **summarize(rows, makespan))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if child_main(args, {"servelab": child_servelab, "vllm": child_vllm}):
        return 0
    import torch

    engines = parse_engines(args.engines)
    if not args.trace.is_file():
        raise SystemExit(f"--trace {args.trace}: no such file (the Azure conversation trace is in ../shared/traces/)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (or pass --preset tiny --device cpu --engines servelab)")
    result = dict(benchmark="online replay, timed at a client", trace=args.trace.name,
                  max_requests=args.max_requests, rate_rps=args.rate_rps, max_model_len=args.max_model_len,
                  num_kvcache_blocks=args.num_kvcache_blocks, max_num_seqs=args.max_num_seqs, runs=[])
    with tempfile.TemporaryDirectory() as tmp:
        et.make_checkpoint(args.preset, Path(tmp), args.device,
                           torch.bfloat16 if args.device != "cpu" else torch.float32)
        for engine in engines:
            run = run_child(__file__, engine, Path(tmp), argv)
            result["runs"].append(run)
            line = run.get("error") or (f"TTFT p50 {run['ttft_s_p50'] * 1e3:.1f} ms, TPOT p50 "
                                        f"{run['tpot_s_p50'] * 1e3:.2f} ms, {run['output_throughput_tps']:,.0f} tok/s")
            print(f"[{engine}] {line}", flush=True)
    ok = {r["engine"]: r for r in result["runs"] if "error" not in r}
    if {"servelab", "vllm"} <= set(ok):
        ours, peer = ok["servelab"], ok["vllm"]
        result["servelab_over_vllm"] = {k: ours[k] / peer[k] for k in ours
                                        if k.endswith(("_p50", "_p90", "_tps")) and peer.get(k)}
        print("servelab / vLLM: " + ", ".join(f"{k} {v:.3f}" for k, v in result["servelab_over_vllm"].items()))
    result.update(et.environment(args.device))
    et.emit(result, args.out)
    return 0


if __name__ == "__main__":      # required: both engines spawn processes, which re-import this file
    sys.exit(main())
