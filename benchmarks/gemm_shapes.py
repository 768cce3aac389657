"""Qwen3-0.6B's decode GEMMs at each batch size: cuBLAS as the engine calls it, the other weight layout, and a
Triton kernel with split-K, against each shape's roofline (GPU; one JSON).

The engine's GEMMs are 14.8% of an offline run's kernel time on an H100 at 45% of their roofline
(benchmarks/engine_breakdown.py): small-M products whose weights should stream at HBM bandwidth. Per shape
(qkv 1024->4096, o 2048->1024, gate_up 1024->6144, down 3072->1024, lm_head 1024->151936) and M (the decode
batch: 1 ... 512), each variant is checked against a float32 product (max |y - ref| / max |ref|) and timed as
28 calls over 28 distinct weights captured in one CUDA graph (as a decode step's layers replay them: weights
read from HBM, not L2), median of replays:

* `cublas`: x @ W.t(), W [N, K] (the product F.linear runs in engine/layers/linear.py);
* `cublas_kn`: x @ W, W [K, N] contiguous (the other layout cuBLAS picks kernels for);
* `triton`: benchmarks/gemm_shapes.py's split-K kernel, best of CONFIGS for the shape (float32 partial sums per
  K slice, reduced in a fixed order by a second kernel when split, so the result does not depend on timing).

    python benchmarks/gemm_shapes.py --out $OUT/gemm_shapes_h100.json          # ~2-3 minutes
    TRITON_INTERPRET=1 python benchmarks/gemm_shapes.py --smoke                # CPU: the kernel's check only

Per M, `step` sums the shapes as one decode step runs them (28 x the four layer GEMMs + the LM head once): the
engine's cuBLAS time, the best variant's per shape, and the roofline's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))   # gpu_attention_check's and engine_throughput's helpers

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LAYERS = 28
SHAPES = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024),
          "lm_head": (1024, 151936)}        # (K, N)
PER_STEP = {"qkv": LAYERS, "o": LAYERS, "gate_up": LAYERS, "down": LAYERS, "lm_head": 1}
BATCHES = (1, 8, 16, 32, 64, 128, 192, 256, 384, 512)
REL_TOL = 2e-2
# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
CONFIGS = [(16, 64, 128, 1, 4, 4), (16, 64, 128, 2, 4, 4), (16, 64, 128, 4, 4, 4), (16, 128, 128, 1, 4, 4),
           (16, 128, 64, 2, 4, 5), (16, 32, 128, 4, 4, 4), (32, 64, 128, 2, 4, 4), (32, 128, 64, 1, 4, 4),
           (64, 64, 64, 1, 4, 4), (64, 128, 64, 1, 4, 3), (64, 64, 128, 2, 4, 3), (128, 128, 64, 1, 8, 3),
           (64, 256, 64, 1, 8, 3), (128, 64, 64, 1, 4, 3), (128, 128, 64, 2, 8, 3), (32, 32, 128, 8, 4, 4)]


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, k_per_split,
                 stride_xm, stride_wn, stride_om, stride_os,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    """out[s, m, n] (or out[m, n] when not SPLIT) = sum over k in split s of x[m, k] * w[n, k]; x [M, K],
    w [N, K] (the engine's layout), float32 accumulation."""
    pid_n, pid_m, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_per_split
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        kk = k + offs_k
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :],
                    mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + offs_n[:, None] * stride_wn + kk[None, :],
                    mask=(offs_n[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT:
        tl.store(out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :], acc, mask=mask)
    else:
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _reduce_kernel(part_ptr, out_ptr, MN, stride_s, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):                      # fixed order: the same sums every run
        acc += tl.load(part_ptr + s * stride_s + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def triton_linear(x, w, cfg, part=None, out=None):
    """x [M, K] @ w[N, K]^T with one config; `part` [SPLIT_K, M, N] f32 and `out` [M, N] may be preallocated."""
    bm, bn, bk, split, warps, stages = cfg
    M, K = x.shape
    N = w.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(K, split), bk) * bk
    out = torch.empty(M, N, device=x.device, dtype=x.dtype) if out is None else out
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), split)
    if split == 1:
        _gemm_kernel[grid](x, w, out, M, N, K, k_per_split, x.stride(0), w.stride(0), out.stride(0), 0,
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=False, num_warps=warps, num_stages=stages)
        return out
    part = torch.empty(split, M, N, device=x.device, dtype=torch.float32) if part is None else part
    _gemm_kernel[grid](x, w, part, M, N, K, k_per_split, x.stride(0), w.stride(0), part.stride(1), part.stride(0),
                       BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=True, num_warps=warps, num_stages=stages)
    block = 1024
    _reduce_kernel[(triton.cdiv(M * N, block),)](part, out, M * N, part.stride(0), SPLITS=split, BLOCK=block)
    return out


