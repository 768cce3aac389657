"""Sweep the paged decode kernel's variants (engine/kernels/decode_variants.CANDIDATES) on CUDA; one JSON.

    python benchmarks/decode_tune.py --out $OUT/decode_tune_h200.json          # H200: ~3-4 minutes
    python benchmarks/decode_tune.py --smoke --out /tmp/decode_tune_smoke.json  # CPU, Triton interpreter, seconds
    python benchmarks/decode_tune.py --compile-only                             # CPU: compile each for sm_90

Shapes (Qwen3-0.6B's attention: 16 q / 8 kv heads, head_dim 128, bf16, 16-token pages handed out in
shuffled order, every sequence on its own pages): the throughput benchmark's decode batches, 64, 128,
256, 384 and 512 sequences (and 32, where the default still splits keys) with contexts uniform in
[100, 2048] and all-long ones in [1000, 4000]; small batches of 1, 4 and 16 sequences at 256, 1,024 and
4,096 keys, so a change does not regress them. The table keys on the batch size alone (the host does not
read the contexts), so each bucket's winner is chosen over both context mixes.
For every variant and shape: the output against a PyTorch reference (the pages gathered, softmax
attention in float32; max |out - ref| / max |ref| within REL_TOL, gpu_attention_check.py's), then the
time per call of LAYERS calls captured in one CUDA graph (median of replays, clocks settled first),
the achieved GB/s (K and V of every context plus q and out) and the ratio to the default variant's time.

Each shape bucket (a batch size) names its winner: the variant with the lowest geometric-mean ratio over
the bucket's shapes among those that matched everywhere, if it beats the default by more than MARGIN;
from the winners the script prints the DECODE_TABLE line to paste into engine/kernels/decode_variants.py.

Robust by construction: the variants run in a worker process (the default first, and again at the end to
show clock drift); a variant that fails to compile, raises or mismatches is recorded and skipped; one
that crashes the worker (a CUDA fault poisons the context) is recorded as crashed and a fresh worker
goes on with the rest. Rows are appended to a JSON-lines file as they come, so a time limit keeps them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")    # before triton is first imported

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))   # gpu_attention_check's helpers

from engine.kernels.decode_variants import CANDIDATES, DecodeVariant, table_literal  # noqa: E402

LAYERS = 28
REL_TOL = 2e-2          # bf16 (gpu_attention_check.py); the float32 smoke run uses SMOKE_REL_TOL
SMOKE_REL_TOL = 1e-4
MARGIN = 0.02           # a bucket's winner must be this much faster than the default (geometric mean)
END_DEFAULT = "default@end"


# -- shapes ----------------------------------------------------------------------------------------------

def shapes(smoke: bool, seed: int) -> list[dict]:
    """[{name, bucket, contexts}], contexts a list of ints; bucket is the batch size the table keys on."""
    import torch
    gen = torch.Generator().manual_seed(seed)

    def uniform(n, lo, hi):
        return torch.randint(lo, hi + 1, (n,), generator=gen).tolist()

    if smoke:        # tiny: contexts not multiples of the page, splits that end early, an empty entry
        return [dict(name="1x45", bucket=1, contexts=[45]),
                dict(name="3x0-70", bucket=3, contexts=[0, 37, 70])]
    out = []
    for b in (1, 4, 16):
        for ctx in (256, 1024, 4096):
            out.append(dict(name=f"{b}x{ctx}", bucket=b, contexts=[ctx] * b))
    for b in (32, 64, 128, 256, 384, 512):       # 32: splits under the default rule (< 2 programs per SM)
        out.append(dict(name=f"{b}x100-2048", bucket=b, contexts=uniform(b, 100, 2048)))
        out.append(dict(name=f"{b}x1000-4000", bucket=b, contexts=uniform(b, 1000, 4000)))
    return out


def attention_shape(smoke: bool) -> dict:
    if smoke:
        return dict(q_heads=4, kv_heads=2, head_dim=32, block_size=4, dtype="float32", device="cpu")
    return dict(q_heads=16, kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16", device="cuda")


def make_problem(shape: dict, attn: dict, seed: int) -> dict:
    """Caches, q, tables (width at least 2,048 tokens, the throughput benchmark's max_model_len; padding ->
    page 0, which no sequence owns) and lengths on the device."""
    import torch
    dev, dtype = torch.device(attn["device"]), getattr(torch, attn["dtype"])
    bs, hkv, d = attn["block_size"], attn["kv_heads"], attn["head_dim"]
    ctx = shape["contexts"]
    pages = [math.ceil(c / bs) for c in ctx]
    width = max(max(pages), math.ceil(2048 / bs), 1)
    gen = torch.Generator().manual_seed(seed)
    ids = (torch.randperm(sum(pages), generator=gen) + 1).to(torch.int32)
    tables = torch.zeros(len(ctx), width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        tables[b, :n] = ids[at:at + n]
        at += n
    torch.manual_seed(seed)
    k = torch.randn(sum(pages) + 1, bs, hkv, d, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(len(ctx), attn["q_heads"], d, device=dev, dtype=dtype)
    return dict(q=q, k=k, v=v, tables=tables.to(dev), lens=torch.tensor(ctx, dtype=torch.int32, device=dev),
                scale=d ** -0.5)


def reference(p: dict):
    """float32 [B, Hq, D]: each sequence's pages gathered, explicit softmax attention (zeros for no keys)."""
    import torch
    q, k, v = p["q"].float(), p["k"], p["v"]
    B, hq, d = q.shape
    bs, hkv = k.shape[1], k.shape[2]
    out = torch.zeros(B, hq, d, device=q.device)
    for b, ctx in enumerate(p["lens"].tolist()):
        if ctx == 0:
            continue
        pages = p["tables"][b, :math.ceil(ctx / bs)].long()
        kb = k[pages].reshape(-1, hkv, d)[:ctx].float().repeat_interleave(hq // hkv, dim=1)   # [ctx, Hq, D]
        vb = v[pages].reshape(-1, hkv, d)[:ctx].float().repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b], kb) * p["scale"]
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), vb)
    return out


