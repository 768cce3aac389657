"""servelab's engine against vLLM on nano-vllm's offline benchmark: same requests, same weights, same run (CUDA).

    python benchmarks/peer_vllm.py --out benchmarks/results/peer_vllm_h200.json      # vLLM importable
    PYTHONPATH=/tmp/vsite python benchmarks/peer_vllm.py --out ...                   # vLLM from ../shared/vllm-h200
    python benchmarks/peer_vllm.py --preset tiny --device cpu --engines servelab --num-requests 4 --max-len 32

One random-weight checkpoint (benchmarks/engine_throughput.make_checkpoint) and one workload
(engine_throughput.make_workload: 256 requests, prompt and output lengths uniform in [100, 1024],
temperature 0.6, ignore_eos, all submitted at once). Each engine runs in its own child process, one after
the other (each takes most of the GPU's memory), with the same limits: max_num_seqs 512,
max_num_batched_tokens 16,384, max_model_len 2 x max_len, gpu_memory_utilization 0.9; vLLM with its
defaults otherwise (V1 engine, torch.compile, CUDA graphs, FlashAttention, async scheduling). The order
is servelab, vLLM (--vllm-repeats times), servelab again (--repeats), so the ratio (each servelab run over the
vLLM runs' mean) comes with each side's run-to-run spread.
Prints and writes servelab / vLLM output tokens/s. A vLLM that does not import is reported, not raised:
the servelab side still lands.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_throughput as et  # noqa: E402
from peer_children import add_peer_arguments, child_main, parse_engines, run_child  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--overlap-scheduling", choices=["off", "on"], default="off", help="servelab's loop")
    p.add_argument("--repeats", type=int, default=2, help="servelab runs (first and last, vLLM between)")
    p.add_argument("--vllm-repeats", type=int, default=1, help="vLLM runs (between servelab's first and last)")
    add_peer_arguments(p)
    return p.parse_args(argv)


def workload(args):
    vocab = (et.QWEN3_0P6B if args.preset == "qwen3-0.6b" else et.TINY)["vocab_size"]
    return et.make_workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)


def child_servelab(args) -> dict:
    prompts, output_lens = workload(args)
    et_args = et.parse_args(["--preset", args.preset, "--device", args.device, "--max-len", str(args.max_len),
                             "--max-num-seqs", str(args.max_num_seqs),
                             "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                             "--gpu-memory-utilization", str(args.gpu_memory_utilization)])
    res = et.run_engine(args.model, et_args, prompts, output_lens, args.overlap_scheduling == "on")
    return dict(engine="servelab", **res)


def child_vllm(args) -> dict:
    import time

    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")   # FlashInfer is not carried
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts, output_lens = workload(args)
    t0 = time.perf_counter()
    llm = LLM(model=str(args.model), dtype="bfloat16", max_model_len=2 * args.max_len,
              gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, skip_tokenizer_init=True,
              generation_config="vllm", seed=args.seed)
    init_s = time.perf_counter() - t0
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4, detokenize=False),
                 use_tqdm=False)                                                   # warm-up, as servelab's
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=o, detokenize=False) for o in output_lens]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    return dict(engine="vllm", vllm=vllm.__version__, output_tokens_per_s=produced / elapsed, elapsed_s=elapsed,
                output_tokens=produced, init_s=init_s)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if child_main(args, {"servelab": child_servelab, "vllm": child_vllm}):
        return 0
    import torch

    engines = parse_engines(args.engines)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (or pass --preset tiny --device cpu --engines servelab)")
    prompts, output_lens = workload(args)
    result = dict(benchmark="nano-vllm offline", preset=args.preset, num_requests=args.num_requests,
                  min_len=args.min_len, max_len=args.max_len, seed=args.seed, prompt_tokens=sum(map(len, prompts)),
                  output_tokens=sum(output_lens), max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, overlap_scheduling=args.overlap_scheduling,
                  runs=[])
    order = []
    if "servelab" in engines:
        order.append("servelab")
    if "vllm" in engines:
        order += ["vllm"] * max(args.vllm_repeats, 1)
    if "servelab" in engines:
        order += ["servelab"] * max(args.repeats - 1, 0)
    with tempfile.TemporaryDirectory() as tmp:
        et.make_checkpoint(args.preset, Path(tmp), args.device, torch.bfloat16 if args.device != "cpu"
                           else torch.float32)
        for engine in order:
            run = run_child(__file__, engine, Path(tmp), argv)
            result["runs"].append(run)
            print(f"[{engine}] " + (f"{run['output_tokens_per_s']:,.0f} output tok/s" if "error" not in run
                                    else run["error"]), flush=True)
    ours = [r["output_tokens_per_s"] for r in result["runs"] if r["engine"] == "servelab" and "error" not in r]
    peer = [r["output_tokens_per_s"] for r in result["runs"] if r["engine"] == "vllm" and "error" not in r]
    if ours and peer:
        # each servelab run over the vLLM runs' mean; the spread of either side is in the runs
        result["servelab_over_vllm"] = [o / (sum(peer) / len(peer)) for o in ours]
        print("servelab / vLLM: " + ", ".join(f"{x:.3f}" for x in result["servelab_over_vllm"]))
    result.update(et.environment(args.device))
    result["roofline_tokens_per_s"] = et.roofline_tokens_per_s(prompts, output_lens, args.preset, result["gpu"])
    if ours and result["roofline_tokens_per_s"]:
        result["servelab_over_roofline"] = [o / result["roofline_tokens_per_s"] for o in ours]
    et.emit(result, args.out)
    return 0


if __name__ == "__main__":      # required: vLLM may spawn its engine-core process, which re-imports this file
    sys.exit(main())
