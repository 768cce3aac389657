"""Check and time the fused q/k-norm + RoPE + KV-store kernel (engine/kernels/qk_norm_rope_store.py) on a CUDA
GPU against the unfused path it replaces; writes one JSON file. About 2-3 minutes on one H200.

    python benchmarks/gpu_fused_qkv.py --out benchmarks/results/gpu_fused_qkv_h200.json
    TRITON_INTERPRET=1 python benchmarks/gpu_fused_qkv.py --smoke --out /tmp/fused.json   # CPU smoke run, tiny sizes

1. check: Qwen3-0.6B's attention shapes (16 q heads, 8 KV heads, head_dim 128, bf16, block size 16), T tokens at
   random positions with distinct slots and some padding slots (-1), with and without the q/k norm. Fused against
   the unfused path the engine runs (torch.compile'd engine/layers/fused.py + the Triton store kernel) and the
   eager one, in steps of 2^-7 of each head's largest value (bf16 rounding: a few steps), plus both against the
   same computation in float32 (max |out - ref32| / max |ref32|); the caches must be written at the same slots.
2. kernel_us: microseconds per call of each path inside a CUDA graph (20 calls per graph, as the 28 layers of a
   decode graph replay them), T = 1, 8, 64, 256, 512, with and without the norm; kernels per call counted by
   torch.profiler on an eager call.
3. engine_decode: the engine (random-weight Qwen3-0.6B, triton attention backend, CUDA graphs) with
   fused_qk_norm_rope_store off and on, decode steps at batch 1, 16, 256 (prompts of 256 tokens): median step
   wall time (LLM.last_step) and median GPU time of ModelRunner.execute (CUDA events); kernels in one replay of
   the batch-1 decode graph (torch.profiler).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                   # run from a checkout without installing

import torch  # noqa: E402

QWEN3_HEADS = (16, 8, 128)                      # (Hq, Hkv, D) of Qwen3-0.6B
TOKENS = [1, 8, 64, 256, 512]
BATCHES = [1, 16, 256]
CALLS_PER_GRAPH = 20
BLOCK_SIZE = 16
MAX_POSITIONS = 40960


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_fused_qkv.json"))
    p.add_argument("--iters", type=int, default=50, help="graph replays per timing (default: %(default)s)")
    p.add_argument("--decode-steps", type=int, default=40, help="output tokens per engine request")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--smoke", action="store_true",
                   help="CPU (TRITON_INTERPRET=1), tiny model and sizes, no graphs: checks that the script runs")
    p.add_argument("--skip-engine", action="store_true", help="only the kernel check and timing")
    return p.parse_args(argv)


def make_inputs(T: int, heads, dtype, device, seed: int, num_padding: int):
    """qkv [T, (Hq + 2 Hkv) D], positions [T], distinct slots [T] with num_padding of them -1, NaN caches."""
    hq, hkv, d = heads
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g).to(device=device, dtype=dtype)
    positions = torch.randint(0, 4096, (T,), generator=g).to(device)
    num_blocks = T // BLOCK_SIZE + 4
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:T]
    slots[torch.randperm(T, generator=g)[:num_padding]] = -1
    caches = [torch.full((num_blocks, BLOCK_SIZE, hkv, d), float("nan"), dtype=dtype, device=device)
              for _ in range(2)]
    qw = (1.0 + 0.3 * torch.randn(d, generator=g)).to(device=device, dtype=dtype)
    kw = (1.0 + 0.3 * torch.randn(d, generator=g)).to(device=device, dtype=dtype)
    return qkv, positions, slots.to(device), caches, qw, kw


def rel_error(out, ref32) -> float:
    return float((out.float() - ref32).abs().max() / ref32.abs().max())


def check(device, tokens, rotary) -> list[dict]:
    from engine.kernels.qk_norm_rope_store import qk_norm_rope_store
    from engine.kernels.store_kvcache import store_kvcache
    from engine.layers import fused
    from engine.layers.attention_backends.torch_backend import store_kvcache_torch
    from tests.engine.qkv_cases import bf16_steps, unfused_qk_norm_rope_store
    heads, rows = QWEN3_HEADS, []
    # the eager unfused path, then the torch.compile'd one the engine runs on CUDA (no compiler needed on CPU)
    unfused_paths = ("eager", "compiled") if device.type == "cuda" else ("eager",)
    for norm in (True, False):
        for T in tokens:
            qkv, pos, slots, caches, qw, kw = make_inputs(T, heads, torch.bfloat16, device, T, T // 4)
            qw, kw = (qw, kw) if norm else (None, None)
            row = dict(T=T, qk_norm=norm)
            try:
                kept = slots >= 0
                outs = {}
                kf, vf = (c.clone() for c in caches)
                outs["fused"] = (qk_norm_rope_store(qkv, 16, 8, pos, rotary.cos_sin, kf, vf, slots, qw, kw, 1e-6),
                                 kf, vf)
                for name in unfused_paths:
                    if name == "compiled":
                        fused.enable_compile()          # last: compiled once, as the engine then uses it
                    ku, vu = (c.clone() for c in caches)
                    q_u = unfused_qk_norm_rope_store(qkv, heads, pos, rotary.cos_sin, ku, vu, slots, qw, kw, 1e-6,
                                                     store_kvcache)
                    outs[name] = (q_u, ku, vu)
                k32, v32 = (c.float() for c in caches)
                q32 = unfused_qk_norm_rope_store(qkv.float(), heads, pos, rotary.cos_sin, k32, v32, slots,
                                                 None if qw is None else qw.float(),
                                                 None if kw is None else kw.float(), 1e-6, store_kvcache_torch)
                kv32 = k32.view(-1, 8, 128)[slots[kept]]
                q_f, k_f, v_f = outs["fused"]
                for name in unfused_paths:
                    q_u, k_u, v_u = outs[name]
                    row[f"q_steps_vs_{name}"] = bf16_steps(q_f, q_u)
                    row[f"k_steps_vs_{name}"] = bf16_steps(k_f.view(-1, 8, 128)[slots[kept]],
                                                           k_u.view(-1, 8, 128)[slots[kept]])
                    row[f"same_slots_written_as_{name}"] = bool(torch.equal(k_f.isnan(), k_u.isnan())
                                                                and torch.equal(v_f.isnan(), v_u.isnan()))
                    row[f"v_equal_{name}"] = bool(torch.equal(v_f.nan_to_num(0), v_u.nan_to_num(0)))
                for name, (q_x, k_x, _) in outs.items():
                    row[f"q_rel_err_vs_fp32_{name}"] = rel_error(q_x, q32)
                    row[f"k_rel_err_vs_fp32_{name}"] = rel_error(k_x.view(-1, 8, 128)[slots[kept]], kv32)
                row["ok"] = (row["q_steps_vs_eager"] <= 4 and row["k_steps_vs_eager"] <= 4
                             and row["same_slots_written_as_eager"] and row["v_equal_eager"])
            except Exception:
                row.update(ok=False, error=traceback.format_exc(limit=3))
            print("check", row, flush=True)
            rows.append(row)
    return rows


def kernels_per_call(fn) -> int | None:
    """CUDA kernels one eager call launches (torch.profiler)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:
        return None