def rel_err(y, ref) -> float:
    return float((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def graph_us(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median microseconds per call of fn() (LAYERS calls) replayed as one CUDA graph."""
    from gpu_attention_check import layer_graph, replay_us
    graph = layer_graph(fn, 1)
    us = replay_us(graph, LAYERS, reps, warmup)
    del graph
    return us


def roofline_us(M, K, N, bytes_per_s, flops_per_s) -> float:
    return 1e6 * max((N * K + M * K + M * N) * 2 / bytes_per_s, 2 * M * N * K / flops_per_s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, the check only (CPU interpreter works)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="no new shape starts after this many seconds")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        torch.manual_seed(0)
        rows = []
        for (K, N), M in (((64, 48), 3), ((96, 32), 17)):
            x = torch.randn(M, K, device=dev)
            w = torch.randn(N, K, device=dev)
            ref = x @ w.T
            for cfg in ((16, 32, 32, 1, 4, 2), (16, 16, 32, 2, 4, 2), (32, 32, 16, 4, 4, 2)):
                rows.append(dict(M=M, K=K, N=N, cfg=cfg, rel_err=rel_err(triton_linear(x, w, cfg), ref)))
        print(json.dumps(rows, indent=1))
        assert all(r["rel_err"] < 1e-5 for r in rows), rows
        return
    from engine_throughput import card_hardware
    name = torch.cuda.get_device_name()
    hw = card_hardware(name)
    bw, fl = hw.bytes_per_s(use_measured=False), hw.flops_per_s(use_measured=False)
    torch.manual_seed(0)
    # LAYERS distinct weights per layer shape (two of the LM head's 311 MB), so each call reads its own from HBM
    weights = {s: [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
                   for _ in range(2 if s == "lm_head" else LAYERS)] for s, (K, N) in SHAPES.items()}
    weights_kn = {s: [w.t().contiguous() for w in ws] for s, ws in weights.items()}      # [K, N] copies
    rows, t0 = [], time.perf_counter()
    for M in BATCHES:
        for s, (K, N) in SHAPES.items():
            if time.perf_counter() - t0 > args.budget_s:
                break
            ws, ws_kn = weights[s], weights_kn[s]
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float().T
            row = dict(shape=s, M=M, K=K, N=N, roofline_us=roofline_us(M, K, N, bw, fl))
            outs = torch.empty(M, N, device=dev, dtype=torch.bfloat16)

            def run_all(f):
                return lambda: [f(i) for i in range(LAYERS)]
            nw = len(ws)
            row["cublas_us"] = graph_us(run_all(lambda i: torch.mm(x, ws[i % nw].t(), out=outs)))
            row["cublas_kn_us"] = graph_us(run_all(lambda i: torch.matmul(x, ws_kn[i % nw], out=outs)))
            row["cublas_kn_rel_err"] = rel_err(x @ ws_kn[0], ref)
            best = None
            for cfg in CONFIGS:
                if cfg[0] > max(16, triton.next_power_of_2(M)) * 2 or triton.cdiv(K, cfg[3]) < cfg[2]:
                    continue
                try:
                    part = torch.empty(cfg[3], M, N, device=dev, dtype=torch.float32)
                    err = rel_err(triton_linear(x, ws[0], cfg, part, outs), ref)
                    if err > REL_TOL:
                        row.setdefault("triton_mismatch", []).append([list(cfg), err])
                        continue
                    us = graph_us(run_all(lambda i, c=cfg, p=part: triton_linear(x, ws[i % nw], c, p, outs)))
                except Exception as exc:              # a config the compiler refuses is skipped, and said
                    row.setdefault("triton_errors", []).append([list(cfg), f"{type(exc).__name__}: {exc}"[:200]])
                    continue
                if best is None or us < best[1]:
                    best = (cfg, us, err)
            if best:
                row.update(triton_us=best[1], triton_cfg=list(best[0]), triton_rel_err=best[2])
            row["best"] = min(("cublas", "cublas_kn", "triton"), key=lambda v: row.get(f"{v}_us", float("inf")))
            rows.append(row)
            print(f"M={M:4d} {s:8s} roofline {row['roofline_us']:7.2f} us  cublas {row['cublas_us']:7.2f}  "
                  f"kn {row['cublas_kn_us']:7.2f}  triton {row.get('triton_us', float('nan')):7.2f} "
                  f"{row.get('triton_cfg')}", flush=True)
    steps = []
    for M in BATCHES:
        rs = {r["shape"]: r for r in rows if r["M"] == M}
        if len(rs) < len(SHAPES):
            continue
        step = {k: sum(PER_STEP[s] * rs[s][f"{k}_us"] for s in SHAPES) / 1e3
                for k in ("roofline", "cublas", "cublas_kn")}
        step["best_ms"] = sum(PER_STEP[s] * min(rs[s].get(f"{v}_us", float("inf"))
                                                for v in ("cublas", "cublas_kn", "triton")) for s in SHAPES) / 1e3
        steps.append(dict(M=M, roofline_ms=step["roofline"], cublas_ms=step["cublas"], cublas_kn_ms=step["cublas_kn"],
                          best_ms=step["best_ms"]))
        print(f"step M={M:4d}: roofline {step['roofline']:.3f} ms, cublas {step['cublas']:.3f}, "
              f"kn {step['cublas_kn']:.3f}, best per shape {step['best_ms']:.3f}")
    result = dict(device=name, hardware=hw.name, torch=torch.__version__, triton=triton.__version__,
                  command="python " + " ".join(sys.argv), rows=rows, steps=steps)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
