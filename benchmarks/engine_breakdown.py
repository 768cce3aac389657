"""Where the engine's offline time goes, against the roofline (GPU).

nano-vllm's benchmark (engine_throughput.py's workload: 256 requests, prompts and outputs uniform in
[100, 1024], all at once) with overlap scheduling, run twice on one engine: once untraced for its
throughput, then with every kernel of the run traced (torch.profiler, CUDA activity only; the prompts
shifted by one token id so that the prefix cache finds nothing of the first run). From the trace:

* each kernel's group (KERNEL_GROUPS: decode attention, prefill attention, GEMMs, norms, RoPE and the
  KV store, the activation, sampling, copies, the rest) and each group's seconds;
* the device's idle time inside the run, split by gap length: gaps of at most LAUNCH_GAP_US between
  kernels (launch gaps, inside a CUDA graph or between back-to-back launches) and longer ones (the
  device waited for the host: host work the overlap did not hide, or a synchronisation);
* the roofline's seconds for the same workload on this card (sim/lower_bound.py: linear layers, the
  LM head, decode and prefill attention at the datasheet's rates) beside the measured groups, so each
  says how far it is from its floor;
* each run's prefill and decode seconds and its longest step (`time_split`: a one-time cost of the first run
  shows as a long prefill step in `untraced` and not in `traced`);
* decode attention's KV bandwidth per batch-size bucket (`attention_by_batch`: each step's split-kernel
  calls matched to the step's decode entries and context sum, in execution order).

    python benchmarks/engine_breakdown.py --out $OUT/engine_breakdown_h100.json     # ~2 minutes on one GPU
    python benchmarks/engine_breakdown.py --decode-table decode_tune_h100.json ...  # a sweep's decode table

The traced run is slower than the untraced one (the tracer's cost per kernel); its shares are what the
JSON's `groups` give, and `traced_over_untraced` says by how much the tracing slowed the run.
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

from engine_throughput import time_split  # noqa: E402  (torch-free: its imports are lazy)

LAUNCH_GAP_US = 5.0      # a device gap this short is a launch gap; a longer one waited for the host

# (group, name fragments), matched in order on the kernel's name; copies are matched on the event category.
KERNEL_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention_decode", ("_decode_split_kernel", "_decode_reduce_kernel")),
    ("attention_prefill", ("_prefill_kernel", "flash_fwd", "flash::", "fmha")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "sm90_")),
    ("sampling", ("_race_argmax", "exponential", "distribution", "argmax", "softmax", "_resolve_kernel")),
    ("norm_rope_kv_store", ("_qk_norm_rope_store", "_store_kvcache", "rsqrt", "rms_norm", "rotary")),
    ("activation", ("silu", "gelu")),
)
COPY_CATEGORIES = {"gpu_memcpy": "copies", "gpu_memset": "copies"}
# roofline groups (sim/lower_bound.py) compared with the measured groups that do their work
ROOFLINE_OF = {"attention_decode": ("attention_decode",), "attention_prefill": ("attention_prefill",),
               "gemm": ("linear", "lm_head")}


def kernel_group(name: str, category: str = "kernel") -> str:
    if category in COPY_CATEGORIES:
        return COPY_CATEGORIES[category]
    for group, fragments in KERNEL_GROUPS:
        if any(f in name for f in fragments):
            return group
    return "other"


def device_events(trace: dict) -> list[tuple[float, float, str, str]]:
    """(start_us, end_us, name, group) of every kernel, copy and memset of a chrome trace, by start."""
    out = []
    for e in trace.get("traceEvents", []):
        cat = e.get("cat", "")
        if e.get("ph") != "X" or (cat != "kernel" and cat not in COPY_CATEGORIES):
            continue
        start, dur = float(e["ts"]), float(e.get("dur", 0.0))
        out.append((start, start + dur, e.get("name", ""), kernel_group(e.get("name", ""), cat)))
    out.sort()
    return out


def idle_gaps(events, launch_gap_us: float = LAUNCH_GAP_US) -> dict:
    """The device's busy time (union of the events' intervals) and its idle time between the first event's
    start and the last one's end, split into launch gaps (<= launch_gap_us) and host waits (longer), in us."""
    busy = launch = host = 0.0
    n_launch = n_host = 0
    cur_start = cur_end = None
    for start, end, *_ in events:
        if cur_end is None:
            cur_start, cur_end = start, end
            continue
        if start > cur_end:
            busy += cur_end - cur_start
            gap = start - cur_end
            if gap <= launch_gap_us:
                launch, n_launch = launch + gap, n_launch + 1
            else:
                host, n_host = host + gap, n_host + 1
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        busy += cur_end - cur_start
    span = max((e[1] for e in events), default=0.0) - (events[0][0] if events else 0.0)
    return dict(span_us=span, busy_us=busy, launch_gaps_us=launch, launch_gaps=n_launch, host_gaps_us=host,
                host_gaps=n_host)


