#!/usr/bin/env bash
# The generalization suite's GPU side: fit once on the Azure conversation family, then real replays of workload
# families the fit never saw, each kept (--real-dir) so that every simulated side is re-made on CPU
# (python -m experiments.generalize). Or the same stages on CPU with the tiny test model (--smoke).
#
#   STAGES="fit prefill_heavy" benchmarks/gpu_generalize.sh --trace PATH/AzureLLMInferenceTrace_conv.csv [--out DIR]
#   STAGES="decode_heavy prefix_share" benchmarks/gpu_generalize.sh [--out DIR]
#   benchmarks/gpu_generalize.sh --smoke [--trace PATH] [--out DIR]        # CPU, tiny model, every stage
#
# Stages (STAGES, default: all but calib_mixed, busy_chunked and host_breakdown; each logs, and a failing stage never
# stops the next):
#   fit            a random-weight Qwen3-0.6B checkpoint (as gpu_validate.sh), the profile grid up to
#                  PROFILE_MAX_MODEL_LEN (16,384), a calibration replay (Azure conversation, requests CAL_SKIP.., vllm_swap),
#                  the same replay with overlap scheduling (CAL_OVERLAP_POLICIES, vllm_swap and sarathi: device seconds
#                  for the device model only, whole prompts and chunks), the fit on the tables           -> profile_<tag>.{csv,json}, calib steps in the archive
#   calib_prefix   calibration replays with prefix hits: a synthetic shared-prefix workload (CAL_PREFIX_POLICIES,
#                  synchronous and overlapped), steps tables for the fit on CPU   -> calib steps in the archive
#   calib_busy     the Azure conversation family again, later requests (CAL_BUSY_SKIP..) at CAL_BUSY_RATE req/s
#                  (default 40), overlapped, vllm: decode batches of 9-64 sequences, which the 6 req/s replays never
#                  reach (at most 8), for the device model on CPU   -> calib_overlap steps (_busy) in the archive;
#                  and sarathi: chunks carrying 44-59 decodes, which price the riding decodes' keys past 8,192 a step
#                  (mixed_decode_rest_over; one table a policy, _busy_<policy>; CAL_BUSY_POLICIES=vllm: the decodes only)
#   calib_mixed    (only when named) the shared-prefix calibration workload with more groups (fresh prefixes) and
#                  outputs of 32-320 tokens, overlapped, sarathi: chunks at 1-8k context carrying 3-16 decodes of
#                  2-8k context, which the other replays hardly reach (their chunks carry 1-2 long decodes or several
#                  short ones)   -> calib_overlap steps (_mixed) in the archive. A diagnostic of the mixed-step
#                  terms: in the device fit it made the suite worse (docs/validation.md, h100_1206c)
#   prefill_heavy  prompts 2,000-7,400 tokens, outputs 16-64, Poisson
#   decode_heavy   prompts 16-128, outputs 300-800, Poisson, a KV cache small enough to preempt
#   prefix_share   Mooncake's synthetic trace (rows 3,780..), shared prefix blocks, rate-scaled
#   bursty         gamma arrivals with cv 3.5, prompts 100-2,000, outputs 50-400
#   priority       two priority classes (30% / 70%), prompts 200-1,500, outputs 50-300
#   busy_chunked   (only when named) Poisson 25 req/s, prompts 200-2,000, outputs 100-500, a cache that holds them:
#                  tens of requests decoding at once, so chunked steps carry tens of riding decodes, a regime the
#                  other families and the calibration replays (at most 16) never reach
#   host_breakdown (only when named) HOST_BREAKDOWN_RUNS (family:blocks[:policy] ..., default prefill_heavy fcfs at
#                  its 768 KV blocks and at 6,144, prefix_share fcfs), each once, overlapped, with
#                  benchmarks/host_breakdown.py's timers: where a step's host seconds before its launch go, against
#                  the cache's cached-free blocks   -> host_breakdown_<family>_<blocks>[_<policy>].parquet
# Every workload replays fcfs, vllm, vllm+chunked (chunked prefill on), vllm_swap and two of sjf / srpt / mlfq /
# sarathi / priority, REPEATS times each (default 2: the real-vs-real floor), with the scheduler's decisions
# recorded; nothing is simulated here. Outputs (--out, default $OUT, else benchmarks/results/generalize):
# gpu_generalize.log, profile_<tag>.{csv,json} (fit stage), real_<stages>.tgz (real/<workload>/ for
# `experiments.generalize --real-root`, and the calibration replay's steps).
# Knobs (environment): STAGES, REPEATS, MAX_WALL_S, CAL_REQUESTS, CAL_SKIP, CAL_BLOCKS (512: the
# calibration replays preempt and swap, which a cache of 1,024 blocks never did at 6 req/s), CAL_POLICIES
# (vllm_swap,sarathi: the fit sees chunked steps too; a comma list replays each), CAL_OVERLAP_POLICIES
# (vllm_swap,sarathi: swaps' device seconds too; empty: none), CAL_PREFIX_POLICIES (vllm,sarathi; empty: none),
# CAL_BUSY_RATE, CAL_BUSY_SKIP, CAL_BUSY_REQUESTS, CAL_BUSY_BLOCKS, CAL_BUSY_POLICIES (vllm,sarathi; a comma list),
# HOST_BREAKDOWN_RUNS, CLOCK_LOG (0: no GPU clock samples), PROFILE_MAX_MODEL_LEN, CKPT (reuse a checkpoint
# directory), POLICIES (a comma list replacing every workload's policies), OVERLAP=1 (the workload
# replays with overlap scheduling, docs/overlap.md; the saved runs record it and experiments.generalize simulates
# them so; the fit stays on synchronous replays), CALIBRATE=0 (the fit stage profiles and replays but leaves the fit
# itself to CPU, from the archive's tables: it saves a device call's minutes), PROFILE_DUTY (the profile's
# --duty-cycle, default the profiler's 0.5), PROFILE_UNPACED=1 (the grid timed a second time back to back),
# PROFILE_LAYOUT=0 (no profile_<tag>_layout.csv: a few shapes on contiguous and on scattered KV blocks, not fitted),
# DEADLINE_S (a workload is skipped, and logged so, when EST_WL_S more seconds, default 200, the H100's ~170-200 s a
# family, would run the script past it: a device call's archive is written before its limit).
set -uo pipefail

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_generalize benchmarks/results/generalize "$0" "$@"
select_stages "fit calib_prefix calib_busy calib_mixed prefill_heavy decode_heavy prefix_share bursty priority busy_chunked host_breakdown" \
  "calib_mixed busy_chunked host_breakdown"      # these only when named
