# Shared by the GPU scripts (source it): arguments, folders, carried wheels, logged stages, the checkpoint.
#   gpu_init NAME DEFAULT_OUT "$0" "$@"         sets SMOKE, TRACE, OUT_DIR, ROOT, WORK, LOG, PY (and cd's to ROOT);
#                                              --help prints the script's leading comment block
#   select_stages "ALL" ["ONLY_NAMED"]          sets ALL_STAGES and STAGES (default: all but ONLY_NAMED), refusing an
#                                              unknown one
#   has_stage NAME                              whether NAME is in STAGES
#   stage NAME SECONDS command...              runs under a time limit, logs, never aborts; failures go to FAILED
#   fits_deadline NAME SECONDS                 whether a stage expected to take SECONDS ends before DEADLINE_S (seconds
#                                              since the script began; unset: no deadline); if not, logs it skipped and
#                                              adds it to FAILED, so that a device call's archive is written in time
#   make_checkpoint DIR SECONDS                the tiny test model (SMOKE=1) or a random-weight Qwen3-0.6B
#   make_serving_checkpoint DIR SECONDS VOCAB  the same plus a byte-level tokenizer (servers, load generators)
#   serve_settings LOADGEN_DEFAULT             the serving scripts' sizes and limits (smoke or H200)
#   archive_real HINT                          $WORK/real -> $OUT_DIR/real_<stages>.tgz (HINT: how to read it back)
#   gpu_finish NAME                            logs the failed stages, lists $OUT_DIR, removes $WORK; status 0 iff none failed
#   gpu_card                                   the first GPU's short name for file tags (h200, h100, a100, ...; CARD=...
#                                              overrides it; "gpu" when nvidia-smi names none of those)

gpu_card() {
  if [ -n "${CARD:-}" ]; then echo "$CARD"; return; fi
  local name
  name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  case "$name" in
    *H200*) echo h200 ;; *H100*) echo h100 ;; *A100*) echo a100 ;; *L40S*) echo l40s ;; *B200*) echo b200 ;;
    *) echo gpu ;;
  esac
}

