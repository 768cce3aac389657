#!/usr/bin/env bash
# vLLM 0.26.0's OpenAI server beside servelab-serve on one GPU, both driven by the same clients: guidellm
# (benchmarks/loadgen.py) and `servelab backend=http` on the Azure conversation slice (first MAX_REQUESTS=300 requests
# at RATE_RPS=6), on the same random-weight Qwen3-0.6B and the same limits, in one run. Writes serve_peers.json: both
# servers' client-side TTFT / TPOT / E2E p50 and p90 and throughput, and vLLM over servelab. Or servelab's side alone
# on CPU with the tiny test model (--smoke; vLLM's build is CUDA-only, so its part is skipped and says so).
#
#   benchmarks/gpu_vllm_serve.sh --trace PATH/AzureLLMInferenceTrace_conv.csv [--out DIR]   # GPU, vLLM in VSITE
#   benchmarks/gpu_vllm_serve.sh --smoke [--trace PATH] [--out DIR]                         # CPU, ~30 s
#   benchmarks/gpu_vllm_serve.sh --download-wheels     # here: the server's wheels the GPU image lacks -> .vllmserve/
#   benchmarks/gpu_vllm_serve.sh --stage [VLLM_DIR]    # here: vLLM + wheels in pieces -> .vllm1/ .. .vllmN/
#   benchmarks/gpu_vllm_serve.sh --receive .vllmK      # GPU: keep piece K; with all N, install vLLM into VSITE
#
# vLLM on the GPU machine (no network there). VLLM_DIR (default ../shared/vllm-h200) holds the pruned vLLM 0.26.0
# tree (xzpart.00 + xzpart.01, 66 MiB), deps/ (the 19 wheels of its offline path, 16 MiB); .vllmserve/ adds what
# `vllm serve` imports beyond them: uvicorn, httptools, watchfiles, prometheus-fastapi-instrumentator,
# model-hosting-container-standards, jmespath, prometheus_client (1.4 MiB). A device call carries at most 64 MiB with
# the working tree, and the tree is ~39 MiB, so --stage tars all of it and splits it into pieces that fit beside the
# tree (4 today), one a call, and prints the calls. The chain (the machine stays warm ~30 s between calls, and /tmp
# with it; a fresh machine needs the chain again):
#   here:    bash benchmarks/gpu_vllm_serve.sh --download-wheels && bash benchmarks/gpu_vllm_serve.sh --stage
#   call k:  carry [".vllmK"]; command: bash benchmarks/gpu_vllm_serve.sh --receive .vllmK     (k = 1 .. N; the last
#            one joins the pieces, checks their sha256, unpacks into VSITE=/tmp/vsite, installs the wheels there and
#            imports vLLM's API server, or exits 1 saying what is missing)
#   then:    carry [".gpuwheels", ".gtraces"]; command (PATH: the carried copy of the trace, ../shared stays behind):
#            bash benchmarks/gpu_vllm_serve.sh --trace PATH/AzureLLMInferenceTrace_conv.csv --out $OUT
#
# Stages of a run (each logs, and a failing stage never stops the next; the vLLM import is checked first and a run
# without it stops at once, exit 3):
#   checkpoint  random-weight Qwen3-0.6B plus a byte-level tokenizer covering its vocabulary (as gpu_serve.sh)
#   vllm        `python3 -m vllm.entrypoints.cli.main serve` (the `vllm serve` command) on it, PYTHONPATH=VSITE only
#   servelab    `python -m experiments.serve` on it, with .gpuwheels' packages (as gpu_serve.sh)
#   each server, once /health answers: loadgen (guidellm, LOADGEN_REQUESTS at RATE_RPS, also the warm-up), http
#               (`servelab backend=http`, token-id prompts, ignore_eos), a /metrics scrape; then it is stopped
#   compare     benchmarks/serve_peers.py                                             -> serve_peers.json
# The same limits on both: max_model_len MAX_MODEL_LEN (4096), max_num_seqs MAX_NUM_SEQS (256), tokens per step
# MAX_BATCHED_TOKENS (8192, servelab's derived value with chunked prefill off), KV_BLOCKS blocks of 16 tokens (16384,
# i.e. 262,144 tokens: no preemption on this slice; vLLM's --num-gpu-blocks-override; KV_BLOCKS=auto leaves each to
# its 0.9 of GPU memory), prefix caching on, chunked prefill CHUNKED_PREFILL (off); vLLM also --generation-config vllm
# (no sampling defaults from the checkpoint's generation_config.json, as on servelab-serve). OVERLAP=on|off sets vLLM's
# async scheduling and servelab's overlap_scheduling alike (unset: each its own default; servelab's is off).
# Outputs (--out, default $OUT, else benchmarks/results/vllm_serve): gpu_vllm_serve.log, serve_peers.json,
# loadgen_NAME.json, guidellm_NAME.json, server_NAME.log, metrics_NAME.txt, runs_vllm_serve.tgz (the replays' folders).
# Knobs (environment): VSITE, VLLM_PYTHON (python3), MAX_REQUESTS, RATE_RPS, LOADGEN_REQUESTS, MAX_MODEL_LEN,
# MAX_NUM_SEQS, MAX_BATCHED_TOKENS, KV_BLOCKS, CHUNKED_PREFILL, OVERLAP, SERVERS ("vllm servelab"), BUDGET_S (570: a
# server that could not finish by then is skipped), VLLM_START_S (300), SERVER_START_S (240), CKPT (a checkpoint).
set -uo pipefail

