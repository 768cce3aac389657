#!/usr/bin/env bash
# Overlap scheduling on one H200 (docs/overlap.md): the CUDA correctness check (overlap tokens == synchronous
# tokens on a random-weight Qwen3-0.6B, greedy, CUDA graphs on and off, chunked prefill, prefix cache, seeded
# sampling; EOS and preemption reported) and the offline benchmark (nano-vllm's workload) with the synchronous
# loop, then with overlap scheduling. Or the same on CPU with the tiny test model (--smoke).
#
#   benchmarks/gpu_overlap.sh [--out DIR]                 # H200
#   benchmarks/gpu_overlap.sh --smoke [--out DIR]         # CPU, tiny model, small sizes
#
# Stages (STAGES, default all; each logs, and a failing stage never stops the next):
#   check       benchmarks/gpu_overlap_check.py on a random-weight Qwen3-0.6B      -> overlap_check_<tag>.json
#   throughput  benchmarks/engine_throughput.py --overlap-scheduling both (256 requests of 100-1,024 prompt and
#               output tokens, temperature 0.6; no transformers baseline)        -> engine_throughput_overlap_<tag>.json
# Both are merged into one file, overlap_<tag>.json (check, throughput off / on, speedup). Outputs (--out, default
# $OUT, else benchmarks/results/overlap): gpu_overlap.log and the three JSON files. Knobs (environment): STAGES,
# CKPT (reuse a checkpoint), SKIP_EAGER=1 (the check without its second, eager engine).
set -uo pipefail

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_overlap benchmarks/results/overlap "$0" "$@"
select_stages "check throughput"

if [ "$SMOKE" = 1 ]; then
  TAG=cpu_tiny_smoke; DEVICE=cpu
  CHECK=(--num-requests 6 --max-len 40)
  BENCH=(--preset tiny --device cpu --dtype float32 --num-requests 4 --min-len 8 --max-len 32)
  T_CKPT=120; T_CHECK=300; T_BENCH=300
else
  TAG=h200; DEVICE=cuda
  CHECK=(--num-requests 48 --max-len 384)
  [ "${SKIP_EAGER:-0}" = 1 ] && CHECK+=(--skip-eager)
  BENCH=()
  T_CKPT=90; T_CHECK=420; T_BENCH=420
fi

log "gpu_overlap: smoke=$SMOKE device=$DEVICE stages='$STAGES' out=$OUT_DIR"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"

CHECK_OUT="$OUT_DIR/overlap_check_$TAG.json"
BENCH_OUT="$OUT_DIR/engine_throughput_overlap_$TAG.json"
if has_stage check; then
  CKPT="${CKPT:-$WORK/model}"
  [ -f "$CKPT/config.json" ] || make_checkpoint "$CKPT" "$T_CKPT"
  stage check "$T_CHECK" "$PY" benchmarks/gpu_overlap_check.py --model "$CKPT" --device "$DEVICE" "${CHECK[@]}" \
    --out "$CHECK_OUT"
fi
if has_stage throughput; then
  stage throughput "$T_BENCH" "$PY" benchmarks/engine_throughput.py "${BENCH[@]}" --overlap-scheduling both \
    --hf-requests 0 --out "$BENCH_OUT"
fi

"$PY" - "$CHECK_OUT" "$BENCH_OUT" "$OUT_DIR/overlap_$TAG.json" <<'PYEOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
check, bench, out = (Path(p) for p in sys.argv[1:])
load = lambda p: json.loads(p.read_text()) if p.is_file() else None
c, b = load(check), load(bench)
merged = dict(check=c, throughput=None if b is None else dict(
    off_tokens_per_s=b.get("output_tokens_per_s"), on_tokens_per_s=(b.get("overlap_on") or {}).get("output_tokens_per_s"),
    speedup=b.get("overlap_speedup"), off_time_split=b.get("time_split"),
    on_time_split=(b.get("overlap_on") or {}).get("time_split"), gpu=b.get("gpu"), commit=b.get("commit"),
    command=b.get("command")))
out.write_text(json.dumps(merged, indent=2) + "\n")
t = merged["throughput"] or {}
print(f"overlap: check ok={None if c is None else c['ok']} failed={None if c is None else c['failed']}; "
      f"throughput off {t.get('off_tokens_per_s')} on {t.get('on_tokens_per_s')} tok/s, speedup {t.get('speedup')}")
PYEOF
gpu_finish gpu_overlap
