#!/usr/bin/env bash
# The prefix cache's CPU tier on one H200, against the calibrated simulator: the CUDA copy tests, a profile
# grid with the tier's offload / load shapes, a calibration replay with the tier on, the fit, then real
# replays with the tier off and on, each simulated (roofline and calibrated) and compared request by request
# (experiments.validate). Or the same stages on CPU with the tiny test model (--smoke).
#
#   benchmarks/gpu_tier.sh [--out DIR]                    # H200: random-weight Qwen3-0.6B (two calls: ~5 + ~7 min)
#   COMPACT=1 benchmarks/gpu_tier.sh [--out DIR]          # H200, one call of ~4.5 min (every stage limit: 540 s)
#   STAGES="validate" CKPT=/tmp/ckpt PROFILE=DIR/profile_tier_h200.json benchmarks/gpu_tier.sh --out DIR
#   benchmarks/gpu_tier.sh --smoke [--out DIR]            # CPU, tiny model, every stage, small sizes
#   COMPACT=1 benchmarks/gpu_tier.sh --smoke [--out DIR]  # CPU, the compact plan's path
#
# Stages (STAGES, default all; each logs, and a failing stage never stops the next):
#   pytest    tests/engine/test_cpu_tier.py with the GPU tests (chunked side-stream offload bit-exact, greedy tokens)
#   fit       profile grid up to 16,384 tokens (tier_out / tier_in shapes included), a calibration replay of a
#             document-reuse trace with the tier on (seed 1), the fit on both      -> profile_tier_<tag>.{csv,json}
#   validate  a document-reuse trace (benchmarks/doc_reuse_trace.py, seed 0: 32 documents of 3,584 tokens, a
#             working set of 7,168 blocks over a GPU cache of 2,048 and a tier of 16,384) replayed with the tier
#             off and on, vllm, each against the roofline and the fit           -> validation_tier_{off,on}.json
#   mooncake  the Mooncake conversation trace (first 400 requests at 4 req/s, max_model_len 16,384) with the tier
#             on (16,384 blocks, 28 GiB of host memory)                          -> validation_tier_mooncake.json
# Outputs (--out, default $OUT, else benchmarks/results/tier): gpu_tier.log, the profile and fit, the reports
# and overlay plots. Knobs (environment): STAGES, CKPT (reuse a checkpoint), PROFILE (a fit for validate alone),
# MAX_WALL_S, BASE_TABLE (a profile table of the same GPU and model made elsewhere: the profile stage then times
# only `--grid tier`, the tier's copy shapes and their decode batch, and the fit reads both tables), DOC_REQUESTS
# and DOC_RATE_RPS (both document-reuse traces), MOON_REQUESTS, PYTEST_K (a pytest -k selection, test_cpu_tier.py
# alone).
# COMPACT=1 sets defaults for one call: STAGES "pytest fit validate", BASE_TABLE the generalization suite's
# benchmarks/results/generalize/profile_h200_generalize.csv (no tier rows), 150 requests at 8 req/s (52% of prompt
# tokens from the tier, predicted), PYTEST_K bit_exact (the CPU round trip and the CUDA chunked side-stream
# offload; the CUDA greedy-token test repeats the CPU one), MAX_WALL_S 60 and stage limits that sum to 510 s.
set -uo pipefail

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_tier benchmarks/results/tier "$0" "$@"
COMPACT="${COMPACT:-0}"
[ "$COMPACT" = 1 ] && STAGES="${STAGES:-pytest fit validate}"
select_stages "pytest fit validate mooncake"
TRACES_DIR="$(dirname "${TRACE:-../shared/traces/x}")"

