#!/usr/bin/env bash
# The HTTP serving benchmark on one GPU: servelab-serve on a random-weight Qwen3-0.6B, driven by a standard load
# generator (guidellm) and by `servelab backend=http` on the Azure conversation slice (first MAX_REQUESTS=300 requests
# at RATE_RPS=6), against the in-process replay of the same slice (`servelab backend=engine`), in one run. Prints and
# writes the ratios: HTTP TTFT p50 over in-process (goal <= 1.05) and HTTP output throughput over in-process (goal
# within 2%). Or the same stages on CPU with the tiny test model (--smoke).
#
#   benchmarks/gpu_serve.sh --trace PATH/AzureLLMInferenceTrace_conv.csv [--out DIR]
#   benchmarks/gpu_serve.sh --smoke [--trace PATH] [--out DIR]        # CPU, tiny model, 12 requests, ~2 minutes
#   benchmarks/gpu_serve.sh --download-wheels                         # here: the wheels the GPU machine lacks
#
# Stages (each logs, and a failing stage never stops the next):
#   checkpoint  random-weight Qwen3-0.6B (as gpu_validate.sh), plus a byte-level tokenizer covering its vocabulary
#               (tests/experiments/byte_tokenizer.py: the server detokenizes what it samples, guidellm makes text)
#   inproc      servelab backend=engine on the slice (warm-up first; the engine in this process), REPEATS times
#   serve       servelab-serve (python -m experiments.serve) on the same checkpoint and limits, in the background,
#               once per engine layout of ENGINES (default "process thread": serve.engine_process=true, the
#               default, then false; process_spinW: the engine process with serve.spin_window_ms=W, e.g.
#               process_spin0, the receivers blocking); each layout gets the next three stages, its files named
#               _<layout> but the first's;
#               SERVER_URL=http://... skips it and uses that server instead (vLLM's, say)
#   loadgen     benchmarks/loadgen.py: guidellm, LOADGEN_REQUESTS at RATE_RPS, 256-token prompts, 128-token outputs
#               (also the server's warm-up before the timed replay)
#   http        servelab backend=http on the slice against the server (token-id prompts, ignore_eos), REPEATS times
#   compare     the ratios of the first runs, from their summary.json, and each side's spread over its repeats
#                                                                                 -> serve_compare.json
#   hops        benchmarks/serve_hops.py: a server of its own (the engine process) with time stamps at every hop,
#               150 streamed requests one at a time (1,000-token prompts; smoke: 400), each hop's median and what
#               the HTTP path adds to a first token -> serve_hops.json (HOPS=0 skips it); then again with each
#               serve.spin_window_ms of HOPS_SPIN_MS (default "0": the receivers block, as before the setting)
#               -> serve_hops_spin0.json, ...; the two alternate HOPS_REPEATS times (default 1; k > 1: _rk names)
#   wakeup      benchmarks/wakeup_latency.py: one message between two processes, ZeroMQ or a plain Unix socket,
#               the receiver blocked or spinning -> wakeup_latency.json (~40 s; WAKEUP=0 skips it)
# Outputs (--out, default $OUT, else benchmarks/results/serve): gpu_serve.log, serve_compare.json, loadgen.json,
# guidellm.json, server.log, server_metrics.txt (a /metrics scrape after the replay), runs_serve.tgz (every run's
# folder: requests.parquet, summary.json, config.yaml); the second layout's as serve_compare_thread.json, ...
# Knobs (environment): REPEATS (default 1; 2 gives each side's run-to-run spread, ~2 more minutes on the H200), HOPS,
# HOPS_SPIN_MS, HOPS_REPEATS, WAKEUP,
# ENGINES (default "process thread"; "process" alone saves ~2 minutes on the H200), MAX_REQUESTS, RATE_RPS,
# MAX_MODEL_LEN, LOADGEN_REQUESTS, PORT, SERVER_URL, CKPT (reuse a checkpoint directory), SERVER_START_S (seconds to
# wait for /health).
#
# The GPU machine has no fastapi, uvicorn, prometheus_client, pydantic, pyzmq, aiohttp, guidellm and their dependencies (nor simpy, hydra-core): carry
# them as wheels in .gpuwheels/ (git ignores it), made here by `benchmarks/gpu_serve.sh --download-wheels`
# (Python 3.12 manylinux wheels, ~10 MB); gpu_lib.sh installs them there.
set -uo pipefail

