"""Offline engine throughput, nano-vllm's benchmark: Qwen3-0.6B architecture, random weights.

256 requests with prompt and output lengths uniform in [100, 1024] (seeded), ignore_eos, all
submitted at once; reports output tokens/s over the whole run. In the same run, transformers'
generate with static batches of 64 on the same checkpoint is the baseline (its tokens/s counts
each request's own output length; tokens a static batch generates past that are waste).

    python benchmarks/engine_throughput.py --out benchmarks/results/engine_throughput_h200.json
    python benchmarks/engine_throughput.py --hf-requests 64          # shorter baseline
    python benchmarks/engine_throughput.py --preset tiny --device cpu --num-requests 4 --max-len 32  # smoke run
    python benchmarks/engine_throughput.py --overlap-scheduling both --hf-requests 0   # synchronous, then with
                                    # overlap scheduling (docs/overlap.md): `overlap_on`, `overlap_speedup`
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Published Qwen3-0.6B config (huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json).
QWEN3_0P6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                  rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512, tie_word_embeddings=False, rope_theta=10000.0,
            max_position_embeddings=4096, rms_norm_eps=1e-6)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=["qwen3-0.6b", "tiny"], default="qwen3-0.6b", help="model architecture")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100, help="min prompt and output length (tokens)")
    p.add_argument("--max-len", type=int, default=1024, help="max prompt and output length (tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--overlap-scheduling", choices=["off", "on", "both"], default="off",
                   help="EngineConfig.overlap_scheduling; both: run off, then on (its figures under overlap_on)")
    p.add_argument("--hf-requests", type=int, default=None,
                   help="requests for the transformers baseline (default: all; 0 skips it)")
    p.add_argument("--hf-batch-size", type=int, default=64)
    p.add_argument("--out", type=Path, default=None, help="JSON result file")
    return p.parse_args(argv)


def make_checkpoint(preset: str, path: Path, device: str, dtype) -> None:
    """Random-weight checkpoint of the preset architecture (default init, std 0.02), saved as safetensors."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = dict(QWEN3_0P6B if preset == "qwen3-0.6b" else TINY)
    cfg = Qwen3Config(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    model.save_pretrained(str(path), safe_serialization=True)


def make_workload(n: int, lo: int, hi: int, vocab: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(lo, hi + 1, n)
    output_lens = rng.integers(lo, hi + 1, n)
    prompts = [rng.integers(0, min(vocab, 10000), int(k)).tolist() for k in prompt_lens]
    return prompts, [int(o) for o in output_lens]


def run_engine(path: Path, args, prompts, output_lens, overlap: bool = False) -> dict:
    import torch

    from engine.core.sequence import SamplingParams
    from engine.kernels.compile_log import CompileLog
    from engine.llm import LLM

    max_model_len = 2 * args.max_len
    llm = LLM(path, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=max(args.max_num_batched_tokens, max_model_len),
              max_model_len=max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
              enforce_eager=args.enforce_eager, overlap_scheduling=overlap)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)        # warm-up
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=o) for o in output_lens]
    sync = torch.cuda.synchronize if llm.runner.is_cuda else (lambda: None)
    rec = StepRecorder(llm)
    sync()
    with CompileLog() as compiles:      # a Triton compile inside the timed run stalls a step: none is expected
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        sync()
        elapsed = time.perf_counter() - t0
    rec.close()                         # the KV cache is freed on return
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == sum(output_lens), "ignore_eos requests must produce exactly max_tokens tokens"
    split = time_split(rec.steps)
    breakdown = dict(steps=len(rec.steps), **split, outside_steps_s=elapsed - split["prefill_s"] - split["decode_s"],
                     slowest_steps=slowest_steps(rec.steps, rec.launch_s))
    return dict(output_tokens_per_s=produced / elapsed, elapsed_s=elapsed, output_tokens=produced, time_split=breakdown,
                num_kvcache_blocks=llm.runner.num_kvcache_blocks, attention_backend=llm.runner.attn_backend.name,
                cuda_graphs=bool(llm.runner.graphs), dtype=str(llm.runner.dtype).removeprefix("torch."),
                overlap_scheduling=overlap, **compiles.summary())


