#!/usr/bin/env bash
# The engine's GPU checks and benchmarks in one run (about 7 minutes on an H200).
#
#   SERVELAB_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_engine.sh [--out DIR]
#
# Stages (each logs to DIR/gpu_engine.log; a failing stage never stops the next):
#   1. engine_throughput.py  nano-vllm's benchmark + transformers baseline + roofline -> engine_throughput_h200.json
#   2. engine_profile.py     where a step's time goes (host phases, kernels)          -> engine_profile_h200.json
#   3. gpu_sampler_check.py  sampling kernel vs torch, and its timing                 -> gpu_sampler_check_h200.json
#   4. gpu_logits_check.py   teacher-forced logits vs transformers                     -> gpu_logits_check_h200.json
#   5. pytest on CUDA        float32 token equality with transformers (tests/engine/test_llm.py -k cuda)
# Outputs go to --out (default: $OUT when set, else benchmarks/results). STAGES="throughput logits" runs a subset.
set -uo pipefail
OUT_DIR="${OUT:-benchmarks/results}"
[ "${1:-}" = "--out" ] && OUT_DIR="$2"
cd "$(dirname "$0")/.."
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_engine.log"
: > "$LOG"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
PY="${PYTHON:-python3}"
# simpy (the simulator's roofline bound) is missing on the GPU image: install the carried wheels when needed
# (GPU_WHEELS: the carried folder, as benchmarks/gpu_lib.sh).
WHEELS="${GPU_WHEELS:-.gpuwheels}"
if ! "$PY" -c "import simpy" 2>/dev/null && ls "$WHEELS"/* >/dev/null 2>&1; then
  SITE="$(mktemp -d)"
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/* 2>&1 | tail -3
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
FAILED=()
STAGES="${STAGES:-throughput profile sampler logits pytest_cuda}"
stage() {   # stage NAME SECONDS command...
  local name="$1" limit="$2"; shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== [$name] $(date -u +%H:%M:%S) (limit ${limit}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && FAILED+=("$name")
  echo "=== [$name] exit $rc after $((SECONDS - t0))s" | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
stage throughput 260 "$PY" benchmarks/engine_throughput.py --hf-requests 64 --out "$OUT_DIR/engine_throughput_h200.json"
stage profile 120 "$PY" benchmarks/engine_profile.py --out "$OUT_DIR/engine_profile_h200.json"
stage sampler 60 "$PY" benchmarks/gpu_sampler_check.py --out "$OUT_DIR/gpu_sampler_check_h200.json"
stage logits 90 "$PY" benchmarks/gpu_logits_check.py --out "$OUT_DIR/gpu_logits_check_h200.json"
stage pytest_cuda 90 "$PY" -m pytest -q -p no:cacheprovider tests/engine/test_llm.py -k cuda
echo "gpu_engine finished in ${SECONDS}s; failed stages: ${FAILED[*]:-none}" | tee -a "$LOG"
[ ${#FAILED[@]} -eq 0 ]
