#!/usr/bin/env bash
# servelab's engine against vLLM 0.26.0 on one H200, same requests and weights, same run: nano-vllm's offline
# benchmark (benchmarks/peer_vllm.py: servelab, vLLM, servelab again) and the Azure conversation slice online, both
# engines timed at an asyncio client (benchmarks/peer_online.py: first 300 requests at 6 req/s, 1,024 KV blocks).
# Or the servelab sides alone on CPU with the tiny test model (--smoke).
#
#   benchmarks/gpu_peer.sh --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv [--out DIR]   # vLLM in /tmp/vsite
#   benchmarks/gpu_peer.sh --smoke [--trace PATH] [--out DIR]
#
# vLLM comes from ../shared/vllm-h200, installed into /tmp/vsite on the machine by the staged calls that
# benchmarks/gpu_vllm_serve.sh's header lists (`--stage` here, then one `--receive .vllmK` call per piece: the
# working tree travels with every call, so the parts go in pieces that fit beside it); this is the next call, on
# the still-warm machine, carrying .gpuwheels (pyzmq for servelab's engine process). VSITE (default /tmp/vsite)
# is put on PYTHONPATH.
# Stages (STAGES, default all): offline (~3 min: three engine starts), online (~3 min: two real-time replays).
# Outputs (--out, default $OUT, else benchmarks/results/peer): gpu_peer.log, peer_vllm_<tag>.json,
# peer_online_<tag>.json. Knobs: STAGES, VSITE, MAX_REQUESTS, RATE_RPS, VLLM_REPEATS (offline vLLM runs, 1), OVERLAP (on: servelab's overlap scheduling,
# the default, as vLLM's async scheduling is on by its default; off: servelab's synchronous loop).
set -uo pipefail

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_peer benchmarks/results/peer "$0" "$@"
select_stages "offline online"
MAX_REQUESTS="${MAX_REQUESTS:-300}"; RATE_RPS="${RATE_RPS:-6}"; OVERLAP="${OVERLAP:-on}"

if [ "$SMOKE" = 1 ]; then
  TAG=cpu_tiny_smoke
  OFFLINE=(--preset tiny --device cpu --engines servelab --num-requests 4 --min-len 8 --max-len 32 --repeats 1)
  ONLINE=(--preset tiny --device cpu --engines servelab --max-requests 8 --rate-rps 20 --max-model-len 512
          --num-kvcache-blocks 256)
else
  TAG=h200
  VSITE="${VSITE:-/tmp/vsite}"
  export PYTHONPATH="$VSITE${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
  if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
    log "!!! vLLM does not import from $VSITE: run the install calls of benchmarks/gpu_vllm_serve.sh first"
  fi
  OFFLINE=(); ONLINE=(--max-requests "$MAX_REQUESTS" --rate-rps "$RATE_RPS")
fi
OFFLINE+=(--overlap-scheduling "$OVERLAP" --vllm-repeats "${VLLM_REPEATS:-1}"); ONLINE+=(--overlap-scheduling "$OVERLAP")
log "gpu_peer: smoke=$SMOKE stages='$STAGES' overlap=$OVERLAP out=$OUT_DIR trace=${TRACE:-none}"

if has_stage offline; then
  stage offline 420 "$PY" benchmarks/peer_vllm.py "${OFFLINE[@]}" --out "$OUT_DIR/peer_vllm_$TAG.json"
fi
if has_stage online; then
  if [ -n "$TRACE" ] && [ -f "$TRACE" ]; then
    stage online 420 "$PY" benchmarks/peer_online.py --trace "$TRACE" "${ONLINE[@]}" --out "$OUT_DIR/peer_online_$TAG.json"
  else
    FAILED+=(online); log "!!! [online] skipped: no trace file (give --trace PATH)"
  fi
fi
gpu_finish gpu_peer