def time_per_call_us(fn, cuda: bool, iters: int) -> float:
    """Microseconds per call: CALLS_PER_GRAPH calls captured in one CUDA graph, replayed `iters` times."""
    for _ in range(3):
        fn()
    if not cuda:
        t = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / (iters * CALLS_PER_GRAPH)


def kernel_times(device, tokens, rotary, iters) -> list[dict]:
    from engine.kernels.qk_norm_rope_store import qk_norm_rope_store
    from engine.kernels.store_kvcache import store_kvcache
    from engine.layers import fused
    from tests.engine.qkv_cases import unfused_qk_norm_rope_store
    cuda = device.type == "cuda"
    if cuda:
        fused.enable_compile()          # the unfused path as the engine runs it on CUDA
    heads, rows = QWEN3_HEADS, []
    for norm in (True, False):
        for T in tokens:
            qkv, pos, slots, (kc, vc), qw, kw = make_inputs(T, heads, torch.bfloat16, device, T, 0)
            qw, kw = (qw, kw) if norm else (None, None)
            paths = {
                "fused": lambda: qk_norm_rope_store(qkv, 16, 8, pos, rotary.cos_sin, kc, vc, slots, qw, kw, 1e-6),
                "unfused": lambda: unfused_qk_norm_rope_store(qkv, heads, pos, rotary.cos_sin, kc, vc, slots, qw, kw,
                                                              1e-6, store_kvcache),
            }
            row = dict(T=T, qk_norm=norm)
            try:
                for name, fn in paths.items():
                    row[f"{name}_us"] = time_per_call_us(fn, cuda, iters)
                    row[f"{name}_kernels"] = kernels_per_call(fn) if cuda else None
                row["speedup"] = row["unfused_us"] / row["fused_us"]
            except Exception:
                row["error"] = traceback.format_exc(limit=3)
            print("kernel", row, flush=True)
            rows.append(row)
    return rows


