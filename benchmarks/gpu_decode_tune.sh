#!/usr/bin/env bash
# The paged decode kernel's variants on one H200 or H100 (engine/kernels/decode_variants.py): the sweep, then the offline
# throughput benchmark with the default kernel and with the sweep's table installed in-process (no code edit).
# Or the sweep on CPU in the Triton interpreter (--smoke).
#
#   benchmarks/gpu_decode_tune.sh [--out DIR]            # GPU (<tag> h200, h100): <= ~4.5 min sweep, <= ~4.5 throughput
#   benchmarks/gpu_decode_tune.sh --smoke [--out DIR]    # CPU, tiny shapes, sweep only
#
# Stages (STAGES, default all; each logs, and a failing stage never stops the next):
#   sweep       benchmarks/decode_tune.py: every variant checked against a float32 reference and timed in CUDA
#               graphs of 28 calls on the throughput benchmark's decode batches and small ones
#                                                                      -> decode_tune_<tag>.json (+ .rows.jsonl)
#   throughput  benchmarks/engine_throughput.py (256 requests, 100-1,024 prompt and output tokens, no transformers
#               baseline; overlap scheduling on, OVERLAP=off for the synchronous loop) with the default variant
#               for every batch, then with the sweep's table; skipped when the sweep's table is the default one
#                                                -> engine_throughput_<tag>_default.json, ..._tuned.json
# Outputs (--out, default $OUT, else benchmarks/results/decode_tune): gpu_decode_tune.log and the files above.
# To adopt the result: add the table of decode_tune_<tag>.json's summary.table_line (also printed last by the
# sweep) under the card's name in DECODE_TABLES_BY_CARD (engine/kernels/decode_variants.py). Knobs (environment): STAGES, BUDGET_S (sweep seconds
# after which no new variant starts, default 190), TUNE_JSON (the throughput stage's sweep result when the sweep
# ran in an earlier call, e.g. STAGES=throughput TUNE_JSON=decode_tune_h200.json), REPEATS (default/tuned pairs,
# alternating: _2, _3, ... after the first pair's files; default 1), BASE_TABLE (what the sweep's table is timed
# against: "default", the default variant for every batch, or "committed", the tables on main for this card).
set -uo pipefail

# shellcheck source=benchmarks/gpu_lib.sh
source "$(dirname "$0")/gpu_lib.sh"
gpu_init gpu_decode_tune benchmarks/results/decode_tune "$0" "$@"
select_stages "sweep throughput"

if [ "$SMOKE" = 1 ]; then
  TAG=cpu_smoke; SWEEP=(--smoke); T_SWEEP=300
else
  TAG="$(gpu_card)"; SWEEP=(--budget-s "${BUDGET_S:-190}"); T_SWEEP=280
fi
T_BENCH=140
export OVERLAP="${OVERLAP:-on}"
REPEATS="${REPEATS:-1}"
BASE_TABLE="${BASE_TABLE:-default}"
SWEEP_OUT="$OUT_DIR/decode_tune_$TAG.json"
TUNE="${TUNE_JSON:-$SWEEP_OUT}"

log "gpu_decode_tune: smoke=$SMOKE stages='$STAGES' out=$OUT_DIR"
[ "$SMOKE" = 0 ] && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$LOG"

if has_stage sweep; then
  stage sweep "$T_SWEEP" "$PY" benchmarks/decode_tune.py --out "$SWEEP_OUT" "${SWEEP[@]}"
fi

# $WORK/throughput_with.py TABLE_SOURCE OUT: engine_throughput.py in a process whose decode tables are the committed
# ones ("committed": the card's own, else DECODE_TABLE), the default variant alone ("default") or the sweep's table
# line (a decode_tune JSON) on every card.
cat > "$WORK/throughput_with.py" <<'EOF'
import json, os, runpy, sys
sys.path.insert(0, ".")
import torch
from engine.kernels import decode_variants as dv
source, out = sys.argv[1], sys.argv[2]
if source == "default":
    dv.install(((None, dv.DecodeVariant()),))
elif source != "committed":
    dv.install_line(json.load(open(source))["summary"]["table_line"])
table = dv.table_for_device(torch.cuda.get_device_name() if torch.cuda.is_available() else None)
print("decode table:", [(bound, variant.name) for bound, variant in table], flush=True)
sys.argv = ["benchmarks/engine_throughput.py", "--hf-requests", "0", "--overlap-scheduling", os.environ["OVERLAP"],
            "--out", out]
runpy.run_path("benchmarks/engine_throughput.py", run_name="__main__")
EOF

if has_stage throughput && [ "$SMOKE" = 0 ]; then
  if [ ! -f "$TUNE" ]; then
    FAILED+=(throughput); log "!!! [throughput] skipped: no sweep result $TUNE"
  elif "$PY" -c "import json, sys; t = json.load(open(sys.argv[1]))['summary']['table']; sys.exit(0 if t == [[None, 'default']] else 1)" "$TUNE"; then
    log "=== [throughput] skipped: the sweep's table is the default one (nothing to compare)"
  else
    PAIRS=()
    for i in $(seq 1 "$REPEATS"); do       # alternating, so that drift between runs falls on both sides
      suffix=""; [ "$i" -gt 1 ] && suffix="_$i"
      stage "throughput_default$suffix" "$T_BENCH" "$PY" "$WORK/throughput_with.py" "$BASE_TABLE" "$OUT_DIR/engine_throughput_${TAG}_default$suffix.json"
      stage "throughput_tuned$suffix" "$T_BENCH" "$PY" "$WORK/throughput_with.py" "$TUNE" "$OUT_DIR/engine_throughput_${TAG}_tuned$suffix.json"
      PAIRS+=("$OUT_DIR/engine_throughput_${TAG}_default$suffix.json" "$OUT_DIR/engine_throughput_${TAG}_tuned$suffix.json")
    done
    "$PY" - "${PAIRS[@]}" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
for a_path, b_path in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        a, b = (json.load(open(p))["output_tokens_per_s"] for p in (a_path, b_path))
        print(f"throughput: default {a:,.0f} tok/s, tuned {b:,.0f} tok/s ({b / a:.3f}x)")
    except (OSError, KeyError, ValueError) as e:
        print(f"throughput: no comparison ({e!r})")
EOF
  fi
fi

gpu_finish gpu_decode_tune