if [ "${1:-}" = --download-wheels ]; then
  cd "$(dirname "$0")/.." || exit 2
  mkdir -p .gpuwheels
  PIP=(python3 -m pip download -q --no-deps -d .gpuwheels)
  "${PIP[@]}" --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    simpy==4.1.2 hydra-core==1.3.8 omegaconf==2.3.0 hydra-joblib-launcher==1.2.0 joblib==1.6.0 \
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 prometheus_client==0.26.0 \
    pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 click==8.4.2 \
    guidellm==0.8.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 sanic==25.12.1 sanic-routing==23.12.0 sniffio==1.3.1 \
    html5tagger==2.0.0 tracerite==2.6.5 ujson==6.1.0 websockets==17.4 Faker==40.63.0 tzdata==2026.6 ftfy==6.3.1 \
    wcwidth==0.9.4 culsans==0.10.0 aiologic==0.17.1 loguru==0.7.3 eval_type_backport==0.4.0 \
    more-itertools==11.2.1 pydantic-settings==2.16.3 python-dotenv==1.2.4 h2==4.4.1 hpack==4.2.0 \
    hyperframe==6.1.0 opentelemetry-api==1.45.2 pyzmq==27.3.0 \
    aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==6.9.1 \
    propcache==0.5.4 yarl==1.25.1 idna==3.20 || exit 1
  "${PIP[@]}" antlr4-python3-runtime==4.9.3 || exit 1     # a source archive; it builds offline
  du -sh .gpuwheels; ls .gpuwheels | wc -l
  exit 0
fi

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_serve benchmarks/results/serve "$0" "$@"

serve_settings 120
PORT="${PORT:-8011}"
REPEATS="${REPEATS:-1}"
ENGINES="${ENGINES:-process thread}"
URL="${SERVER_URL:-http://127.0.0.1:$PORT}"
log "gpu_serve: smoke=$SMOKE device=$DEVICE requests=$MAX_REQUESTS rate=$RATE_RPS max_model_len=$MAX_MODEL_LEN" \
    "url=$URL engines=$ENGINES out=$OUT_DIR trace=${TRACE:-none}"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
if [ -z "$TRACE" ] || [ ! -f "$TRACE" ]; then
  log "!!! no trace file (give --trace PATH/AzureLLMInferenceTrace_conv.csv)"; exit 2
fi
TRACE="$(cd "$(dirname "$TRACE")" && pwd)/$(basename "$TRACE")"

CKPT="${CKPT:-$WORK/model}"
make_serving_checkpoint "$CKPT" "$T_CKPT" "$VOCAB"

# The slice, the same for both replays: the same ids, arrivals, lengths and prompt token ids. Repeat k draws its
# prompt token ids from root seed k - 1 on both sides: a repeat against the same server would otherwise find the
# last repeat's prompts in its prefix cache (a fresh in-process engine never does).
SLICE=(workload=azure "workload.path=$TRACE" "workload.max_requests=$MAX_REQUESTS" "workload.target_rate_rps=$RATE_RPS"
       "max_model_len=$MAX_MODEL_LEN" plots=false progress=false)

INPROC_DIRS=()
for k in $(seq 1 "$REPEATS"); do
  stage "inproc$k" "$T_RUN" "$PY" -m experiments.run backend=engine "backend.model_path=$CKPT" \
    "backend.device=$DEVICE" "${SLICE[@]}" "seed=$((k - 1))" "hydra.run.dir=$WORK/runs/inproc$k"
  INPROC_DIRS+=("$WORK/runs/inproc$k")
done