HERE_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VSITE="${VSITE:-/tmp/vsite}"
VSTAGE="${VSTAGE:-/tmp/vstage}"
LIMIT_MIB="${LIMIT_MIB:-64}"       # what one device call may carry, the working tree included
MARGIN_MIB="${MARGIN_MIB:-2}"
# What `vllm serve` imports beyond the H200 image and deps/ (probed: docs/serving.md, "vLLM beside it").
SERVE_WHEELS=(uvicorn==0.54.0 httptools==0.9.0 watchfiles==1.3.0 prometheus-fastapi-instrumentator==8.1.0
              model-hosting-container-standards==0.1.16 jmespath==1.1.0 prometheus_client==0.26.0)
VLLM_ENV=(VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1)
IMPORT_CHECK="
import vllm, uvicorn, h11, click, uvloop, httptools, watchfiles, prometheus_client, prometheus_fastapi_instrumentator
import model_hosting_container_standards, fastapi, starlette, openai
import vllm.entrypoints.openai.api_server, vllm.entrypoints.cli.main, vllm.entrypoints.cli.serve
print('vllm', vllm.__version__, 'from', vllm.__file__, '; uvicorn', uvicorn.__version__, '; fastapi', fastapi.__version__)
"

# git ignores the carried folders (a worktree's info/exclude is its main checkout's)
ignore_path() {
  local exclude; exclude="$(git rev-parse --git-path info/exclude)" || exit 2
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "$1" "$exclude" 2>/dev/null || echo "$1" >> "$exclude"
}

VPY="${VLLM_PYTHON:-python3}"     # the image's python3, which holds torch
vllm_python() { env -u PYTHONPATH "${VLLM_ENV[@]}" PYTHONPATH="$VSITE" "$VPY" "$@"; }

if [ "${1:-}" = --download-wheels ]; then
  cd "$HERE_ROOT" || exit 2
  mkdir -p .vllmserve/wheels
  ignore_path '/.vllmserve/'
  python3 -m pip download -q --no-deps -d .vllmserve/wheels --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "${SERVE_WHEELS[@]}" || exit 1
  du -sh .vllmserve/wheels; ls .vllmserve/wheels
  exit 0
fi

