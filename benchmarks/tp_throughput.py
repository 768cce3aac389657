"""Tensor parallelism on 2 GPUs: tp=2 vs tp=1 logits on random Qwen3-0.6B, and Qwen3-8B throughput at
tp=2 beside the simulator's prediction (roofline cost model, tensor_parallel_size=2).

1. Equality: a random-weight Qwen3-0.6B checkpoint (float32 compute), the same greedy requests at
   tp=1 and tp=2; every step's logits are compared (max |difference|) and the greedy tokens must agree.
2. Throughput: Qwen3-8B (random weights, or --model-8b DIR for a real checkpoint), 256 requests with
   prompt and output lengths uniform in [100, 1024] (seeded), ignore_eos, all submitted at once, as in
   benchmarks/engine_throughput.py; output tokens/s at tp=2 (and tp=1 unless --skip-tp1). Beside it,
   the simulator runs the same requests through the engine's scheduler with the same KV cache size
   and the roofline cost model at tensor_parallel_size=2, plus the workload's roofline lower bound.

    python benchmarks/tp_throughput.py --out benchmarks/results/tp_h200x2.json
    python benchmarks/tp_throughput.py --sim-only             # the simulator's prediction alone (CPU)

Needs 2 GPUs of one host (NCCL; NVLink multicast stays off, see engine/collectives.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# Published configs (huggingface.co/Qwen/Qwen3-0.6B and Qwen3-8B, config.json).
QWEN3_0P6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                  rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6)
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
                rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2, help="tensor_parallel_size under test")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100, help="min prompt and output length (tokens)")
    p.add_argument("--max-len", type=int, default=1024, help="max prompt and output length (tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--equality-prompts", type=int, default=8, help="requests of the tp=2 vs tp=1 logits check")
    p.add_argument("--equality-tokens", type=int, default=32, help="greedy tokens per request in that check")
    p.add_argument("--logits-atol", type=float, default=1e-3, help="float32 logits tolerance of that check")
    p.add_argument("--model-8b", type=Path, default=None, help="a Qwen3-8B checkpoint dir (default: random weights)")
    p.add_argument("--skip-equality", action="store_true")
    p.add_argument("--skip-tp1", action="store_true", help="no tp=1 Qwen3-8B throughput run")
    p.add_argument("--sim-only", action="store_true", help="only the simulator's prediction (no GPU needed)")
    p.add_argument("--out", type=Path, default=None, help="JSON result file")
    return p.parse_args(argv)


def make_checkpoint(fields: dict, path: Path, dtype_name: str) -> None:
    """Random-weight Qwen3 checkpoint (transformers' default init), built on GPU 0, saved as safetensors."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    with torch.device("cuda:0"):
        model = Qwen3ForCausalLM(cfg).to(getattr(torch, dtype_name))
    model.save_pretrained(str(path), safe_serialization=True)
    del model
    torch.cuda.empty_cache()


def free_gpu_memory() -> None:
    """Releases a closed LLM's KV cache and weights before the next one sizes its cache from free memory."""
    import gc

    import torch
    gc.collect()
    torch.cuda.empty_cache()


class LogitsRecorder:
    """Wraps rank 0's sampler; keeps every step's logits on the host."""

    def __init__(self, sampler):
        self.sampler, self.logits = sampler, []

    def __call__(self, logits, tensors):
        self.logits.append(logits.float().cpu())
        return self.sampler(logits, tensors)


def equality(path: Path, args) -> dict:
    import numpy as np

    from engine.core.sequence import SamplingParams
    from engine.llm import LLM

    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, 10000, int(n)).tolist() for n in rng.integers(16, 512, args.equality_prompts)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.equality_tokens)
    runs = {}
    for tp in (1, args.tp):
        with LLM(path, dtype="float32", tensor_parallel_size=tp, max_model_len=1024, max_num_seqs=64,
                 gpu_memory_utilization=0.5, enforce_eager=args.enforce_eager) as llm:
            rec = llm.runner.sampler = LogitsRecorder(llm.runner.sampler)
            outs = llm.generate(prompts, params, use_tqdm=False)
            runs[tp] = ([o.token_ids for o in outs], rec.logits)
        del llm, rec
        free_gpu_memory()
    (tok1, log1), (tok2, log2) = runs[1], runs[args.tp]
    same_steps = len(log1) == len(log2) and all(a.shape == b.shape for a, b in zip(log1, log2))
    diff = max(float((a - b).abs().max()) for a, b in zip(log1, log2)) if same_steps else None
    agree = sum(a == b for x, y in zip(tok1, tok2) for a, b in zip(x, y)) / sum(map(len, tok1))
    return dict(equality_dtype="float32", equality_requests=len(prompts),
                equality_tokens_per_request=args.equality_tokens,
                equality_same_schedule=same_steps, max_abs_logit_diff=diff, greedy_token_agreement=agree,
                equality_passed=bool(same_steps and tok1 == tok2 and diff is not None and diff <= args.logits_atol))