if [ "$SMOKE" = 1 ]; then
  TAG=cpu_tiny_smoke; DEVICE=cpu; GRID=small; MAX_MODEL_LEN=512; MAX_WALL_S="${MAX_WALL_S:-120}"
  # the tiny model's 512 positions: one 512-token block per document, clipped to fit with its question
  DOCS=(--docs 4 --doc-blocks 1); DOC_REQ=24; DOC_RATE=20; GPU_BLOCKS=40; TIER_BLOCKS=160
  MOON=(--max-requests 40 --target-rate-rps 20 --num-kvcache-blocks 40); PYTEST_MARK="not gpu"
  T_CKPT=120; T_TEST=300; T_PROFILE=300; T_REPLAY=300; T_FIT=120
  [ "$COMPACT" = 1 ] && BASE_TABLE="${BASE_TABLE-$WORK/profile_base_$TAG.csv}"
else
  TAG=h200; DEVICE=cuda; GRID=full; MAX_MODEL_LEN=16384
  MAX_WALL_S="${MAX_WALL_S:-$([ "$COMPACT" = 1 ] && echo 60 || echo 150)}"
  DOCS=(--docs 32 --doc-blocks 7); DOC_REQ=300; DOC_RATE=4; GPU_BLOCKS=2048; TIER_BLOCKS=16384
  MOON_REQ=400; PYTEST_MARK="gpu or not gpu"
  T_CKPT=90; T_TEST=180; T_PROFILE=240; T_REPLAY=240; T_FIT=120
  if [ "$COMPACT" = 1 ]; then
    # predicted (calibrated simulator, the generalization fit): each doc-reuse replay drains in 21 s; engine start
    # ~25 s, a tier grid ~35 s with the runner's start: ~270 s in all, within these limits (60+60+90+90+30+90+90)
    DOC_REQ=150; DOC_RATE=8; MOON_REQ=120     # mooncake (only when STAGES names it): 31 s of replay, predicted
    BASE_TABLE="${BASE_TABLE-benchmarks/results/generalize/profile_h200_generalize.csv}"
    T_CKPT=60; T_TEST=60; T_PROFILE=90; T_REPLAY=90; T_FIT=30
  fi
fi
DOC_REQ="${DOC_REQUESTS:-$DOC_REQ}"; DOC_RATE="${DOC_RATE_RPS:-$DOC_RATE}"
[ "$SMOKE" = 1 ] || MOON=(--max-requests "${MOON_REQUESTS:-$MOON_REQ}" --target-rate-rps 4 --num-kvcache-blocks 4096)
[ "$COMPACT" = 1 ] && PYTEST_K="${PYTEST_K-bit_exact}"
PYTEST_FILES=(tests/engine/test_cpu_tier.py tests/engine/test_cpu_cache.py)
PYTEST_SEL=()
if [ -n "${PYTEST_K:-}" ]; then PYTEST_FILES=(tests/engine/test_cpu_tier.py); PYTEST_SEL=(-k "$PYTEST_K"); fi

log "gpu_tier: smoke=$SMOKE compact=$COMPACT device=$DEVICE stages='$STAGES' out=$OUT_DIR doc_requests=$DOC_REQ \
doc_rate_rps=$DOC_RATE base_table=${BASE_TABLE:-none}"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
[ "$DEVICE" = cuda ] && grep -E "MemTotal|MemAvailable" /proc/meminfo | tee -a "$LOG"

if has_stage pytest; then
  stage pytest "$T_TEST" "$PY" -m pytest -q -p no:cacheprovider -rA -m "$PYTEST_MARK" "${PYTEST_SEL[@]}" \
    "${PYTEST_FILES[@]}"
fi

CKPT="${CKPT:-$WORK/model}"
if has_stage fit || has_stage validate || has_stage mooncake; then
  [ -f "$CKPT/config.json" ] || make_checkpoint "$CKPT" "$T_CKPT"
fi
# The document-reuse traces: seed 1 for the calibration replay, seed 0 for the validation.
"$PY" benchmarks/doc_reuse_trace.py --out "$WORK/docs_cal.jsonl" "${DOCS[@]}" --requests "$DOC_REQ" \
  --rate-rps "$DOC_RATE" --seed 1 | tee -a "$LOG"
"$PY" benchmarks/doc_reuse_trace.py --out "$WORK/docs.jsonl" "${DOCS[@]}" --requests "$DOC_REQ" \
  --rate-rps "$DOC_RATE" --seed 0 | tee -a "$LOG"