if [ "${1:-}" = --stage ]; then
  cd "$HERE_ROOT" || exit 2
  VLLM_DIR="${2:-../shared/vllm-h200}"
  for f in "$VLLM_DIR/xzpart.00" "$VLLM_DIR/deps"; do
    [ -e "$f" ] || { echo "error: $f: not found (give the folder of the vLLM parts: --stage VLLM_DIR)" >&2; exit 2; }
  done
  ls .vllmserve/wheels/*.whl >/dev/null 2>&1 || { echo "error: .vllmserve/wheels is empty: run --download-wheels first" >&2; exit 2; }
  ignore_path '/.vllm[0-9]*/'
  rm -rf .vllm[0-9]*/
  # what travels with every call: tracked and untracked-not-ignored files
  tree_b=$(git ls-files -z -c -o --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  piece_b="${PIECE_BYTES:-$(( (LIMIT_MIB - MARGIN_MIB) * 1048576 - tree_b ))}"
  if [ -z "${PIECE_BYTES:-}" ] && [ "$piece_b" -lt 4194304 ]; then
    echo "error: the working tree is $((tree_b / 1048576)) MiB: less than 4 MiB a call would be left for the pieces" >&2
    exit 2
  fi
  bundle="$(mktemp -d "${TMPDIR:-/tmp}/vllmbundle.XXXXXX")"
  mkdir -p "$bundle/b/deps" "$bundle/b/serve"
  cat "$VLLM_DIR"/xzpart.* > "$bundle/b/vllm.tar.xz"
  cp "$VLLM_DIR"/deps/*.whl "$bundle/b/deps/"
  cp .vllmserve/wheels/*.whl "$bundle/b/serve/"
  tar cf "$bundle/bundle.tar" -C "$bundle/b" .
  sha=$(sha256sum "$bundle/bundle.tar" | cut -d' ' -f1)
  bytes=$(stat -c %s "$bundle/bundle.tar")
  split -b "$piece_b" -d -a 2 "$bundle/bundle.tar" "$bundle/bundle.part."
  parts=("$bundle"/bundle.part.*)
  n=${#parts[@]}
  k=0
  for p in "${parts[@]}"; do
    k=$((k + 1))
    mkdir -p ".vllm$k"
    mv "$p" ".vllm$k/"
    printf 'pieces %s\nsha256 %s\nbytes %s\n' "$n" "$sha" "$bytes" > ".vllm$k/bundle.manifest"
  done
  rm -rf "$bundle"
  echo "working tree $((tree_b / 1048576)) MiB; bundle $((bytes / 1048576)) MiB (sha256 $sha) in $n pieces of at most" \
       "$((piece_b / 1048576)) MiB: $(du -sh .vllm[0-9]* | tr '\t\n' ': ')"
  gw_b=$(du -cb .gpuwheels .gtraces 2>/dev/null | tail -1 | cut -f1)
  echo "the run's call carries .gpuwheels + .gtraces: $(( (tree_b + gw_b) / 1048576 )) MiB with the tree (limit $LIMIT_MIB)"
  echo "device calls, one after the other (kind nvidia-h200; the machine must stay warm between them):"
  for k in $(seq 1 "$n"); do
    echo "  carry [\".vllm$k\"]  command: bash benchmarks/gpu_vllm_serve.sh --receive .vllm$k"
  done
  echo "  carry [\".gpuwheels\", \".gtraces\"]  command: bash benchmarks/gpu_vllm_serve.sh --trace" \
       ".gtraces/AzureLLMInferenceTrace_conv.csv --out \$OUT"
  exit 0
fi

if [ "${1:-}" = --receive ]; then
  cd "$HERE_ROOT" || exit 2
  src="${2:-}"
  if [ -z "$src" ] || [ ! -f "$src/bundle.manifest" ]; then
    echo "error: --receive $src: no bundle.manifest there (give a folder --stage made, e.g. --receive .vllm1)" >&2
    exit 2
  fi
  mkdir -p "$VSTAGE"
  cp "$src"/bundle.part.* "$src/bundle.manifest" "$VSTAGE/" || exit 1
  n=$(awk '$1 == "pieces" {print $2}' "$VSTAGE/bundle.manifest")
  sha=$(awk '$1 == "sha256" {print $2}' "$VSTAGE/bundle.manifest")
  have=$(find "$VSTAGE" -maxdepth 1 -name 'bundle.part.*' | wc -l)
  echo "piece $(basename "$src"/bundle.part.*) kept in $VSTAGE: $have of $n pieces there"
  if [ "$have" -lt "$n" ]; then exit 0; fi
  cat "$VSTAGE"/bundle.part.* > "$VSTAGE/bundle.tar"
  got=$(sha256sum "$VSTAGE/bundle.tar" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "error: the joined pieces' sha256 is $got, not $sha: a piece is from another --stage; stage again" >&2
    rm -f "$VSTAGE/bundle.tar"; exit 1
  fi
  rm -rf "$VSTAGE/b" && mkdir -p "$VSTAGE/b" "$VSITE" && tar xf "$VSTAGE/bundle.tar" -C "$VSTAGE/b" || exit 1
  rm -f "$VSTAGE/bundle.tar" "$VSTAGE"/bundle.part.*
  "$VPY" -c "import sys, tarfile; tarfile.open(sys.argv[1], mode='r:xz').extractall(sys.argv[2])" \
    "$VSTAGE/b/vllm.tar.xz" "$VSITE" || exit 1
  wheels=("$VSTAGE"/b/deps/*.whl "$VSTAGE"/b/serve/*.whl)
  if [ -e "${wheels[0]}" ]; then
    "$VPY" -m pip install -q --no-index --no-deps --no-compile --target "$VSITE" --upgrade "${wheels[@]}" || exit 1
  fi
  rm -rf "$VSTAGE/b"
  if ! vllm_python -c "$IMPORT_CHECK"; then
    echo "error: vLLM's API server does not import from $VSITE (the line above names what is missing)" >&2; exit 1
  fi
  echo "vLLM installed in $VSITE; next: bash benchmarks/gpu_vllm_serve.sh --trace PATH --out \$OUT"
  exit 0
fi

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_vllm_serve benchmarks/results/vllm_serve "$0" "$@"

SERVERS="${SERVERS:-vllm servelab}"
for s in $SERVERS; do
  case "$s" in vllm|servelab) ;; *) log "!!! SERVERS: unknown server $s (allowed: vllm servelab)"; exit 2 ;; esac
done
serve_settings 60
KV_BLOCKS="${KV_BLOCKS:-$([ "$SMOKE" = 1 ] && echo 1024 || echo 16384)}"
MAX_NUM_SEQS="${MAX_NUM_SEQS:-256}"; MAX_BATCHED_TOKENS="${MAX_BATCHED_TOKENS:-8192}"
CHUNKED_PREFILL="${CHUNKED_PREFILL:-off}"; OVERLAP="${OVERLAP:-}"
case "$CHUNKED_PREFILL" in on|off) ;; *) log "!!! CHUNKED_PREFILL=$CHUNKED_PREFILL: give on or off"; exit 2 ;; esac
case "$OVERLAP" in on|off|"") ;; *) log "!!! OVERLAP=$OVERLAP: give on, off, or leave it unset"; exit 2 ;; esac
VLLM_START_S="${VLLM_START_S:-300}"; BUDGET_S="${BUDGET_S:-570}"
log "gpu_vllm_serve: smoke=$SMOKE device=$DEVICE servers=[$SERVERS] requests=$MAX_REQUESTS rate=$RATE_RPS" \
    "max_model_len=$MAX_MODEL_LEN max_num_seqs=$MAX_NUM_SEQS max_batched_tokens=$MAX_BATCHED_TOKENS" \
    "kv_blocks=$KV_BLOCKS out=$OUT_DIR trace=${TRACE:-none}"

SKIPPED=()
case " $SERVERS " in
  *" vllm "*)
    if [ "$SMOKE" = 1 ]; then
      SKIPPED+=("vllm=--smoke runs on CPU and this vLLM build is CUDA-only")
      log "=== [vllm] skipped: --smoke runs on CPU and the vLLM 0.26.0 build here is CUDA-only (servelab's side runs)"
    elif ! vllm_python -c "$IMPORT_CHECK" 2>&1 | tee -a "$LOG"; then
      log "!!! vLLM's API server does not import from VSITE=$VSITE: install it first (--stage here, then each" \
          "--receive call on this machine; see this script's header), or SERVERS=servelab for servelab alone"
      rm -rf "$WORK"; exit 3
    fi ;;
esac
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
if [ -z "$TRACE" ] || [ ! -f "$TRACE" ]; then
  log "!!! no trace file (give --trace PATH/AzureLLMInferenceTrace_conv.csv)"; exit 2
fi
TRACE="$(cd "$(dirname "$TRACE")" && pwd)/$(basename "$TRACE")"

CKPT="${CKPT:-$WORK/model}"
mkdir -p "$CKPT" && CKPT="$(cd "$CKPT" && pwd)"      # absolute: vLLM runs from $WORK
make_serving_checkpoint "$CKPT" "$T_CKPT" "$VOCAB"

SLICE=(workload=azure "workload.path=$TRACE" "workload.max_requests=$MAX_REQUESTS" "workload.target_rate_rps=$RATE_RPS"
       "max_model_len=$MAX_MODEL_LEN" plots=false progress=false seed=0)
# the servers' commands: the same limits (this script's header)
VLLM_CMD=("$VPY" -m vllm.entrypoints.cli.main serve "$CKPT" --host 127.0.0.1 --port "${VLLM_PORT:-8012}"
          --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$MAX_BATCHED_TOKENS"
          --block-size 16 --enable-prefix-caching --gpu-memory-utilization 0.9 --generation-config vllm --seed 0
          --disable-uvicorn-access-log)
SERVELAB_CMD=("$PY" -m experiments.serve "backend.model_path=$CKPT" "backend.device=$DEVICE"
              "max_model_len=$MAX_MODEL_LEN" "max_num_seqs=$MAX_NUM_SEQS" "max_num_batched_tokens=$MAX_BATCHED_TOKENS"
              block_size=16 enable_prefix_caching=true serve.host=127.0.0.1 "serve.port=${SERVELAB_PORT:-8011}")
# chunked prefill: off on both by default (servelab's default; vLLM warns that turning it off is not officially supported)
if [ "$CHUNKED_PREFILL" = on ]; then
  VLLM_CMD+=(--enable-chunked-prefill); SERVELAB_CMD+=(enable_chunked_prefill=true)
else
  VLLM_CMD+=(--no-enable-chunked-prefill); SERVELAB_CMD+=(enable_chunked_prefill=false)
fi
# the next step scheduled while this one runs: vLLM's async scheduling (its default on a GPU), servelab's
# overlap_scheduling (off by default); OVERLAP=on / off sets both, unset leaves each at its default
case "$OVERLAP" in
  on) VLLM_CMD+=(--async-scheduling); SERVELAB_CMD+=(overlap_scheduling=true) ;;
  off) VLLM_CMD+=(--no-async-scheduling); SERVELAB_CMD+=(overlap_scheduling=false) ;;
esac
if [ "$KV_BLOCKS" != auto ]; then
  VLLM_CMD+=(--num-gpu-blocks-override "$KV_BLOCKS"); SERVELAB_CMD+=("num_kvcache_blocks=$KV_BLOCKS")
fi

# run_server NAME URL START_S COMMAND...: start it, wait for /health, drive it with both clients, stop it.
run_server() {
  local name="$1" url="$2" start_s="$3"; shift 3
  log "=== [$name] $(date -u +%H:%M:%S): $* (log: server_$name.log)"
  # each server in a process group of its own, so that stopping it stops its children too (vLLM's engine core);
  # vLLM from $WORK with VSITE alone on its path: the repository's folders and .gpuwheels' newer fastapi stay out
  if [ "$name" = vllm ]; then
    (cd "$WORK" && exec setsid env -u PYTHONPATH "${VLLM_ENV[@]}" PYTHONPATH="$VSITE" "$@") \
      > "$OUT_DIR/server_$name.log" 2>&1 &
  else
    setsid "$@" > "$OUT_DIR/server_$name.log" 2>&1 &
  fi
  local pid=$! ready=0 t0=$SECONDS
  for _ in $(seq 1 "$start_s"); do
    if "$PY" -c "import httpx,sys; sys.exit(httpx.get('$url/health', timeout=2).status_code != 200)" 2>/dev/null; then
      ready=1; break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if [ "$ready" = 1 ]; then
    log "=== [$name] ready after $((SECONDS - t0))s"
    stage "loadgen_$name" "$T_LOADGEN" "$PY" benchmarks/loadgen.py --url "$url" --tokenizer "$CKPT" \
      --rate-rps "$RATE_RPS" --num-requests "$LOADGEN_REQUESTS" "${LOADGEN[@]}" --max-seconds 120 \
      --out "$WORK/loadgen_$name"
    cp "$WORK/loadgen_$name/loadgen.json" "$OUT_DIR/loadgen_$name.json" 2>/dev/null
    cp "$WORK/loadgen_$name/guidellm.json" "$OUT_DIR/guidellm_$name.json" 2>/dev/null
    tail -n 20 "$WORK/loadgen_$name/guidellm.log" >> "$LOG" 2>/dev/null
    stage "http_$name" "$T_RUN" "$PY" -m experiments.run backend=http "backend.url=$url" "model.vocab_size=$VOCAB" \
      "${SLICE[@]}" "hydra.run.dir=$WORK/runs/http_$name"
    "$PY" -c "import httpx; print(httpx.get('$url/metrics', timeout=10).text)" > "$OUT_DIR/metrics_$name.txt" 2>&1
  else
    FAILED+=("$name"); log "!!! [$name] $url/health did not answer within ${start_s}s; server_$name.log ends:"
    tail -n 30 "$OUT_DIR/server_$name.log" 2>/dev/null | tee -a "$LOG"
  fi
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null
  # the next server needs the GPU memory this one's processes held
  for _ in $(seq 1 10); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
  log "=== [$name] stopped ($((SECONDS - t0))s in all)"
}

HTTP_ARGS=(); LOADGEN_ARGS=()
for s in $SERVERS; do
  HTTP_ARGS+=(--http "$s=$WORK/runs/http_$s"); LOADGEN_ARGS+=(--loadgen "$s=$OUT_DIR/loadgen_$s.json")
  case " ${SKIPPED[*]:-} " in *" $s="*) continue ;; esac
  # a server needs its start, the load generator and the replay: about 200 s on the H200 for vLLM
  if [ $((SECONDS + 200)) -gt "$BUDGET_S" ]; then
    SKIPPED+=("$s=out of time (BUDGET_S=$BUDGET_S s)"); log "!!! [$s] skipped: ${SECONDS}s gone of BUDGET_S=$BUDGET_S"
    FAILED+=("$s"); continue
  fi
  if [ "$s" = vllm ]; then
    run_server vllm "http://127.0.0.1:${VLLM_PORT:-8012}" "$VLLM_START_S" "${VLLM_CMD[@]}"
  else
    run_server servelab "http://127.0.0.1:${SERVELAB_PORT:-8011}" "$SERVER_START_S" "${SERVELAB_CMD[@]}"
  fi
done

SKIP_ARGS=()
for s in "${SKIPPED[@]}"; do SKIP_ARGS+=(--skipped "$s"); done
REFERENCE=servelab
case " $SERVERS " in *" servelab "*) ;; *) REFERENCE="${SERVERS%% *}" ;; esac
stage compare 60 "$PY" benchmarks/serve_peers.py "${HTTP_ARGS[@]}" "${LOADGEN_ARGS[@]}" "${SKIP_ARGS[@]}" \
  --reference "$REFERENCE" --out "$OUT_DIR/serve_peers.json" --device "$TAG" \
  --command "benchmarks/gpu_vllm_serve.sh $*" --setting "max_model_len=$MAX_MODEL_LEN" \
  --setting "max_num_seqs=$MAX_NUM_SEQS" --setting "max_num_batched_tokens=$MAX_BATCHED_TOKENS" \
  --setting "kv_blocks=$KV_BLOCKS" --setting "block_size=16" --setting "prefix_caching=on" \
  --setting "chunked_prefill=$CHUNKED_PREFILL" --setting "overlap=${OVERLAP:-each its default}" --setting "requests=$MAX_REQUESTS" --setting "rate_rps=$RATE_RPS" \
  --setting "vllm_command=${VLLM_CMD[*]}" --setting "servelab_command=${SERVELAB_CMD[*]}"

if [ -d "$WORK/runs" ]; then
  tar czf "$OUT_DIR/runs_vllm_serve.tgz" -C "$WORK" runs && log "the replays' folders in $OUT_DIR/runs_vllm_serve.tgz"
fi
gpu_finish gpu_vllm_serve