TRACES_DIR="$(dirname "${TRACE:-shared/traces/x}")"
REPEATS="${REPEATS:-2}"
OVERLAP_FLAG=(); [ "${OVERLAP:-0}" = 1 ] && OVERLAP_FLAG=(--overlap-scheduling)

if [ "$SMOKE" = 1 ]; then
  TAG=cpu_tiny_smoke; DEVICE=cpu; GRID=small; MAX_MODEL_LEN=512; MAX_WALL_S="${MAX_WALL_S:-60}"
  PROFILE_MAX_MODEL_LEN="${PROFILE_MAX_MODEL_LEN:-512}"
  PROFILE_LAYOUT="${PROFILE_LAYOUT:-0}"      # the layout grid's shapes are all longer than the tiny model's window
  CAL=(--target-rate-rps 20 --max-requests "${CAL_REQUESTS:-16}" --num-kvcache-blocks 40 --num-cpu-blocks 40)
  T_CKPT=120; T_PROFILE=120; T_CAL=120; T_REPLAY=120; T_WL=300
  CAL_PREFIX=(--num-kvcache-blocks 64 --workload-set num_requests=10 --workload-set arrival.rate_rps=20
              --workload-set num_groups=2 --workload-set prefix_len.lo=64 --workload-set prefix_len.hi=256
              --workload-set suffix_len.lo=8 --workload-set suffix_len.hi=64 --workload-set output_len.lo=2
              --workload-set output_len.hi=8)
  CAL_MIXED=("${CAL_PREFIX[@]}" --workload-set num_requests=12 --workload-set arrival.rate_rps=30   # later ones win
             --workload-set num_groups=6 --workload-set output_len.lo=4 --workload-set output_len.hi=24)