def throughput(path: Path, args, tp: int, prompts, output_lens) -> dict:
    import torch

    from engine.core.sequence import SamplingParams
    from engine.llm import LLM

    max_model_len = 2 * args.max_len
    with LLM(path, dtype="bfloat16", tensor_parallel_size=tp, max_num_seqs=args.max_num_seqs,
             max_num_batched_tokens=max(args.max_num_batched_tokens, max_model_len), max_model_len=max_model_len,
             gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)        # warm-up
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=o) for o in output_lens]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        blocks, graphs = llm.runner.num_kvcache_blocks, bool(llm.runner.graphs)
    del llm
    free_gpu_memory()
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == sum(output_lens), "ignore_eos requests must produce exactly max_tokens tokens"
    return dict(output_tokens_per_s=produced / elapsed, elapsed_s=elapsed, output_tokens=produced,
                num_kvcache_blocks=blocks, cuda_graphs=graphs)


def simulate(args, tp: int, prompts, output_lens, num_kvcache_blocks: int) -> dict:
    """The simulator's prediction for the same requests and cache size, roofline cost model at `tp`."""
    from engine.core.scheduler import Scheduler, SchedulerConfig
    from engine.core.sequence import SamplingParams, Sequence
    from sim.cost_model.roofline import RooflineCostModel
    from sim.lower_bound import workload_lower_bound
    from sim.replica import Replica
    from sim.simulator import Simulator

    max_model_len = 2 * args.max_len
    sched = Scheduler(SchedulerConfig(num_kvcache_blocks=num_kvcache_blocks, block_size=16,
                                      max_num_seqs=args.max_num_seqs,
                                      max_num_batched_tokens=max(args.max_num_batched_tokens, max_model_len),
                                      max_model_len=max_model_len))
    cm = RooflineCostModel("Qwen3-8B", "H200", tensor_parallel_size=tp)
    seqs = [Sequence(i, p, SamplingParams(max_tokens=o, ignore_eos=True), arrival_time_s=0.0)
            for i, (p, o) in enumerate(zip(prompts, output_lens))]
    res = Simulator(Replica(sched, cm)).run(seqs)
    bound = workload_lower_bound([(len(p), o) for p, o in zip(prompts, output_lens)], "Qwen3-8B", "H200",
                                 tensor_parallel_size=tp, kv_capacity_tokens=16 * num_kvcache_blocks)
    out = sum(output_lens)
    return dict(sim_cost_model=repr(cm), sim_output_tokens_per_s=out / res.end_time_s, sim_elapsed_s=res.end_time_s,
                sim_num_kvcache_blocks=num_kvcache_blocks,
                roofline_lower_bound_tokens_per_s=out / bound.time_s)


def main(argv=None):
    args = parse_args(argv)
    from engine_throughput import emit, environment, make_workload

    prompts, output_lens = make_workload(args.num_requests, args.min_len, args.max_len, QWEN3_8B["vocab_size"],
                                         args.seed)
    result = dict(model="Qwen3-8B", tensor_parallel_size=args.tp, num_requests=args.num_requests,
                  min_len=args.min_len, max_len=args.max_len, seed=args.seed, prompt_tokens=sum(map(len, prompts)))
    if args.sim_only:
        from sim.specs import get_hardware_spec, get_model_spec
        from sim.specs.capacity import num_kv_blocks
        blocks = num_kv_blocks(get_model_spec("Qwen3-8B"), get_hardware_spec("H200"), 16,
                               args.gpu_memory_utilization, args.tp)
        result.update(simulate(args, args.tp, prompts, output_lens, blocks))
        print(json.dumps(result, indent=2))
        return
    import torch
    if torch.cuda.device_count() < args.tp:
        sys.exit(f"this benchmark needs {args.tp} GPUs of one host, found {torch.cuda.device_count()} "
                 f"(--sim-only gives the simulator's prediction without GPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_equality:
            small = Path(tmp) / "qwen3_0p6b"
            make_checkpoint(QWEN3_0P6B, small, "bfloat16")
            result.update(equality(small, args))
        big = args.model_8b
        if big is None:
            big = Path(tmp) / "qwen3_8b"
            make_checkpoint(QWEN3_8B, big, "bfloat16")
        tp_run = throughput(big, args, args.tp, prompts, output_lens)
        result.update({f"tp{args.tp}_{k}": v for k, v in tp_run.items()})
        if not args.skip_tp1:
            result.update({f"tp1_{k}": v for k, v in throughput(big, args, 1, prompts, output_lens).items()})
    result.update(simulate(args, args.tp, prompts, output_lens, tp_run["num_kvcache_blocks"]))
    result["measured_over_sim"] = tp_run["output_tokens_per_s"] / result["sim_output_tokens_per_s"]
    result.update(environment("cuda"))
    result["num_gpus"] = torch.cuda.device_count()
    emit(result, args.out)


if __name__ == "__main__":
    main()
