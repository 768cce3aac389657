#!/usr/bin/env bash
# The offline benchmark's first-run stall on one GPU: what compiles inside the timed run, with the overlap loop's
# placeholder kernel as it was before it marked num_ids and num_prev do_not_specialize and as it is now, in the same
# call. Or the same on CPU with the tiny model (--smoke: the script's own check; the CPU runs no Triton kernel).
#
#   benchmarks/gpu_compile_stall.sh [--out DIR]           # GPU (<tag> h200, h100): ~4.5 min on a fresh machine
#   benchmarks/gpu_compile_stall.sh --smoke [--out DIR]   # CPU, tiny model, a few seconds a run
#
# Stages (STAGES, default all; each logs, and a failing stage never stops the next):
#   ab          benchmarks/engine_throughput.py (256 requests, 100-1,024 prompt and output tokens, overlap scheduling
#               on, no transformers baseline), each run a fresh process, alternating: "before" (the placeholder
#               kernel specialized on every integer again) then "after" (the code as it is), REPEATS pairs (default
#               2). On a fresh machine the first "before" compiles the kernel's variants on an empty Triton cache,
#               later ones load them from Triton's disk cache. Each run records its Triton compiles (name, seconds)
#               and torch.compile frame compiles inside the timed run (engine/kernels/compile_log.py), its prefill
#               and decode seconds, its five longest steps and the host seconds each spent launching (time_split)
#                          -> compile_stall_<tag>_before_<i>.json, ..._after_<i>.json, summary compile_stall_<tag>.json
#   breakdown   benchmarks/engine_breakdown.py on the code as it is (GPU only)          -> engine_breakdown_<tag>.json
# Outputs (--out, default $OUT, else benchmarks/results/compile_stall): gpu_compile_stall.log and the files above.
set -uo pipefail

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_compile_stall benchmarks/results/compile_stall "$0" "$@"
select_stages "ab breakdown"

if [ "$SMOKE" = 1 ]; then
  TAG=cpu_smoke
  BENCH=(--preset tiny --device cpu --dtype float32 --num-requests 6 --min-len 8 --max-len 24)
else
  TAG="$(gpu_card)"; BENCH=()
fi
REPEATS="${REPEATS:-2}"

log "gpu_compile_stall: smoke=$SMOKE stages='$STAGES' repeats=$REPEATS out=$OUT_DIR"
[ "$SMOKE" = 0 ] && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"

# $WORK/before.py ARGS: engine_throughput.py with the placeholder kernel re-made from its source without
# do_not_specialize, as it was before.
cat > "$WORK/before.py" <<'EOF'
import runpy, sys
sys.path.insert(0, ".")
import triton
import engine.kernels.resolve_placeholders as rp
rp._resolve_kernel = triton.jit(rp._resolve_kernel.fn)
sys.argv = ["benchmarks/engine_throughput.py", *sys.argv[1:]]
runpy.run_path("benchmarks/engine_throughput.py", run_name="__main__")
EOF

if has_stage ab; then
  RUNS=()
  for i in $(seq 1 "$REPEATS"); do      # alternating, so that the cache warming and drift fall on both sides
    for side in before after; do
      out="$OUT_DIR/compile_stall_${TAG}_${side}_$i.json"
      script=benchmarks/engine_throughput.py; [ "$side" = before ] && script="$WORK/before.py"
      stage "${side}_$i" 150 "$PY" "$script" --hf-requests 0 --overlap-scheduling on "${BENCH[@]}" --out "$out"
      RUNS+=("$out")
    done
  done
  SMOKE="$SMOKE" "$PY" - "$OUT_DIR/compile_stall_$TAG.json" "${RUNS[@]}" <<'EOF' 2>&1 | tee -a "$LOG"
import json, os, sys
from pathlib import Path
rows = []
for path in sys.argv[2:]:
    side, i = Path(path).stem.rsplit("_", 2)[-2:]
    try:
        r = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        print(f"{side} {i}: no result ({e!r})")
        continue
    split = r["time_split"]
    rows.append(dict(side=side, repeat=int(i), output_tokens_per_s=r["output_tokens_per_s"],
                     prefill_s=split["prefill_s"], decode_s=split["decode_s"], longest_step_s=split["longest_step_s"],
                     longest_step_index=split.get("longest_step_index"), triton_compiles=r.get("triton_compiles"),
                     triton_compile_s=r.get("triton_compile_s"), triton_compiled_kernels=r.get("triton_compiled_kernels"),
                     torch_compiles=r.get("torch_compiles")))
    x = rows[-1]
    print(f"{side} {i}: {x['output_tokens_per_s']:,.0f} tok/s, prefill {x['prefill_s']:.3f} s, decode "
          f"{x['decode_s']:.3f} s, longest step {x['longest_step_s']:.3f} s (#{x['longest_step_index']}), "
          f"Triton compiles {x['triton_compiles']} ({x['triton_compile_s'] or 0:.3f} s: "
          f"{x['triton_compiled_kernels']}), torch.compile {x['torch_compiles']}")
    x["slowest_steps"] = split.get("slowest_steps")
    for st in x["slowest_steps"] or ():
        print(f"    step #{st['index']}: {st['seconds']:.4f} s, {st['prefill_tokens']} prefill tokens, "
              f"{st['launch_s']:.4f} s launching")
mean = {s: [x["output_tokens_per_s"] for x in rows if x["side"] == s] for s in ("before", "after")}
ratio = (sum(mean["after"]) / len(mean["after"])) / (sum(mean["before"]) / len(mean["before"])) \
    if mean["after"] and mean["before"] else None
if ratio is not None:
    smoke = os.environ.get("SMOKE") == "1"
    print(f"after / before, mean output tok/s: {ratio:.3f}x"
          + (" (--smoke: the tiny model on a CPU, which runs no Triton kernel: not a measurement)" if smoke else ""))
Path(sys.argv[1]).write_text(json.dumps(dict(runs=rows, after_over_before=ratio), indent=2) + "\n")
EOF
fi

if has_stage breakdown; then
  if [ "$SMOKE" = 0 ]; then
    stage breakdown 180 "$PY" benchmarks/engine_breakdown.py --out "$OUT_DIR/engine_breakdown_$TAG.json"
  else
    log "=== [breakdown] skipped: it traces CUDA kernels (no GPU with --smoke)"
  fi
fi

gpu_finish gpu_compile_stall