def breakdown(events, roofline_s: dict | None = None, steps: int | None = None, top: int = 15) -> dict:
    """Per group: seconds of kernel time (summed durations), share of the summed time, calls; the idle split;
    each roofline-comparable group's floor and floor / measured; the top kernels by time."""
    groups: dict[str, dict] = {}
    kernels: dict[str, dict] = {}
    for start, end, name, group in events:
        g = groups.setdefault(group, dict(s=0.0, calls=0))
        g["s"] += (end - start) / 1e6
        g["calls"] += 1
        k = kernels.setdefault(name, dict(group=group, s=0.0, calls=0))
        k["s"] += (end - start) / 1e6
        k["calls"] += 1
    kernel_s = sum(g["s"] for g in groups.values())
    for g in groups.values():
        g["share"] = g["s"] / kernel_s
    gaps = idle_gaps(events)
    idle = dict(span_s=gaps["span_us"] / 1e6, busy_s=gaps["busy_us"] / 1e6, launch_gaps_s=gaps["launch_gaps_us"] / 1e6,
                launch_gaps=gaps["launch_gaps"], host_gaps_s=gaps["host_gaps_us"] / 1e6, host_gaps=gaps["host_gaps"])
    out = dict(kernel_s=kernel_s, groups=dict(sorted(groups.items(),
               key=lambda kv: -kv[1]["s"])), device=idle)
    if steps:
        out["steps"] = steps
        out["per_step_ms"] = {name: 1e3 * g["s"] / steps for name, g in out["groups"].items()}
        out["per_step_ms"].update(launch_gaps=1e3 * idle["launch_gaps_s"] / steps,
                                  host_gaps=1e3 * idle["host_gaps_s"] / steps)
    if roofline_s:
        out["roofline"] = {}
        for group, parts in ROOFLINE_OF.items():
            floor = sum(roofline_s.get(p, 0.0) for p in parts)
            measured = groups.get(group, {}).get("s", 0.0)
            out["roofline"][group] = dict(floor_s=floor, measured_s=measured,
                                          floor_over_measured=floor / measured if measured else None)
    out["top_kernels"] = [dict(name=n[:90], **k) for n, k in sorted(kernels.items(), key=lambda kv: -kv[1]["s"])[:top]]
    return out


DECODE_KERNELS = ("_decode_split_kernel", "_decode_reduce_kernel")
BATCH_BUCKETS = (16, 32, 64, 128, 256, None)      # upper bounds of the batch-size buckets (None: any larger)