def engine_decode(path, args, device, batches) -> list[dict]:
    from engine.core.sequence import SamplingParams
    from engine.llm import LLM
    cuda = device.type == "cuda"
    rows, tokens_by_flag = [], {}
    max_len = args.prompt_len + args.decode_steps
    blocks = max(batches) * -(-max_len // BLOCK_SIZE) + 64
    for flag in (False, True):
        llm = None
        try:
            llm = LLM(path, device=device.type, dtype="bfloat16" if cuda else "float32", attention_backend="triton",
                      fused_qk_norm_rope_store=flag, max_num_seqs=max(batches), max_model_len=max_len,
                      num_kvcache_blocks=blocks, prefill_graph_max_tokens=0,
                      max_num_batched_tokens=max(8192, max_len))
            execute, gpu_ms = llm.runner.execute, []

            def timed_execute(batch, execute=execute, gpu_ms=gpu_ms):
                if not cuda:
                    return execute(batch)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                out = execute(batch)
                e1.record()
                e1.synchronize()
                gpu_ms.append(e0.elapsed_time(e1))
                return out
            llm.runner.execute = timed_execute
            if cuda and 1 in llm.runner.graphs:
                rows.append(dict(fused_qk_norm_rope_store=flag,
                                 kernels_per_decode_graph_b1=kernels_per_call(llm.runner.graphs[1].replay)))
                print("engine", rows[-1], flush=True)
            g = torch.Generator().manual_seed(0)
            for b in batches:
                prompts = torch.randint(0, min(10000, llm.vocab_size), (b, args.prompt_len), generator=g).tolist()
                params = SamplingParams(max_tokens=args.decode_steps, temperature=0.0, ignore_eos=True)
                for p in prompts:
                    llm.add_request(p, params)
                walls, gpus = [], []
                outs = []
                while llm.has_unfinished():
                    del gpu_ms[:]
                    outs += llm.step()
                    s = llm.last_step
                    if s is not None and s.num_prefill_tokens == 0 and s.num_seqs == b:
                        walls.append(1e3 * s.duration_s)
                        if gpu_ms:
                            gpus.append(gpu_ms[-1])
                tokens_by_flag.setdefault(b, {})[flag] = [o.token_ids for o in sorted(outs, key=lambda o: o.request_id)]
                row = dict(batch=b, fused_qk_norm_rope_store=flag, decode_steps=len(walls),
                           step_ms_median=statistics.median(walls) if walls else None,
                           gpu_ms_median=statistics.median(gpus) if gpus else None,
                           cuda_graphs=bool(llm.runner.graphs))
                print("engine", row, flush=True)
                rows.append(row)
        except Exception:
            rows.append(dict(fused_qk_norm_rope_store=flag, error=traceback.format_exc(limit=5)))
            print(rows[-1]["error"], flush=True)
        finally:
            if llm is not None:
                llm.runner.execute = None
                llm.close()
            del llm
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    for b, by_flag in tokens_by_flag.items():      # random weights: near-flat logits, so only roughly the same
        if len(by_flag) == 2:
            pairs = [(x, y) for a, c in zip(by_flag[False], by_flag[True]) for x, y in zip(a, c)]
            rows.append(dict(batch=b, greedy_tokens_identical_fraction=sum(x == y for x, y in pairs) / len(pairs)))
    return rows


def summarize(result) -> dict:
    kernels = {(r["T"], r["qk_norm"]): r for r in result["kernel_us"] if "speedup" in r}
    engine = {(r["batch"], r["fused_qk_norm_rope_store"]): r for r in result["engine_decode"]
              if r.get("step_ms_median") is not None}
    graph_kernels = {r["fused_qk_norm_rope_store"]: r["kernels_per_decode_graph_b1"] for r in result["engine_decode"]
                     if "kernels_per_decode_graph_b1" in r}
    out = dict(checks_ok=all(r.get("ok") for r in result["check"]),
               kernel_speedup_qk_norm={T: r["speedup"] for (T, n), r in kernels.items() if n})
    if len(graph_kernels) == 2:
        out["kernels_per_decode_graph_b1_off_on"] = [graph_kernels[False], graph_kernels[True]]
    for b in sorted({b for b, _ in engine}):
        if (b, False) in engine and (b, True) in engine:
            off, on = engine[(b, False)], engine[(b, True)]
            out[f"decode_b{b}_step_ms_off_on"] = [off["step_ms_median"], on["step_ms_median"]]
            if off["gpu_ms_median"] and on["gpu_ms_median"]:
                out[f"decode_b{b}_gpu_ms_off_on"] = [off["gpu_ms_median"], on["gpu_ms_median"]]
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
        tokens, batches = [1, 8], [1, 2]
        args.prompt_len, args.decode_steps = min(args.prompt_len, 16), min(args.decode_steps, 4)
    else:
        if not torch.cuda.is_available():
            sys.exit("this script needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1 on CPU)")
        device, tokens, batches = torch.device("cuda"), TOKENS, BATCHES
    from benchmarks.engine_throughput import environment, make_checkpoint
    from engine.layers.rotary import RotaryEmbedding
    t0 = time.perf_counter()
    rotary = RotaryEmbedding(128, MAX_POSITIONS, 1e6).to(device)
    result = dict(environment=environment(device.type), heads=QWEN3_HEADS, block_size=BLOCK_SIZE,
                  calls_per_graph=CALLS_PER_GRAPH)
    result["check"] = check(device, tokens, rotary)
    result["kernel_us"] = kernel_times(device, tokens, rotary, args.iters)
    result["engine_decode"] = []
    if not args.skip_engine:
        with tempfile.TemporaryDirectory() as tmp:
            make_checkpoint("tiny" if args.smoke else "qwen3-0.6b", Path(tmp), device.type,
                            torch.bfloat16 if device.type == "cuda" else torch.float32)
            result["engine_decode"] = engine_decode(tmp, args, device, batches)
    result["summary"] = summarize(result)
    result["wall_s"] = time.perf_counter() - t0
    print(json.dumps(result["summary"], indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