else
  TAG="$(gpu_card)_qwen3_0p6b";  # the card the files come from (gpu_lib.sh gpu_card)
  DEVICE=cuda; GRID=full; MAX_MODEL_LEN=8192; MAX_WALL_S="${MAX_WALL_S:-40}"
  # the extended grid to 16,384 tokens (290 shapes, ~110 s timed with the duty cycle, priced by the h100_1205c fit, plus ~20 s start-up): covers every context here
  PROFILE_MAX_MODEL_LEN="${PROFILE_MAX_MODEL_LEN:-16384}"
  CAL=(--target-rate-rps 6 --max-requests "${CAL_REQUESTS:-200}" --num-kvcache-blocks "${CAL_BLOCKS:-512}" --num-cpu-blocks 2048)
  T_CKPT=90; T_PROFILE=200; T_CAL=240; T_REPLAY=120; T_WL=330
  # 6 prefixes of 256-7,168 tokens held in 4,096 blocks: hits of 16-448 blocks beside fresh prompts and decodes
  CAL_PREFIX=(--num-kvcache-blocks 4096 --num-cpu-blocks 2048 --workload-set num_requests=120
              --workload-set arrival.rate_rps=8 --workload-set num_groups=6 --workload-set prefix_len.lo=256
              --workload-set prefix_len.hi=7168 --workload-set suffix_len.lo=16 --workload-set suffix_len.hi=768
              --workload-set output_len.lo=16 --workload-set output_len.hi=96)
  # 160 requests at 8 req/s over 60 prefixes (most arrive fresh), outputs long enough that 3-16 decodes of 2-8k keys
  # ride each chunk: ~1,000 mixed steps in ~25 s (simulated with the h100_1206b fit)
  CAL_MIXED=("${CAL_PREFIX[@]}" --workload-set num_requests=160 --workload-set num_groups=60   # later ones win
             --workload-set output_len.lo=32 --workload-set output_len.hi=320)
fi
CAL_SKIP="${CAL_SKIP:-300}"
# several policies: one steps table each (calib_steps_<tag>_<policy>.parquet), all fitted on
CAL_POLICIES="${CAL_POLICIES:-vllm_swap,sarathi}"
# replayed again with overlap scheduling, for the device model only (empty: none)
CAL_OVERLAP_POLICIES="${CAL_OVERLAP_POLICIES-vllm_swap,sarathi}"
# the shared-prefix calibration replay's policies (empty: none)
CAL_PREFIX_POLICIES="${CAL_PREFIX_POLICIES-vllm,sarathi}"