gpu_init() {
  local name="$1" default_out="$2" script="$3"; shift 3
  SMOKE=0; TRACE=""; OUT_DIR="${OUT:-}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --smoke) SMOKE=1; shift ;;
      --trace) TRACE="$2"; shift 2 ;;
      --out) OUT_DIR="$2"; shift 2 ;;
      -h|--help) awk 'NR > 1 { if (!/^#/) exit; print }' "$script"; exit 0 ;;   # the header, line 2 on
      *) echo "unknown argument $1 (allowed: --smoke, --trace PATH, --out DIR)" >&2; exit 2 ;;
    esac
  done
  ROOT="$(cd "$(dirname "$script")/.." && pwd)"
  cd "$ROOT" || exit 2
  OUT_DIR="${OUT_DIR:-$default_out}"
  mkdir -p "$OUT_DIR"
  OUT_DIR="$(cd "$OUT_DIR" && pwd)"
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")"
  LOG="$OUT_DIR/$name.log"
  : > "$LOG"
  export PYTHONUNBUFFERED=1
  PY="${PYTHON:-python3}"
  # The GPU image lacks simpy and hydra-core; install the carried wheels (shared/gpu-wheels/README.md) when needed.
  # GPU_WHEELS names the carried folder (default .gpuwheels): a call that needs no serving stack can carry the four
  # wheels of simpy and hydra alone and leave the device's 64 MiB working tree to the repository's results.
  local wheels="${GPU_WHEELS:-.gpuwheels}"
  if ! "$PY" -c "import simpy, hydra" 2>/dev/null && ls "$wheels"/* >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target "$WORK/site" "$wheels"/* 2>&1 | tail -3
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if [ -z "$TRACE" ]; then
    for cand in ../shared/traces/AzureLLMInferenceTrace_conv.csv shared/traces/AzureLLMInferenceTrace_conv.csv \
                tmp/traces/AzureLLMInferenceTrace_conv.csv; do
      if [ -f "$cand" ]; then TRACE="$cand"; break; fi
    done
  fi
  FAILED=()
  clock_log_start
}

# clock_log_start: on a GPU machine, the GPU's clocks, power and temperature every 250 ms into
# $OUT_DIR/gpu_clocks_${name}.csv for the whole script (the engine's step times drift over seconds; this says whether the
# GPU's clocks move with them). Read only: the GPU's settings are left as they are. CLOCK_LOG=0: no samples (the
# driver queries are off the engine's path, to tell whether they are behind a stall).
clock_log_start() {
  CLOCK_PID=""
  [ "$SMOKE" = 1 ] || [ "${CLOCK_LOG:-1}" = 0 ] && return 0
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  local q="timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"
  if nvidia-smi --query-gpu="$q,clocks_event_reasons.active" --format=csv,noheader >/dev/null 2>&1; then
    q="$q,clocks_event_reasons.active"
  fi
  echo "$q" > "$OUT_DIR/gpu_clocks_${name}.csv"
  nvidia-smi --query-gpu="$q" --format=csv,noheader,nounits -lms 250 >> "$OUT_DIR/gpu_clocks_${name}.csv" 2>/dev/null &
  CLOCK_PID=$!
}

log() { echo "$*" | tee -a "$LOG"; }

select_stages() {
  ALL_STAGES="$1"
  local s default=""
  for s in $ALL_STAGES; do case " ${2:-} " in *" $s "*) ;; *) default="$default${default:+ }$s" ;; esac; done
  STAGES="${STAGES:-$default}"
  for s in $STAGES; do
    case " $ALL_STAGES " in *" $s "*) ;; *) echo "STAGES: unknown stage $s (allowed: $ALL_STAGES)" >&2; exit 2 ;; esac
  done
}

has_stage() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }

fits_deadline() {
  [ -z "${DEADLINE_S:-}" ] && return 0
  [ $((SECONDS + $2)) -le "$DEADLINE_S" ] && return 0
  FAILED+=("$1"); log "!!! [$1] skipped: ${SECONDS}s gone, ~$2s more would pass DEADLINE_S=$DEADLINE_S"
  return 1
}

stage() {
  local name="$1" limit="$2"; shift 2
  log "=== [$name] $(date -u +%H:%M:%S) (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then FAILED+=("$name"); log "!!! [$name] failed (exit $rc) after $((SECONDS - t0))s"
  else log "=== [$name] done in $((SECONDS - t0))s"; fi
}

make_checkpoint() {
  local ckpt="$1" limit="$2"
  if [ "$SMOKE" = 1 ]; then
    stage checkpoint "$limit" "$PY" -c "
import sys; sys.path.insert(0, '.')
from tests.engine.tiny_model import make_tiny_qwen3
make_tiny_qwen3('$ckpt')
print('tiny Qwen3 checkpoint in $ckpt')"
  else
    stage checkpoint "$limit" "$PY" -c "
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
# Qwen3-0.6B's published config.json (huggingface.co/Qwen/Qwen3-0.6B), random weights.
cfg = Qwen3Config(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
                  rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960, bos_token_id=151643,
                  eos_token_id=151645, dtype='bfloat16')
torch.manual_seed(0)
with torch.device('cuda' if torch.cuda.is_available() else 'cpu'):
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained('$ckpt')
print('random Qwen3-0.6B:', sum(p.numel() for p in model.parameters()) / 1e9, 'B params in $ckpt')"
  fi
}

# make_serving_checkpoint DIR SECONDS VOCAB: make_checkpoint plus a byte-level tokenizer covering VOCAB ids
# (tests/experiments/byte_tokenizer.py: a server detokenizes what it samples, load generators make text); none if
# DIR already holds a checkpoint.
make_serving_checkpoint() {
  local ckpt="$1" limit="$2" vocab="$3"
  # a reused checkpoint (CKPT) without a tokenizer gets one: the server detokenizes, guidellm makes text
  [ -f "$ckpt/config.json" ] && [ -f "$ckpt/tokenizer.json" ] && return 0
  [ -f "$ckpt/config.json" ] || make_checkpoint "$ckpt" "$limit"
  stage tokenizer 60 "$PY" -c "
import sys; sys.path.insert(0, '.')
from tests.experiments.byte_tokenizer import make_byte_tokenizer
make_byte_tokenizer('$ckpt', vocab_size=$vocab)
print('byte-level tokenizer ($vocab ids) in $ckpt')"
}

# serve_settings LOADGEN_DEFAULT: the serving scripts' sizes (the Azure slice, the load generator, time limits) for
# SMOKE=1 (the tiny model on CPU) or the H200; each variable an environment value of the same name overrides.
serve_settings() {
  local loadgen_default="$1"
  if [ "$SMOKE" = 1 ]; then
    TAG=cpu_tiny_smoke; DEVICE=cpu; MAX_MODEL_LEN="${MAX_MODEL_LEN:-512}"; VOCAB=512
    MAX_REQUESTS="${MAX_REQUESTS:-12}"; RATE_RPS="${RATE_RPS:-4}"; LOADGEN_REQUESTS="${LOADGEN_REQUESTS:-6}"
    LOADGEN=(--prompt-tokens 32 --output-tokens 8 --workers 1); SERVER_START_S="${SERVER_START_S:-120}"
    T_CKPT=120; T_RUN=200; T_LOADGEN=150
    # one torch thread in every process: on a small shared CPU two threads a process spin against each other and
    # the in-process replay (one process) would pay for it more than a server (its engine loop) does
    export OMP_NUM_THREADS=1
  else
    TAG="$(gpu_card)_qwen3_0p6b"; DEVICE=cuda; MAX_MODEL_LEN="${MAX_MODEL_LEN:-4096}"; VOCAB=151936
    MAX_REQUESTS="${MAX_REQUESTS:-300}"; RATE_RPS="${RATE_RPS:-6}"; LOADGEN_REQUESTS="${LOADGEN_REQUESTS:-$loadgen_default}"
    LOADGEN=(--prompt-tokens 256 --output-tokens 128 --workers 4); SERVER_START_S="${SERVER_START_S:-240}"
    T_CKPT=90; T_RUN=150; T_LOADGEN=150
  fi
}

archive_real() {
  local archive="$OUT_DIR/real_$(echo "$STAGES" | tr ' ' '-').tgz"
  if [ -n "$(ls -A "$WORK/real" 2>/dev/null)" ]; then
    tar czf "$archive" -C "$WORK" real && log "real runs in $archive (tar xzf it; $1)"
  fi
}

gpu_finish() {
  [ -n "${CLOCK_PID:-}" ] && kill "$CLOCK_PID" 2>/dev/null
  log "$1 finished in ${SECONDS}s; failed stages: ${FAILED[*]:-none}"
  ls -la "$OUT_DIR" | tee -a "$LOG"
  rm -rf "$WORK"
  [ ${#FAILED[@]} -eq 0 ]
}
