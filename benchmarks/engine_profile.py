"""Where an engine step's time goes, on the nano-vllm benchmark workload (GPU).

Per step: wall time split into scheduling, input preparation, the rest of execute
(forward + sampling, which waits for the GPU) and postprocess; GPU busy time from CUDA
events around the device work; and a torch.profiler table of the top kernels over a
window of full-batch decode steps.

    python benchmarks/engine_profile.py --out benchmarks/results/engine_profile_h200.json
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

from engine_throughput import QWEN3_0P6B, make_checkpoint, make_workload  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    from engine.core.sequence import SamplingParams
    from engine.llm import LLM

    prompts, outs = make_workload(args.num_requests, 100, args.max_len, QWEN3_0P6B["vocab_size"], 0)
    tmp = Path(tempfile.mkdtemp())
    make_checkpoint("qwen3-0.6b", tmp, "cuda", torch.bfloat16)
    llm = LLM(tmp, device="cuda", dtype="bfloat16", attention_backend=args.attention_backend, max_num_seqs=512,
              max_num_batched_tokens=16384, max_model_len=2 * args.max_len)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
    sched, runner = llm.scheduler, llm.runner
    phases = {"schedule": [], "prepare": [], "execute_rest": [], "postprocess": [], "gpu": [], "wall": [],
              "batch": [], "prefill_tokens": []}
    cur = {}

    def timed(obj, name, key):
        f = getattr(obj, name)

        def g(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            cur[key] = cur.get(key, 0.0) + time.perf_counter() - t
            return r
        setattr(obj, name, g)
    timed(sched, "schedule", "schedule")
    timed(sched, "postprocess", "postprocess")
    timed(runner, "_prepare", "prepare")
    execute = runner.execute

    def execute_timed(batch):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t = time.perf_counter()
        r = execute(batch)
        e1.record()
        cur["execute"] = time.perf_counter() - t
        cur["events"] = (e0, e1)
        return r
    runner.execute = execute_timed

    params = [SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=o) for o in outs]
    for p, sp in zip(prompts, params):
        llm.add_request(p, sp)
    torch.cuda.synchronize()
    t_start = time.perf_counter()
    prof_table = None
    step = 0
    while llm.has_unfinished():
        cur.clear()
        t = time.perf_counter()
        profiling = step == 40
        if profiling:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        llm.step()
        if profiling:
            for _ in range(9):
                llm.step()
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            prof_table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
            step += 10
            continue
        wall = time.perf_counter() - t
        s = llm.last_step
        if "events" in cur:
            cur["events"][1].synchronize()
            phases["gpu"].append(cur["events"][0].elapsed_time(cur["events"][1]) / 1e3)
            phases["schedule"].append(cur.get("schedule", 0.0))
            phases["prepare"].append(cur.get("prepare", 0.0))
            phases["execute_rest"].append(cur["execute"] - cur.get("prepare", 0.0))
            phases["postprocess"].append(cur.get("postprocess", 0.0))
            phases["wall"].append(wall)
            phases["batch"].append(s.num_seqs if s else 0)
            phases["prefill_tokens"].append(s.num_prefill_tokens if s else 0)
        step += 1
    total = time.perf_counter() - t_start
    import numpy as np
    b = np.array(phases["batch"])
    pre = np.array(phases["prefill_tokens"])
    dec = pre == 0
    summary = {"total_s": total, "steps": step, "output_tokens_per_s": sum(outs) / total}
    for k in ("wall", "gpu", "schedule", "prepare", "execute_rest", "postprocess"):
        a = np.array(phases[k])
        summary[f"{k}_ms_decode_mean"] = 1e3 * float(a[dec].mean())
        full = dec & (b >= 200)
        summary[f"{k}_ms_decode_fullbatch_mean"] = 1e3 * float(a[full].mean()) if full.any() else None
        summary[f"{k}_s_total"] = float(a.sum())
    summary["decode_steps"] = int(dec.sum())
    summary["prefill_steps"] = int((~dec).sum())
    print(json.dumps(summary, indent=2))
    print(prof_table)
    prefill = prefill_probe(llm, torch, SamplingParams)
    print(json.dumps({k: v for k, v in prefill.items() if not k.startswith("host_table")}, indent=2))
    print(prefill["host_table_eager"])
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "kernels": prof_table, "prefill_steps": prefill,
                                        "command": "python " + " ".join(sys.argv)}, indent=2))


def prefill_probe(llm, torch, SamplingParams, reps: int = 5) -> dict:
    """Lone prefill steps of one prompt of n tokens on an idle engine, wall time against GPU time (CUDA
    events): replaying the prefill CUDA graphs (engine/prefill_graphs.py), eagerly, and eagerly with the
    eager torch versions of the elementwise layers (engine/layers/fused.py; the captured graphs are
    unaffected); plus a torch.profiler table of one eager 16-token step sorted by host time, to tell
    launch and host overhead from kernel time."""
    from engine.layers import fused
    runner = llm.runner
    graphs = runner.prefill_graphs
    out = {"num_prefill_graphs": len(graphs.graphs) if graphs else 0,
           "prefill_graph_capture_s": graphs.capture_s if graphs else None,
           "steps_graph": timed_prefill_steps(llm, torch, SamplingParams, reps, first_token=5) if graphs else None}
    runner.prefill_graphs = None
    try:
        out["steps_eager"] = timed_prefill_steps(llm, torch, SamplingParams, reps, first_token=300)
        was_compiled = fused.compiled
        fused.disable_compile()
        try:
            out["steps_eager_layers"] = timed_prefill_steps(llm, torch, SamplingParams, reps, first_token=600)
        finally:
            if was_compiled:
                fused.enable_compile()
        llm.add_request([7] * 16, SamplingParams(max_tokens=1, temperature=0.6, ignore_eos=True))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            llm.step()
            torch.cuda.synchronize()
        while llm.has_unfinished():
            llm.step()
    finally:
        runner.prefill_graphs = graphs
    out["host_table_eager"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return out


def timed_prefill_steps(llm, torch, SamplingParams, reps: int, first_token: int) -> list:
    """Median wall and GPU-span milliseconds of lone prefill steps of 1 to 2,000 tokens. Every prompt is
    one token repeated, a different token for each (pass, length, repetition): no prefix-cache hits."""
    rows = []
    for i, n in enumerate((1, 16, 256, 1000, 2000)):
        walls, gpus = [], []
        for r in range(reps):
            llm.add_request([first_token + 10 * i + r] * n,
                            SamplingParams(max_tokens=1, temperature=0.6, ignore_eos=True))
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            e0.record()
            llm.step()
            e1.record()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
            gpus.append(e0.elapsed_time(e1) / 1e3)
            while llm.has_unfinished():
                llm.step()
        rows.append({"prompt_tokens": n, "wall_ms_median": 1e3 * sorted(walls)[reps // 2],
                     "gpu_span_ms_median": 1e3 * sorted(gpus)[reps // 2]})
    return rows


if __name__ == "__main__":
    main()