# workload_flags NAME: the validate flags of one family (prompts, outputs, arrivals, KV cache, policies).
workload_flags() {
  if [ "$SMOKE" = 1 ]; then
    case "$1" in
      prefill_heavy) echo "--num-requests 10 --arrival poisson --rate-rps 20 --prompt-len 200:400 --output-len 2:6 --num-kvcache-blocks 48 --policies fcfs,vllm,vllm+chunked,vllm_swap,sjf,sarathi" ;;
      decode_heavy) echo "--num-requests 10 --arrival poisson --rate-rps 20 --prompt-len 8:32 --output-len 20:40 --num-kvcache-blocks 12 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,mlfq" ;;
      prefix_share) echo "--trace $TRACES_DIR/synthetic_trace.jsonl --skip-requests 3780 --max-requests 10 --target-rate-rps 20 --num-kvcache-blocks 96 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,sarathi" ;;
      bursty) echo "--num-requests 10 --arrival gamma --cv 3.5 --rate-rps 20 --prompt-len 16:128 --output-len 4:24 --num-kvcache-blocks 32 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,mlfq" ;;
      priority) echo "--num-requests 12 --arrival poisson --rate-rps 30 --prompt-len 16:128 --output-len 4:24 --priority-classes 0:0.3,1:0.7 --num-kvcache-blocks 24 --policies fcfs,vllm,vllm+chunked,vllm_swap,priority,sjf" ;;
      busy_chunked) echo "--num-requests 12 --arrival poisson --rate-rps 40 --prompt-len 16:128 --output-len 8:24 --num-kvcache-blocks 64 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,sarathi" ;;
    esac
  else
    case "$1" in
      prefill_heavy) echo "--num-requests 150 --arrival poisson --rate-rps 12 --prompt-len 2000:7400 --output-len 16:64 --num-kvcache-blocks 768 --policies fcfs,vllm,vllm+chunked,vllm_swap,sjf,sarathi" ;;
      decode_heavy) echo "--num-requests 120 --arrival poisson --rate-rps 10 --prompt-len 16:128 --output-len 300:800 --num-kvcache-blocks 384 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,mlfq" ;;
      prefix_share) echo "--trace $TRACES_DIR/synthetic_trace.jsonl --skip-requests 3780 --max-requests 170 --target-rate-rps 14 --num-kvcache-blocks 6144 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,sarathi" ;;
      bursty) echo "--num-requests 120 --arrival gamma --cv 3.5 --rate-rps 10 --prompt-len 100:2000 --output-len 50:400 --num-kvcache-blocks 1024 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,mlfq" ;;
      priority) echo "--num-requests 240 --arrival poisson --rate-rps 20 --prompt-len 200:1500 --output-len 50:300 --priority-classes 0:0.3,1:0.7 --num-kvcache-blocks 768 --policies fcfs,vllm,vllm+chunked,vllm_swap,priority,sjf" ;;
      busy_chunked) echo "--num-requests 200 --arrival poisson --rate-rps 25 --prompt-len 200:2000 --output-len 100:500 --num-kvcache-blocks 4096 --policies fcfs,vllm,vllm+chunked,vllm_swap,srpt,sarathi" ;;
    esac
  fi
}

log "gpu_generalize: smoke=$SMOKE device=$DEVICE stages='$STAGES' repeats=$REPEATS out=$OUT_DIR trace=${TRACE:-none}"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"

# The checkpoint (every call: a fresh machine holds nothing; CKPT reuses one) --------------------------------------
CKPT="${CKPT:-$WORK/model}"     # CKPT=/tmp/DIR keeps it for the next call on a still-warm machine
[ -f "$CKPT/config.json" ] || make_checkpoint "$CKPT" "$T_CKPT"