def attention_by_batch(events, decode_steps, layers: int, kv_bytes_per_token: int, bytes_per_s: float) -> list:
    """Decode attention's achieved bandwidth per batch-size bucket.

    decode_steps: (num_decode_seqs, decode context sum) of every step with decode entries, in execution order.
    Each such step ran `layers` split-kernel calls (each with its reduce, when split) in order, so the i-th call
    belongs to step i // layers (calls past the last step, the drained step's discarded tokens, are left out).
    A call reads K and V of every context: context sum x kv_bytes_per_token (both, per layer)."""
    calls, at = [], -1
    for start, end, name, _ in events:
        if name == DECODE_KERNELS[0]:
            calls.append(end - start)
            at = len(calls) - 1
        elif name == DECODE_KERNELS[1] and at >= 0:
            calls[at] += end - start
    rows = {}
    for i, us in enumerate(calls[:len(decode_steps) * layers]):
        n, context_sum = decode_steps[i // layers]
        bound = next(b for b in BATCH_BUCKETS if b is None or n <= b)
        r = rows.setdefault(bound, dict(calls=0, s=0.0, bytes=0.0))
        r["calls"] += 1
        r["s"] += us / 1e6
        r["bytes"] += context_sum * kv_bytes_per_token
    out, lo = [], 1
    for bound in BATCH_BUCKETS:
        if bound in rows:
            r = rows[bound]
            tbps = r["bytes"] / r["s"] / 1e12 if r["s"] else 0.0
            out.append(dict(batch=f"{lo}-{bound}" if bound else f">= {lo}", calls=r["calls"], s=r["s"],
                            tb_per_s=tbps, of_datasheet=tbps * 1e12 / bytes_per_s))
        lo = (bound or 0) + 1
    return out


def table(result: dict) -> str:
    """Markdown: group, seconds, share, per step, roofline floor, floor / measured; then the idle split."""
    b = result["traced"]
    roof = b.get("roofline", {})
    lines = ["| group | kernel s | share | ms per step | roofline s | roofline / measured |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, g in b["groups"].items():
        r = roof.get(name)
        lines.append(f"| {name} | {g['s']:.3f} | {g['share']:.1%} | {b.get('per_step_ms', {}).get(name, 0):.3f} | "
                     + (f"{r['floor_s']:.3f} | {r['floor_over_measured']:.1%} |" if r and r["floor_over_measured"]
                        else "| |"))
    d = b["device"]
    lines += ["", f"device span {d['span_s']:.3f} s: busy {d['busy_s']:.3f} s, launch gaps {d['launch_gaps_s']:.3f} s "
              f"({d['launch_gaps']:,} gaps <= {LAUNCH_GAP_US:g} us), host waits {d['host_gaps_s']:.3f} s "
              f"({d['host_gaps']:,} longer gaps)"]
    by_batch = result["traced"].get("attention_by_batch")
    if by_batch:
        lines += ["", "| decode batch | attention s | KV read TB/s | of the datasheet's |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['batch']} | {r['s']:.3f} | {r['tb_per_s']:.2f} | {r['of_datasheet']:.1%} |" for r in by_batch]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--overlap-scheduling", choices=["on", "off"], default="on")
    ap.add_argument("--decode-table", default=None,
                    help="'default' (the default variant for every batch) or a benchmarks/decode_tune.py JSON whose "
                         "table is installed for this run (default: the tables on main)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from engine.kernels import decode_variants
    if args.decode_table == "default":
        decode_variants.install(((None, decode_variants.DecodeVariant()),))
    elif args.decode_table is not None:
        decode_variants.install_line(json.loads(Path(args.decode_table).read_text())["summary"]["table_line"])
    import torch
    from engine_throughput import (
        QWEN3_0P6B,
        StepRecorder,
        card_hardware,
        environment,
        make_checkpoint,
        make_workload,
        roofline_bound,
    )

    from engine.core.sequence import SamplingParams
    from engine.kernels.compile_log import CompileLog
    from engine.llm import LLM

    if not torch.cuda.is_available():
        sys.exit("engine_breakdown needs a CUDA GPU")
    prompts, outs = make_workload(args.num_requests, 100, args.max_len, QWEN3_0P6B["vocab_size"], 0)
    shifted = [[(t + 1) % 10000 for t in p] for p in prompts]           # no prefix-cache hits on the first run
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=o) for o in outs]
    tmp = Path(tempfile.mkdtemp())
    make_checkpoint("qwen3-0.6b", tmp, "cuda", torch.bfloat16)
    llm = LLM(tmp, device="cuda", dtype="bfloat16", max_num_seqs=512, max_num_batched_tokens=16384,
              max_model_len=2 * args.max_len, overlap_scheduling=args.overlap_scheduling == "on")
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)          # warm-up
    decode_steps = []           # (decode entries, their context sum) of each step with decodes, in order

    def on_batch(batch):
        if batch is not None and batch.num_decode_seqs:
            decode_steps.append((batch.num_decode_seqs, sum(batch.context_lens[batch.num_prefill_seqs:])))
    rec = StepRecorder(llm, on_batch)       # rec.steps: (prefill tokens, seconds) of every step of the current run

    def timed_run(p, compiles: CompileLog):
        torch.cuda.synchronize()
        with compiles:
            t0 = time.perf_counter()
            llm.generate(p, params, use_tqdm=False)
            torch.cuda.synchronize()
            return time.perf_counter() - t0
    untraced_compiles, traced_compiles = CompileLog(), CompileLog()
    untraced_s = timed_run(prompts, untraced_compiles)
    untraced_steps, untraced_split = len(rec.steps), time_split(rec.steps)
    decode_steps.clear()
    rec.clear()
    trace_path = tmp / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        traced_s = timed_run(shifted, traced_compiles)
    prof.export_chrome_trace(str(trace_path))
    events = device_events(json.loads(trace_path.read_text()))
    env = environment("cuda")
    hardware = card_hardware(env["gpu"])
    bound = roofline_bound(prompts, outs, env["gpu"])
    decode_table = decode_variants.table_for_device(env["gpu"])
    result = dict(decode_table=[(limit, variant.name) for limit, variant in decode_table],
                  workload=dict(num_requests=args.num_requests, max_len=args.max_len, output_tokens=sum(outs)),
                  overlap_scheduling=args.overlap_scheduling == "on", hardware=hardware.name,
                  untraced=dict(elapsed_s=untraced_s, steps=untraced_steps, output_tokens_per_s=sum(outs) / untraced_s,
                                time_split=untraced_split, **untraced_compiles.summary()),
                  roofline_tokens_per_s=bound.output_tokens / bound.time_s,
                  roofline_groups_s=bound.time_by_group_s,
                  traced=dict(elapsed_s=traced_s, time_split=time_split(rec.steps), **traced_compiles.summary(),
                              **breakdown(events, bound.time_by_group_s, len(rec.steps))))
    mc = llm.runner.model.config
    kv_bytes = 2 * mc.num_key_value_heads * mc.head_dim * llm.runner.kv_cache.element_size()   # K and V, one layer
    result["traced"]["attention_by_batch"] = attention_by_batch(events, decode_steps, mc.num_hidden_layers, kv_bytes,
                                                                hardware.bytes_per_s(use_measured=False))
    result["untraced_over_roofline"] = result["untraced"]["output_tokens_per_s"] / result["roofline_tokens_per_s"]
    result["traced_over_untraced"] = traced_s / untraced_s
    result.update(env)
    if args.out:                # first, so that nothing after the runs can lose them
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"untraced: {result['untraced']['output_tokens_per_s']:,.0f} output tok/s, "
          f"{result['untraced_over_roofline']:.1%} of the roofline ({result['roofline_tokens_per_s']:,.0f}, "
          f"{hardware.name}); traced run {result['traced_over_untraced']:.3f}x as long")
    print(table(result))


if __name__ == "__main__":
    main()