def run_hf_baseline(path: Path, args, prompts, output_lens) -> dict:
    """transformers generate, static batches (left padded), each batch run to its longest output."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(args.device).eval()
    n = len(prompts) if args.hf_requests is None else min(args.hf_requests, len(prompts))
    useful = 0
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for s in range(0, n, args.hf_batch_size):
        ps, os_ = prompts[s:s + args.hf_batch_size], output_lens[s:s + args.hf_batch_size]
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=args.device)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=max(os_), min_new_tokens=max(os_),
                           do_sample=True, temperature=0.6, top_k=0, top_p=1.0, pad_token_id=0, eos_token_id=None)
        useful += sum(os_)
    sync()
    elapsed = time.perf_counter() - t0
    return dict(baseline_hf_tokens_per_s=useful / elapsed, baseline_hf_requests=n, baseline_hf_elapsed_s=elapsed)


class StepRecorder:
    """Records each step an LLM's generate() runs: `steps` (prefill tokens, seconds) and `launch_s`, the host seconds
    the step's call spent in the runner's launch(); on_batch(batch) sees each call's Batch (None when none ran).
    It wraps llm.step_batch and llm.runner.launch; close() drops the wrappers (an llm -> closure -> llm cycle)."""

    def __init__(self, llm, on_batch=None):
        self.steps: list[tuple[int, float]] = []
        self.launch_s: list[float] = []
        step, launch = llm.step_batch, llm.runner.launch
        in_launch = [0.0]

        def timed_launch(batch):
            t = time.perf_counter()
            try:
                return launch(batch)
            finally:
                in_launch[0] += time.perf_counter() - t

        def recorded_step():
            in_launch[0] = 0.0
            out = step()
            if llm.last_step is not None:
                self.steps.append((llm.last_step.num_prefill_tokens, llm.last_step.duration_s))
                self.launch_s.append(in_launch[0])
            if on_batch is not None:
                on_batch(out[0])
            return out
        self._llm = llm
        llm.step_batch, llm.runner.launch = recorded_step, timed_launch

    def clear(self) -> None:
        self.steps.clear()
        self.launch_s.clear()

    def close(self) -> None:
        del self._llm.step_batch, self._llm.runner.launch
        self._llm = None


def time_split(step_times) -> dict:
    """Prefill and decode steps' seconds and the longest step of a run, from (prefill tokens, seconds) per step (a
    first run's one-time costs show as a long step; its index counts from the run's first step)."""
    prefill = [d for p, d in step_times if p]
    longest = max(range(len(step_times)), key=lambda i: step_times[i][1], default=None)
    return dict(prefill_steps=len(prefill), prefill_s=sum(prefill), decode_s=sum(d for p, d in step_times if not p),
                longest_step_s=step_times[longest][1] if step_times else 0.0, longest_step_index=longest)


def slowest_steps(step_times, launch_s, k: int = 5) -> list[dict]:
    """The k longest steps, longest first: index, seconds, prefill tokens, and the host seconds that step's call
    spent launching (with overlap scheduling the call launches the next step before collecting this one). A stall
    spent launching is the host's (a compile, a first use); one that is not was spent waiting for the device."""
    order = sorted(range(len(step_times)), key=lambda i: -step_times[i][1])[:k]
    return [dict(index=i, seconds=step_times[i][1], prefill_tokens=step_times[i][0], launch_s=launch_s[i])
            for i in order]


def card_hardware(device_name: str | None):
    """The simulator's spec of the card torch names device_name; an H200's where none or an unknown one is named."""
    from sim.specs.hardware import get_hardware_spec, hardware_for_device_name
    return hardware_for_device_name(device_name) or get_hardware_spec("H200")


def roofline_bound(prompts, output_lens, device_name: str | None = None):
    """The simulator's roofline lower bound (sim.lower_bound.WorkloadBound) of this workload for Qwen3-0.6B on the
    card named (card_hardware)."""
    from sim.lower_bound import workload_lower_bound
    return workload_lower_bound([(len(p), o) for p, o in zip(prompts, output_lens)], "Qwen3-0.6B",
                                card_hardware(device_name))


def roofline_tokens_per_s(prompts, output_lens, preset: str, device_name: str | None = None) -> float | None:
    """Hook: the roofline lower bound's output tokens/s for this workload on the card named (roofline_bound)."""
    if preset != "qwen3-0.6b":
        return None
    try:
        bound = roofline_bound(prompts, output_lens, device_name)
        return float(bound.output_tokens / bound.time_s)
    except Exception as exc:       # the simulator is optional for this benchmark
        print(f"roofline bound unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def environment(device: str) -> dict:
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    # The caller's word first: a copied working tree may carry a stale .git
    commit = os.environ.get("SERVELAB_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                    check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = None
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else None
    return dict(gpu=gpu, torch=torch.__version__, triton=triton_version, commit=commit,
                command="python " + " ".join(shlex.quote(a) for a in sys.argv))


def emit(result: dict, out: Path | None, show: bool = True) -> None:
    """Prints the result (if show: the final one) and, with --out, writes it as JSON (each part as it comes)."""
    if show:
        print(json.dumps(result, indent=2))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")


def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU (or pass --preset tiny --device cpu for a smoke run)")
    vocab = (QWEN3_0P6B if args.preset == "qwen3-0.6b" else TINY)["vocab_size"]
    prompts, output_lens = make_workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
    result = dict(preset=args.preset, num_requests=args.num_requests, min_len=args.min_len, max_len=args.max_len,
                  seed=args.seed, prompt_tokens=sum(map(len, prompts)))
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(args.preset, Path(tmp), args.device, getattr(torch, args.dtype))
        result.update(run_engine(Path(tmp), args, prompts, output_lens, args.overlap_scheduling == "on"))
        emit(result, args.out, show=False)      # the engine's figure survives a failing baseline
        if args.device.startswith("cuda"):
            gc.collect()
            torch.cuda.empty_cache()
        if args.overlap_scheduling == "both":
            on = result["overlap_on"] = run_engine(Path(tmp), args, prompts, output_lens, True)
            result["overlap_speedup"] = on["output_tokens_per_s"] / result["output_tokens_per_s"]
            emit(result, args.out, show=False)
            if args.device.startswith("cuda"):
                gc.collect()
                torch.cuda.empty_cache()
        if args.hf_requests != 0:
            result.update(run_hf_baseline(Path(tmp), args, prompts, output_lens))
        else:
            result["baseline_hf_tokens_per_s"] = None
    result.update(environment(args.device))
    result["roofline_tokens_per_s"] = roofline_tokens_per_s(prompts, output_lens, args.preset, result["gpu"])
    emit(result, args.out)


if __name__ == "__main__":
    main()