mkdir -p "$WORK/real"
TABLE="$OUT_DIR/profile_$TAG.csv"
# fit: profile grid, calibration replay on the Azure conversation family, fit ---------------------------------------
if has_stage fit; then
  stage profile "$T_PROFILE" "$PY" -m experiments.profile --model "$CKPT" --out "$TABLE" --device "$DEVICE" \
    --grid "$GRID" --max-model-len "$PROFILE_MAX_MODEL_LEN" ${PROFILE_DUTY:+--duty-cycle "$PROFILE_DUTY"}
  # a few shapes on contiguous and on scattered KV blocks (--grid layout): does the layout move a step's time? Not fitted
  if [ "${PROFILE_LAYOUT:-1}" = 1 ]; then
    stage profile_layout 90 "$PY" -m experiments.profile --model "$CKPT" --out "${TABLE%.csv}_layout.csv" \
      --device "$DEVICE" --grid layout --max-model-len "$PROFILE_MAX_MODEL_LEN" ${PROFILE_DUTY:+--duty-cycle "$PROFILE_DUTY"}
  fi
  # PROFILE_UNPACED=1: the grid again with its steps back to back (--duty-cycle 1), beside the paced one
  if [ "${PROFILE_UNPACED:-0}" = 1 ]; then
    stage profile_unpaced "$T_PROFILE" "$PY" -m experiments.profile --model "$CKPT" --out "${TABLE%.csv}_unpaced.csv" \
      --device "$DEVICE" --grid "$GRID" --max-model-len "$PROFILE_MAX_MODEL_LEN" --duty-cycle 1
  fi
  CAL_STEPS="$WORK/real/calib_steps_$TAG.parquet"
  if [ -n "$TRACE" ] && [ -f "$TRACE" ]; then
    stage calib_replay "$((T_REPLAY * $(echo "$CAL_POLICIES" | tr ',' '\n' | wc -l)))" "$PY" -m experiments.validate --model "$CKPT" --device "$DEVICE" \
      --trace "$TRACE" --skip-requests "$CAL_SKIP" "${CAL[@]}" --max-model-len "$MAX_MODEL_LEN" --policies "$CAL_POLICIES" \
      --max-wall-s "$MAX_WALL_S" --no-roofline --out-dir "$WORK" --name calib --steps-out "$CAL_STEPS"
  else
    FAILED+=(calib_replay); log "!!! [calib_replay] skipped: no trace file (give --trace PATH)"
  fi
  HW="$([ "$SMOKE" = 1 ] && echo cpu || echo H200)"
  MODEL_NAME="$([ "$SMOKE" = 1 ] && echo tiny-qwen3 || echo Qwen3-0.6B-random)"
  # the same requests with overlap scheduling: their device seconds (steps back to back) for the device model
  if [ -n "$CAL_OVERLAP_POLICIES" ] && [ -n "$TRACE" ] && [ -f "$TRACE" ]; then
    stage calib_overlap "$((T_REPLAY * $(echo "$CAL_OVERLAP_POLICIES" | tr ',' '\n' | wc -l)))" "$PY" -m experiments.validate \
      --model "$CKPT" --device "$DEVICE" --trace "$TRACE" --skip-requests "$CAL_SKIP" "${CAL[@]}" \
      --max-model-len "$MAX_MODEL_LEN" --policies "$CAL_OVERLAP_POLICIES" --overlap-scheduling --max-wall-s "$MAX_WALL_S" \
      --no-roofline --out-dir "$WORK" --name calib_overlap --steps-out "$WORK/real/calib_overlap_steps_$TAG.parquet"
  fi
  CAL_INPUTS=("$TABLE")
  for f in "$WORK"/real/calib_steps_"$TAG"*.parquet; do [ -f "$f" ] && CAL_INPUTS+=("$f"); done
  DEVICE_INPUTS=()
  for f in "$WORK"/real/calib_overlap_steps_"$TAG"*.parquet; do [ -f "$f" ] && DEVICE_INPUTS+=("$f"); done
  if [ "${CALIBRATE:-1}" = 1 ]; then
    stage calibrate "$T_CAL" "$PY" -m experiments.calibrate "${CAL_INPUTS[@]}" --out "$OUT_DIR/profile_$TAG.json" \
      --hardware "$HW" --model "$MODEL_NAME" ${DEVICE_INPUTS[@]:+--device-tables "${DEVICE_INPUTS[@]}"}
  else
    log "calibrate skipped (CALIBRATE=0): fit on CPU from the archive's tables (experiments.calibrate)"
  fi
fi

# calib_prefix: prefix hits, from a synthetic shared-prefix workload (conf/workload/shared_prefix.yaml; no family of
# the suite is generated so), synchronous and overlapped: the host's work per cached block at admission. Its tables
# join the fit's on CPU (experiments.calibrate; the fit stage's own calibrate step runs without them)
if has_stage calib_prefix && [ -n "$CAL_PREFIX_POLICIES" ]; then
  n_pol=$(echo "$CAL_PREFIX_POLICIES" | tr ',' '\n' | wc -l)
  for mode in "" overlap; do      # synchronous (the host terms), then overlapped (device seconds, launches)
    stage "calib_prefix${mode:+_$mode}" "$((T_REPLAY * n_pol))" "$PY" -m experiments.validate --model "$CKPT" \
      --device "$DEVICE" --workload shared_prefix "${CAL_PREFIX[@]}" --max-model-len "$MAX_MODEL_LEN" \
      --policies "$CAL_PREFIX_POLICIES" ${mode:+--overlap-scheduling} --max-wall-s "$MAX_WALL_S" --no-roofline \
      --no-plot --out-dir "$WORK" --name "calib_prefix${mode:+_$mode}" \
      --steps-out "$WORK/real/calib${mode:+_$mode}_steps_${TAG}_prefix.parquet"
  done
fi