COMMON=(--model "$CKPT" --device "$DEVICE" --max-model-len "$MAX_MODEL_LEN" --policies vllm --max-wall-s "$MAX_WALL_S"
        --num-cpu-blocks 0)

PROFILE="${PROFILE:-$OUT_DIR/profile_tier_$TAG.json}"
if has_stage fit; then
  TABLE="$OUT_DIR/profile_tier_$TAG.csv"
  BASE=()
  if [ -n "${BASE_TABLE:-}" ]; then
    if [ "$SMOKE" = 1 ] && [ ! -f "$BASE_TABLE" ]; then    # the CPU stand-in for the table made elsewhere
      stage base_profile "$T_PROFILE" "$PY" -m experiments.profile --model "$CKPT" --out "$BASE_TABLE" \
        --device "$DEVICE" --grid small --max-model-len "$MAX_MODEL_LEN"
    fi
    if [ -f "$BASE_TABLE" ]; then GRID=tier; BASE=("$BASE_TABLE")
    else FAILED+=(base_table); log "!!! BASE_TABLE=$BASE_TABLE not found: profiling the $GRID grid instead"; fi
  fi
  stage profile "$T_PROFILE" "$PY" -m experiments.profile --model "$CKPT" --out "$TABLE" --device "$DEVICE" \
    --grid "$GRID" --max-model-len "$MAX_MODEL_LEN"
  CAL_STEPS="$WORK/calib_steps_tier.parquet"
  stage calib_replay "$T_REPLAY" "$PY" -m experiments.validate "${COMMON[@]}" --trace "$WORK/docs_cal.jsonl" \
    --num-kvcache-blocks "$GPU_BLOCKS" --cpu-cache-num-blocks "$TIER_BLOCKS" --no-roofline --no-plot \
    --out-dir "$WORK" --name calib --steps-out "$CAL_STEPS"
  CAL_INPUTS=("${BASE[@]}" "$TABLE")
  [ -f "$CAL_STEPS" ] && CAL_INPUTS+=("$CAL_STEPS")
  HW="$([ "$SMOKE" = 1 ] && echo cpu || echo H200)"
  MODEL_NAME="$([ "$SMOKE" = 1 ] && echo tiny-qwen3 || echo Qwen3-0.6B-random)"
  stage calibrate "$T_FIT" "$PY" -m experiments.calibrate "${CAL_INPUTS[@]}" --out "$PROFILE" --hardware "$HW" \
    --model "$MODEL_NAME"
fi

FIT=()
[ -f "$PROFILE" ] && FIT=(--profile "$PROFILE")
if has_stage validate; then
  for tier in off on; do
    blocks=0; [ "$tier" = on ] && blocks="$TIER_BLOCKS"
    stage "validate_$tier" "$T_REPLAY" "$PY" -m experiments.validate "${COMMON[@]}" "${FIT[@]}" \
      --trace "$WORK/docs.jsonl" --num-kvcache-blocks "$GPU_BLOCKS" --cpu-cache-num-blocks "$blocks" \
      --out-dir "$OUT_DIR" --name "tier_$tier"
  done
fi
if has_stage mooncake; then
  MOONCAKE="$TRACES_DIR/conversation_trace.jsonl"
  [ -f "$MOONCAKE" ] || MOONCAKE="shared/traces/conversation_trace.jsonl"
  if [ -f "$MOONCAKE" ]; then
    stage mooncake "$T_REPLAY" "$PY" -m experiments.validate "${COMMON[@]}" "${FIT[@]}" --trace "$MOONCAKE" "${MOON[@]}" \
      --cpu-cache-num-blocks "$TIER_BLOCKS" --out-dir "$OUT_DIR" --name tier_mooncake
  else
    FAILED+=(mooncake); log "!!! [mooncake] skipped: no conversation_trace.jsonl beside --trace or in shared/traces"
  fi
fi
gpu_finish gpu_tier