# One server per engine layout (ENGINES, default "process thread": the engine in its own process, the default of
# servelab-serve, then in a thread of the server's process), each given the loadgen and http stages and compared
# with the same in-process runs. The first layout's files keep the plain names, the others' carry _<layout>.
FIRST_LAYOUT=""
for LAYOUT in $ENGINES; do
  SPIN_ARG=()
  case "$LAYOUT" in process) ENGINE_PROCESS=true ;; thread) ENGINE_PROCESS=false ;;
    process_spin[0-9]*) ENGINE_PROCESS=true; SPIN_ARG=("serve.spin_window_ms=${LAYOUT#process_spin}") ;;
    *) log "!!! ENGINES: unknown layout $LAYOUT (process | process_spinW | thread)"; FAILED+=("engines"); continue ;;
  esac
  if [ -z "$FIRST_LAYOUT" ]; then FIRST_LAYOUT=$LAYOUT; SUF=""; else SUF="_$LAYOUT"; fi
  [ -n "${SERVER_URL:-}" ] && SUF=""
  SERVER_PID=""
  if [ -z "${SERVER_URL:-}" ]; then
    log "=== [serve$SUF] $(date -u +%H:%M:%S): python -m experiments.serve serve.engine_process=$ENGINE_PROCESS${SPIN_ARG[*]:+ ${SPIN_ARG[*]}} on $URL" \
        "(log: server$SUF.log)"
    "$PY" -m experiments.serve "backend.model_path=$CKPT" "backend.device=$DEVICE" "max_model_len=$MAX_MODEL_LEN" \
      serve.host=127.0.0.1 "serve.port=$PORT" "serve.engine_process=$ENGINE_PROCESS" "${SPIN_ARG[@]}" > "$OUT_DIR/server$SUF.log" 2>&1 &
    SERVER_PID=$!
  fi
  ready=0; t_serve=$SECONDS
  for _ in $(seq 1 "$SERVER_START_S"); do
    if "$PY" -c "import httpx,sys; sys.exit(httpx.get('$URL/health', timeout=2).status_code != 200)" 2>/dev/null; then
      ready=1; break
    fi
    [ -n "$SERVER_PID" ] && ! kill -0 "$SERVER_PID" 2>/dev/null && break
    sleep 1
  done
  HTTP_DIRS=()
  if [ "$ready" = 1 ]; then
    log "=== [serve$SUF] ready after $((SECONDS - t_serve))s"
    stage "loadgen$SUF" "$T_LOADGEN" "$PY" benchmarks/loadgen.py --url "$URL" --tokenizer "$CKPT" --rate-rps "$RATE_RPS" \
      --num-requests "$LOADGEN_REQUESTS" "${LOADGEN[@]}" --max-seconds 120 --out "$WORK/loadgen$SUF"
    cp "$WORK/loadgen$SUF/loadgen.json" "$OUT_DIR/loadgen$SUF.json" 2>/dev/null
    cp "$WORK/loadgen$SUF/guidellm.json" "$OUT_DIR/guidellm$SUF.json" 2>/dev/null
    tail -n 30 "$WORK/loadgen$SUF/guidellm.log" >> "$LOG" 2>/dev/null
    for k in $(seq 1 "$REPEATS"); do
      stage "http$k$SUF" "$T_RUN" "$PY" -m experiments.run backend=http "backend.url=$URL" "model.vocab_size=$VOCAB" \
        "${SLICE[@]}" "seed=$((k - 1))" "hydra.run.dir=$WORK/runs/http$k$SUF"
      HTTP_DIRS+=("$WORK/runs/http$k$SUF")
    done
    "$PY" -c "import httpx; print(httpx.get('$URL/metrics', timeout=10).text)" > "$OUT_DIR/server_metrics$SUF.txt" 2>&1
  else
    FAILED+=("serve$SUF"); log "!!! [serve$SUF] $URL/health did not answer within ${SERVER_START_S}s; server$SUF.log ends:"
    tail -n 20 "$OUT_DIR/server$SUF.log" 2>/dev/null | tee -a "$LOG"
  fi
  if [ -n "$SERVER_PID" ]; then
    kill -INT "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  stage "compare$SUF" 60 "$PY" benchmarks/serve_compare.py --inproc "${INPROC_DIRS[@]}" \
    --http "${HTTP_DIRS[@]:-$WORK/runs/http1$SUF}" \
    --loadgen "$OUT_DIR/loadgen$SUF.json" --out "$OUT_DIR/serve_compare$SUF.json" --device "$TAG" \
    --command "ENGINES=$ENGINES benchmarks/gpu_serve.sh $* (serve.engine_process=$ENGINE_PROCESS${SPIN_ARG[*]:+ ${SPIN_ARG[*]}})"
  [ -n "${SERVER_URL:-}" ] && break       # someone else's server: one layout, theirs
done

if [ "${HOPS:-1}" = 1 ]; then
  HOPS_PROMPT=1000; [ "$SMOKE" = 1 ] && HOPS_PROMPT=400
  # the default spin window (serve.spin_window_ms unset) against each of HOPS_SPIN_MS, alternating, so that a drift
  # of the host over the minutes falls on both
  for r in $(seq 1 "${HOPS_REPEATS:-1}"); do
    RS=""; [ "$r" -gt 1 ] && RS="_r$r"
    stage "hops$RS" 300 "$PY" benchmarks/serve_hops.py --model-path "$CKPT" --device "$DEVICE" \
      --prompt-len "$HOPS_PROMPT" --vocab-size "$VOCAB" --out "$OUT_DIR/serve_hops$RS.json"
    for W in ${HOPS_SPIN_MS:-0}; do
      stage "hops_spin$W$RS" 300 "$PY" benchmarks/serve_hops.py --model-path "$CKPT" --device "$DEVICE" \
        --prompt-len "$HOPS_PROMPT" --vocab-size "$VOCAB" --serve-arg "serve.spin_window_ms=$W" \
        --out "$OUT_DIR/serve_hops_spin$W$RS.json"
    done
  done
fi
if [ "${WAKEUP:-1}" = 1 ]; then
  stage wakeup 120 "$PY" benchmarks/wakeup_latency.py --out "$OUT_DIR/wakeup_latency.json"
fi

if [ -d "$WORK/runs" ]; then
  tar czf "$OUT_DIR/runs_serve.tgz" -C "$WORK" runs && log "the runs' folders in $OUT_DIR/runs_serve.tgz"
fi
gpu_finish gpu_serve