# calib_busy: the calibration family at a rate whose decode batches reach 9-64 sequences (the 6 req/s replays stay at
# 8 or fewer, so a fit's graph-16 and graph-32 costs rested on the grid's few rows); overlapped, for the device model
if has_stage calib_busy; then
  if [ -n "$TRACE" ] && [ -f "$TRACE" ]; then
    stage calib_busy "$T_REPLAY" "$PY" -m experiments.validate --model "$CKPT" --device "$DEVICE" --trace "$TRACE" \
      --skip-requests "${CAL_BUSY_SKIP:-600}" "${CAL[@]}" --target-rate-rps "${CAL_BUSY_RATE:-40}" \
      --max-requests "${CAL_BUSY_REQUESTS:-$([ "$SMOKE" = 1 ] && echo 16 || echo 400)}" \
      --num-kvcache-blocks "${CAL_BUSY_BLOCKS:-$([ "$SMOKE" = 1 ] && echo 64 || echo 4096)}" \
      --max-model-len "$MAX_MODEL_LEN" --policies "${CAL_BUSY_POLICIES:-vllm,sarathi}" --overlap-scheduling --max-wall-s "$MAX_WALL_S" \
      --no-roofline --no-plot --out-dir "$WORK" --name calib_busy --steps-out "$WORK/real/calib_overlap_steps_${TAG}_busy.parquet"
  else
    FAILED+=(calib_busy); log "!!! [calib_busy] skipped: no trace file (give --trace PATH)"
  fi
fi

# calib_mixed: chunks carrying several long decodes (mixed steps' device seconds), overlapped, for the device model
if has_stage calib_mixed; then
  stage calib_mixed "$T_REPLAY" "$PY" -m experiments.validate --model "$CKPT" --device "$DEVICE" \
    --workload shared_prefix "${CAL_MIXED[@]}" --max-model-len "$MAX_MODEL_LEN" --policies sarathi --overlap-scheduling \
    --max-wall-s "$MAX_WALL_S" --no-roofline --no-plot --out-dir "$WORK" --name calib_mixed \
    --steps-out "$WORK/real/calib_overlap_steps_${TAG}_mixed.parquet"
fi

# the workload families: real replays only, kept for experiments.generalize --------------------------------------
for wl in $STAGES; do     # in the order STAGES names them (DEADLINE_S skips the last ones)
  case "$wl" in fit|calib_prefix|calib_busy|calib_mixed|host_breakdown) continue ;; esac
  has_stage "$wl" || continue
  fits_deadline "$wl" "${EST_WL_S:-200}" || continue
  # shellcheck disable=SC2046
  stage "$wl" "$T_WL" "$PY" -m experiments.validate --model "$CKPT" --device "$DEVICE" $(workload_flags "$wl") \
    --max-model-len "$MAX_MODEL_LEN" --num-cpu-blocks 2048 --repeats "$REPEATS" --record-decisions --no-roofline --no-plot \
    --max-wall-s "$MAX_WALL_S" --out-dir "$WORK/real/$wl" --name "$wl" --real-dir "$WORK/real/$wl" "${OVERLAP_FLAG[@]}" \
    ${POLICIES:+--policies "$POLICIES"}
done

# host_breakdown: a diagnostic of the fit's host terms, not a family (files beside the log, not in the archive)
if has_stage host_breakdown; then
  for run in ${HOST_BREAKDOWN_RUNS:-prefill_heavy:768 prefill_heavy:6144 prefix_share:6144}; do
    IFS=: read -r wl blocks policy <<< "$run"    # --num-kvcache-blocks and --policies after the family's own: they win
    name="host_breakdown_${wl}_$blocks${policy:+_$policy}"
    # shellcheck disable=SC2046
    stage "$name" "$T_REPLAY" "$PY" benchmarks/host_breakdown.py --out "$OUT_DIR/$name.parquet" -- \
      --model "$CKPT" --device "$DEVICE" $(workload_flags "$wl") --num-kvcache-blocks "$blocks" \
      --policies "${policy:-fcfs}" --max-model-len "$MAX_MODEL_LEN" --num-cpu-blocks 2048 --no-roofline --no-plot \
      --max-wall-s "$MAX_WALL_S" --overlap-scheduling --out-dir "$WORK/host_breakdown" --name "$name"
  done
fi

# One archive (a device run returns at most 8 files): real/<workload>/ (runs, repeats, reports) and the calib steps.
archive_real "experiments.generalize --real-root real"
gpu_finish gpu_generalize
