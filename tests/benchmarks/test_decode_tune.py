"""benchmarks/decode_tune.py: the --smoke sweep on CPU (Triton interpreter) end to end, and how it picks winners
and builds the table from timed rows."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from engine.kernels.decode_variants import DecodeVariant

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("decode_tune", ROOT / "benchmarks" / "decode_tune.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_sweep_writes_rows_winners_and_a_table_line(tmp_path):
    out = tmp_path / "tune.json"
    proc = subprocess.run([sys.executable, "benchmarks/decode_tune.py", "--smoke", "--out", str(out),
                           "--variants", "h2,s3_hfast_lpt_splits4_minp512_direct,n32_nodot"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    ran = {r["variant"] for r in res["rows"]}
    assert ran == {"default", "h2", "s3_hfast_lpt_splits4_minp512_direct", "n32_nodot", "default@end"}
    assert all(r["status"] == "ok" and r["max_rel_err"] <= res["rel_tol"] and r["us"] > 0 for r in res["rows"])
    assert {s["name"] for s in res["shapes"]} == {r["shape"] for r in res["rows"]}
    summary = res["summary"]
    assert set(summary["per_bucket"]) == {"1", "3"} and summary["failed_variants"] == []
    ns = {"DecodeVariant": DecodeVariant}
    exec(summary["table_line"], ns)                        # the line to paste is valid Python
    assert ns["DECODE_TABLE"][-1][0] is None
    assert "to adopt, in engine/kernels/decode_variants.py:" in proc.stdout


FAKE_WORKER = """
import json, sys
names, rows = sys.argv[1].split(","), sys.argv[2]
with open(rows, "a") as f:
    f.write(json.dumps(dict(variant="worker", status="launch", names=names)) + "\\n")
    for n in names:
        f.write(json.dumps(dict(variant=n, status="started")) + "\\n")
        f.flush()
        if n == "h2":
            sys.exit(1)         # as a CUDA fault would end the worker
        f.write(json.dumps(dict(variant=n, status="done")) + "\\n")
"""


def test_a_variant_that_ends_the_worker_is_recorded_and_a_fresh_worker_does_the_rest(tmp_path):
    mod = load_benchmark()
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    args = mod.argparse.Namespace(out=tmp_path / "tune.json", variants="h2,w8", budget_s=60.0)
    rows = mod.run_sweep(args, command=lambda a, names, rows_path, budget: [sys.executable, str(script),
                                                                            ",".join(names), str(rows_path)])
    launches = [r["names"] for r in rows if r["status"] == "launch"]
    assert launches == [["default", "w8", "h2", "default@end"], ["default@end"]]
    status = {r["variant"]: r["status"] for r in rows if r["variant"] != "worker"}
    assert status == {"default": "done", "w8": "done", "h2": "crashed", "default@end": "done"}


def _rows(times):
    """Timed rows from {variant: {shape: us}}; a None time is a mismatch."""
    rows = []
    for v, per in times.items():
        for shape, us in per.items():
            row = dict(variant=v, shape=shape, bucket=int(shape.split("x")[0]))
            row.update(dict(status="ok", us=us, gbps=1.0) if us is not None else dict(status="mismatch"))
            rows.append(row)
    return rows


def test_winners_need_the_margin_a_clean_record_and_merge_into_buckets():
    mod = load_benchmark()
    shape_list = [dict(name=n, bucket=int(n.split("x")[0]), contexts=[1]) for n in ("1x1", "64x1", "64x2", "512x1")]
    h2, w8, n128 = (DecodeVariant(kv_heads_per_program=2).name, DecodeVariant(num_warps=8).name,
                    DecodeVariant(block_n=128, num_stages=2).name)
    rows = _rows({
        "default": {"1x1": 10.0, "64x1": 100.0, "64x2": 100.0, "512x1": 1000.0},
        w8: {"1x1": 9.9, "64x1": 90.0, "64x2": 95.0, "512x1": 900.0},      # 1% at batch 1: inside the margin
        h2: {"1x1": 20.0, "64x1": 80.0, "64x2": 80.0, "512x1": 850.0},     # the fastest from 64 on
        n128: {"1x1": 5.0, "64x1": 10.0, "64x2": None, "512x1": 10.0},     # fastest, but mismatched once
    })
    s = mod.summarize(rows, shape_list)
    assert n128 in s["failed_variants"] and n128 not in s["clean_variants"]
    assert [s["per_bucket"][b]["winner"] for b in ("1", "64", "512")] == ["default", h2, h2]
    assert s["per_bucket"]["1"]["best"] == w8
    assert s["table"] == [(1, "default"), (None, h2)]
    ns = {"DecodeVariant": DecodeVariant}
    exec(s["table_line"], ns)
    assert ns["DECODE_TABLE"] == ((1, DecodeVariant()), (None, DecodeVariant(kv_heads_per_program=2)))
