#!/usr/bin/env bash
# Wall time of one sweep through the joblib launcher (hydra/launcher=local, one worker per core) and through
# SLURM on the one-node local cluster (tests/slurm/local_cluster.sh; one CPU per job, so as many jobs at once as
# cores), the same jobs into fresh folders; then checks that both reports print the same table.
# Needs root, Debian's slurm-wlm and munge, and the slurm extra (pip install -e '.[slurm]').
#   bash benchmarks/slurm_sweep_time.sh          # tests/slurm's sweep: fcfs,vllm x 5,50 req/s, 300 requests each
#   bash benchmarks/slurm_sweep_time.sh experiment=fcfs_vs_preemptive \
#       workload.path=$PWD/../shared/traces/AzureLLMInferenceTrace_conv.csv          # the 35-job preset
# Leaves the cluster running if it was running before, else stops it. PYTHON picks the interpreter; KEEP=1 keeps
# the two sweep folders (a failed run always keeps them, naming them).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
ARGS=("$@")
if [[ ${#ARGS[@]} -eq 0 ]]; then
    ARGS=(experiment=smoke workload.num_requests=300 scheduler=fcfs,vllm workload.arrival.rate_rps=5,50)
fi
CLUSTER=tests/slurm/local_cluster.sh
was_up=0; "$CLUSTER" status >/dev/null 2>&1 && was_up=1
eval "$("$CLUSTER" start)"
OUT="$(mktemp -d)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

sweep() {   # sweep NAME LAUNCHER_ARGS...: runs the sweep into $OUT/NAME, prints its wall time
    local name="$1" t0 t1; shift
    t0=$(date +%s%N)
    (cd "$OUT" && "$PYTHON" -m experiments.run -m "${ARGS[@]}" "$@" "hydra.sweep.dir=$OUT/$name" \
        progress=false print_summary=false plots=false >"$OUT/$name.log" 2>&1) \
        || { echo "the $name sweep failed: $OUT/$name.log" >&2; exit 1; }
    t1=$(date +%s%N)
    local ms=$(( (t1 - t0) / 1000000 ))
    echo "$name: $(ls -d "$OUT/$name"/*/summary.json | wc -l) jobs in $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
}

sweep joblib hydra/launcher=local hydra.launcher.n_jobs="$(nproc)"
sweep slurm hydra/launcher=slurm hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=1
for name in joblib slurm; do
    "$PYTHON" -m experiments.report "$OUT/$name" | sed '/^read /,$d' >"$OUT/$name.table"
done
cmp -s "$OUT/joblib.table" "$OUT/slurm.table" && echo "reports: the same table" \
    || { echo "reports differ: $OUT/joblib.table $OUT/slurm.table" >&2; exit 1; }
[[ $was_up -eq 1 ]] || "$CLUSTER" stop >/dev/null
if [[ "${KEEP:-0}" == 1 ]]; then echo "folders: $OUT"; else rm -rf "$OUT"; fi