def problem_bytes(p: dict) -> int:
    """K and V of every context, plus q read and out written."""
    k = p["k"]
    per_key = 2 * k.shape[2] * k.shape[3] * k.element_size()
    return int(p["lens"].sum()) * per_key + 2 * p["q"].numel() * p["q"].element_size()


# -- timing ----------------------------------------------------------------------------------------------

def settle_clocks(fn, seconds: float) -> None:
    import torch
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        fn()
        torch.cuda.synchronize()


def graph_us(fn, warmup: int, iters: int, budget_s: float) -> float:
    """Microseconds per call: LAYERS calls of fn in one CUDA graph, median over replays (at least 3, at most
    iters, fewer once budget_s is spent)."""
    from gpu_attention_check import layer_graph, replay_us
    graph = layer_graph(fn, LAYERS)
    us = replay_us(graph, LAYERS, iters, warmup, budget_s)
    del graph
    return us


def wall_us(fn, iters: int) -> float:
    """CPU (interpreter) stand-in: wall microseconds per eager call, median."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


# -- worker: runs variants over every shape, appends rows ----------------------------------------------

def variant_list() -> list[tuple[str, DecodeVariant]]:
    """(name, variant): the candidates, then the default again (clock drift over the sweep)."""
    named = [(v.name, v) for v in CANDIDATES]
    return named + [(END_DEFAULT, DecodeVariant())]


def run_worker(args) -> int:
    import torch

    from engine.kernels.paged_decode import paged_decode_attention
    smoke = args.smoke
    attn = attention_shape(smoke)
    if not smoke and not torch.cuda.is_available():
        print("decode_tune.py times CUDA kernels; no CUDA device is visible (use --smoke on CPU)", file=sys.stderr)
        return 2
    todo = dict(variant_list())
    names = [n for n in args.worker_variants.split(",") if n]
    rows_f = open(args.rows, "a")
    probs = []
    for sh in shapes(smoke, args.seed):
        p = make_problem(sh, attn, args.seed)
        p["ref"] = reference(p)
        p["bytes"] = problem_bytes(p)
        probs.append((sh, p))
    tol = SMOKE_REL_TOL if smoke else REL_TOL

    def write(row) -> bool:
        """Appends the row; False when an error may have poisoned the CUDA context (a fresh worker goes on)."""
        rows_f.write(json.dumps(row) + "\n")
        rows_f.flush()
        return not (row.get("status") == "error" and "CUDA" in row.get("error", ""))

    t_start = time.perf_counter()
    if not smoke:   # settle clocks on the largest shape before the first timed variant
        sh, p = max(probs, key=lambda x: x[1]["bytes"])
        settle_clocks(lambda: paged_decode_attention(p["q"], p["k"], p["v"], p["lens"], p["tables"], p["scale"],
                                                     variant=DecodeVariant()), 0.3)
    for name in names:
        var = todo[name]
        if time.perf_counter() - t_start > args.budget_s:
            rows_f.write(json.dumps(dict(variant=name, status="skipped", error="time budget spent")) + "\n")
            rows_f.flush()
            continue
        print(f"[{name}] started", flush=True)
        rows_f.write(json.dumps(dict(variant=name, status="started")) + "\n")
        rows_f.flush()
        # pass 1: the check, which also compiles every specialization the shapes need (one split, several)
        checked = []
        for sh, p in probs:
            row = dict(variant=name, shape=sh["name"], bucket=sh["bucket"], num_seqs=len(sh["contexts"]),
                       context_sum=sum(sh["contexts"]), context_max=max(sh["contexts"]), bytes=p["bytes"])
            out = torch.empty_like(p["q"])

            def call(p=p, out=out, var=var):
                return paged_decode_attention(p["q"], p["k"], p["v"], p["lens"], p["tables"], p["scale"],
                                              out=out, variant=var)
            try:
                out.fill_(float("nan"))
                call()
                diff = (out.float().nan_to_num(1e4) - p["ref"]).abs().max()
                err = float(diff / p["ref"].abs().max().clamp_min(1e-6))
                row["max_rel_err"] = err
                if err <= tol:
                    checked.append((row, call))
                    continue
                row.update(status="mismatch", error=f"max relative error {err:.3g} > {tol}")
            except Exception as e:  # noqa: BLE001 - a failing variant is recorded, never fatal
                row.update(status="error", error=repr(e)[:300], traceback=traceback.format_exc()[-1500:])
            if not write(row):
                return 3
        # pass 2: clocks back up after the compiles, then the timings
        if checked and not smoke:
            settle_clocks(max(checked, key=lambda rc: rc[0]["bytes"])[1], 0.05)
        for row, call in checked:
            try:
                us = wall_us(call, 1) if smoke else graph_us(call, args.warmup, args.iters, args.shape_budget_s)
                row.update(status="ok", us=round(us, 3), gbps=round(row["bytes"] / us / 1e3, 1))
            except Exception as e:  # noqa: BLE001 - e.g. a capture that fails
                row.update(status="error", error=repr(e)[:300], traceback=traceback.format_exc()[-1500:])
            if not write(row):
                return 3
        rows_f.write(json.dumps(dict(variant=name, status="done")) + "\n")
        rows_f.flush()
    return 0


# -- parent: workers, summary, table ---------------------------------------------------------------------

def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def worker_command(args, names: list[str], rows_path: Path, budget_s: float) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker-variants", ",".join(names),
            "--rows", str(rows_path), "--seed", str(args.seed), "--warmup", str(args.warmup),
            "--iters", str(args.iters), "--shape-budget-s", str(args.shape_budget_s),
            "--budget-s", str(max(budget_s, 0.0))] + (["--smoke"] if args.smoke else [])


def run_sweep(args, command=worker_command) -> list[dict]:
    """Runs workers (command(args, variant names, rows file, seconds left) -> argv) until every variant is
    done, skipped or crashed; returns the rows."""
    rows_path = args.out.with_suffix(".rows.jsonl")
    rows_path.unlink(missing_ok=True)
    names = [n for n, _ in variant_list()]
    if args.variants:
        wanted = set(args.variants.split(","))
        unknown = wanted - set(names)
        if unknown:
            raise SystemExit(f"--variants: unknown {sorted(unknown)}; known: {','.join(names)}")
        names = [n for n in names if n in wanted or n in ("default", END_DEFAULT)]
    t0 = time.perf_counter()
    while True:
        rows = read_rows(rows_path)
        finished = {r["variant"] for r in rows if r.get("status") in ("done", "skipped", "crashed")}
        left = [n for n in names if n not in finished]
        if not left:
            return rows
        rc = subprocess.run(command(args, left, rows_path, args.budget_s - (time.perf_counter() - t0)),
                            cwd=ROOT).returncode
        rows = read_rows(rows_path)
        finished = {r["variant"] for r in rows if r.get("status") in ("done", "skipped", "crashed")}
        unfinished = [r["variant"] for r in rows if r.get("status") == "started" and r["variant"] not in finished]
        if not unfinished:
            if rc != 0:         # died before starting a variant (setup): nothing to blame, nothing to retry
                print(f"worker exited with {rc} before starting a variant; stopping", flush=True)
                return rows
            continue
        bad = unfinished[0]     # a worker runs one variant at a time: the one it was in when it died
        print(f"[{bad}] ended the worker (exit {rc}); going on without it", flush=True)
        with open(rows_path, "a") as f:
            f.write(json.dumps(dict(variant=bad, status="crashed", error=f"worker exit {rc}")) + "\n")


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def summarize(rows: list[dict], shape_list: list[dict]) -> dict:
    """Ratios to the default, per-bucket geometric means, winners and the table."""
    timed = [r for r in rows if "shape" in r]
    default_us = {r["shape"]: r["us"] for r in timed if r["variant"] == "default" and r["status"] == "ok"}
    for r in timed:
        if r.get("status") == "ok" and r["shape"] in default_us:
            r["vs_default"] = round(r["us"] / default_us[r["shape"]], 4)
    variants = [n for n, _ in variant_list() if n != END_DEFAULT]
    by = {(r["variant"], r["shape"]): r for r in timed}
    clean = [v for v in variants
             if all(by.get((v, s["name"]), {}).get("status") == "ok" for s in shape_list)]
    buckets = sorted({s["bucket"] for s in shape_list})
    per_bucket = {}
    for bk in buckets:
        names = [s["name"] for s in shape_list if s["bucket"] == bk]
        gm = {v: round(geomean([by[(v, n)]["vs_default"] for n in names]), 4) for v in clean
              if all("vs_default" in by[(v, n)] for n in names)}
        best = min(gm, key=gm.get) if gm else "default"
        winner = best if gm.get(best, 1.0) < 1.0 - MARGIN else "default"
        per_bucket[str(bk)] = dict(shapes=names, geomean_vs_default=gm, best=best, winner=winner,
                                   winner_vs_default=gm.get(winner, 1.0))
    table, lookup = [], {v.name: v for v in CANDIDATES}
    for i, bk in enumerate(buckets):
        bound = None if i == len(buckets) - 1 else bk
        win = lookup[per_bucket[str(bk)]["winner"]]
        if table and table[-1][1] == win:
            table[-1] = (bound, win)
        else:
            table.append((bound, win))
    end = {r["shape"]: r["us"] for r in timed if r["variant"] == END_DEFAULT and r.get("status") == "ok"}
    drift = [end[s] / default_us[s] for s in end if s in default_us]
    failed = sorted({r["variant"] for r in rows if r.get("status") in ("error", "mismatch", "crashed", "skipped")})
    return dict(per_bucket=per_bucket, table=[(b, v.name) for b, v in table], table_line=table_literal(table),
                clean_variants=clean, failed_variants=failed,
                default_drift_geomean=round(geomean(drift), 4) if drift else None)


def print_report(rows: list[dict], summary: dict, shape_list: list[dict]) -> None:
    by = {(r["variant"], r["shape"]): r for r in rows if "shape" in r}
    buckets = list(summary["per_bucket"])
    print("\nvariant (geomean time / default's, per batch-size bucket; x = failed there)")
    print(f"{'':34s}" + "".join(f"{b:>8s}" for b in buckets))
    for v in [n for n, _ in variant_list()]:
        cells = []
        for b in buckets:
            names = summary["per_bucket"][b]["shapes"]
            rs = [by.get((v, n), {}) for n in names]
            if all("vs_default" in r for r in rs):
                cells.append(f"{geomean([r['vs_default'] for r in rs]):8.3f}")
            else:
                cells.append(f"{'x':>8s}")
        errs = sorted({r.get("status") for r in rows if r.get("variant") == v and "shape" in r} - {"ok"})
        print(f"{v:34s}" + "".join(cells) + (f"  ({','.join(errs)})" if errs else ""))
    print("\nshape: default us / GB/s -> best variant us / GB/s")
    for s in shape_list:
        d = by.get(("default", s["name"]), {})
        oks = [r for (v, n), r in by.items() if n == s["name"] and r.get("status") == "ok" and v != END_DEFAULT]
        if not oks or "us" not in d:
            print(f"{s['name']:16s} no timing")
            continue
        b = min(oks, key=lambda r: r["us"])
        print(f"{s['name']:16s} {d['us']:9.1f} us {d['gbps']:7.0f} GB/s -> {b['variant']:30s} {b['us']:9.1f} us "
              f"{b['gbps']:7.0f} GB/s ({b['us'] / d['us']:.3f}x)")
    print("\nbucket winners: " + ", ".join(f"{b}: {p['winner']} ({p['winner_vs_default']:.3f}x)"
                                       for b, p in summary["per_bucket"].items()))
    if summary["failed_variants"]:
        print("failed somewhere: " + ", ".join(summary["failed_variants"]))
    if summary["default_drift_geomean"] is not None:
        print(f"default at the end / at the start: {summary['default_drift_geomean']:.3f}x (clock drift)")
    print("\nto adopt, in engine/kernels/decode_variants.py:\n" + summary["table_line"])


def compile_only() -> int:
    """Compile every candidate's split kernel (one split and several) for sm_90 with this machine's Triton and
    ptxas, no GPU needed: registers, spills and shared memory per variant, or the compile error."""
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels.paged_decode import _decode_split_kernel, split_kernel_constexprs
    fn = _decode_split_kernel
    dump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    attn = attention_shape(False)
    ptr_types = dict(tables_ptr="*i32", lens_ptr="*i32", order_ptr="*i32", mid_o_ptr="*fp32", mid_lse_ptr="*fp32")
    failures = 0
    for var in CANDIDATES:
        for single in ((True, False) if var.num_splits in (None, 1) else (False,)):
            const = split_kernel_constexprs(var, attn["q_heads"], attn["kv_heads"], attn["head_dim"],
                                            attn["block_size"], var.block_n, single,
                                            var.direct_single and not single, "tf32")
            sig = {a: "constexpr" if a in const else ptr_types.get(a, "*bf16") if a.endswith("_ptr")
                   else "fp32" if a == "qk_scale" else "i32" for a in fn.arg_names}
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                     if a.endswith("_ptr") or a.startswith("stride_")}
            stages = var.num_stages or (3 if single else 2)
            try:
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                                   target=GPUTarget("cuda", 90, 32),
                                   options=dict(num_warps=var.num_warps, num_stages=stages))
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(k.asm["cubin"])
                    f.flush()
                    use = subprocess.run([str(dump), "--dump-resource-usage", f.name], capture_output=True,
                                         text=True).stdout
                line = next((ln for ln in use.splitlines() if "REG:" in ln), "")
                res = dict(kv.split(":") for kv in line.split() if kv.split(":")[0] in ("REG", "STACK", "LOCAL"))
                print(f"{var.name:34s} splits={'1' if single else 'n'} ok  regs={res.get('REG', '?'):4s} "
                      f"stack={res.get('STACK', '?'):3s} shared={k.metadata.shared:6d} "
                      f"async_copies={k.asm['ttgir'].count('async_copy_global_to_local')}")
            except Exception as e:  # noqa: BLE001
                failures += 1
                print(f"{var.name:34s} splits={'1' if single else 'n'} FAIL {repr(e)[:300]}")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_tune.json"))
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes (seconds)")
    ap.add_argument("--compile-only", action="store_true", help="compile every variant for sm_90 (no GPU) and stop")
    ap.add_argument("--variants", default="", help="comma list of variant names (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2, help="untimed graph replays per variant and shape")
    ap.add_argument("--iters", type=int, default=10, help="timed graph replays per variant and shape (at most)")
    ap.add_argument("--shape-budget-s", type=float, default=0.4, help="stop replaying a shape after this (>= 3)")
    ap.add_argument("--budget-s", type=float, default=220.0, help="no new variant starts after this many seconds")
    ap.add_argument("--worker-variants", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only()
    if args.worker_variants is not None:
        return run_worker(args)
    if not args.smoke:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("decode_tune.py times CUDA kernels; no CUDA device is visible (use --smoke on CPU)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        rows = run_sweep(args)
    except KeyboardInterrupt:       # a time limit (SIGINT): report what the rows file holds
        print("interrupted: summarizing the rows so far", flush=True)
        rows = read_rows(args.out.with_suffix(".rows.jsonl"))
    shape_list = shapes(args.smoke, args.seed)
    summary = summarize(rows, shape_list)
    print_report(rows, summary, shape_list)
    import torch
    import triton
    res = dict(command="python benchmarks/decode_tune.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               device=torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke else "cpu",
               torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
               wall_s=round(time.perf_counter() - t0, 1), layers_per_graph=LAYERS,
               shape=attention_shape(args.smoke), rel_tol=SMOKE_REL_TOL if args.smoke else REL_TOL, margin=MARGIN,
               variants={n: v.literal() for n, v in variant_list()},
               shapes=[dict(name=s["name"], bucket=s["bucket"], num_seqs=len(s["contexts"]),
                            context_sum=sum(s["contexts"]), context_max=max(s["contexts"])) for s in shape_list],
               summary=summary, rows=[r for r in rows if "shape" in r or r.get("status") in ("crashed", "skipped")])
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out} in {res['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
