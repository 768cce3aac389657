#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, from the distribution's packages (Debian: slurm-wlm, munge),
# for trying the SLURM sweep launcher without a cluster (tests/slurm/test_slurm_sweep.py uses it).
#
#   tests/slurm/local_cluster.sh start     # start it (or find it running); prints the SLURM_CONF line to export
#   tests/slurm/local_cluster.sh status    # sinfo, exit 0 when the node is up
#   tests/slurm/local_cluster.sh stop      # stop it (nothing running: nothing to do)
#   eval "$(tests/slurm/local_cluster.sh start)" && sbatch --wrap 'hostname' && squeue
#
# Everything lives in one folder, $SERVELAB_SLURM_DIR (default /tmp/servelab-slurm): slurm.conf, its own munge
# key and socket, state, spool and logs, so the machine's /etc/slurm and munged are left alone. Clients find the
# cluster through SLURM_CONF=$SERVELAB_SLURM_DIR/slurm.conf; submitted jobs inherit it.
# Settings that need no cgroups (containers, CI): proctrack/linuxproc, task/none, select/cons_tres with CPUs as
# the consumable; the node's CPUs and memory are what `slurmd -C` reads off the machine. No slurmdbd: finished
# jobs are written by jobcomp/filetxt to $SERVELAB_SLURM_DIR/jobcomp.txt, which `sacct --completion` reads.
# Needs root (slurmd runs jobs as their owner). Ports: $SERVELAB_SLURM_PORT (default 6817) for slurmctld, +1 slurmd.
set -euo pipefail

DIR="${SERVELAB_SLURM_DIR:-/tmp/servelab-slurm}"
PORT="${SERVELAB_SLURM_PORT:-6817}"
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket"
WAIT_S="${SERVELAB_SLURM_WAIT_S:-60}"
export SLURM_CONF="$CONF"

die() { echo "local_cluster.sh: error: $*" >&2; exit 1; }

alive() {   # alive PIDFILE: the process named in it runs
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_state() {   # the node's state as sinfo gives it (idle, mixed, down*, ...), empty when slurmctld does not answer
    timeout 5 sinfo -h -N -o '%t' 2>/dev/null | head -n1 || true
}

write_conf() {
    local node cpus mem
    node="$(hostname -s)"
    # slurmd -C: "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
    read -r cpus mem < <(slurmd -C | awk 'NR==1 {for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}
                                              print v["CPUs"], v["RealMemory"]}')
    [[ -n "$cpus" && -n "$mem" ]] || die "slurmd -C gave no CPUs/RealMemory"
    mkdir -p "$DIR"/{state,spool,log,munge}
    cat >"$CONF" <<EOF
# Written by tests/slurm/local_cluster.sh: one node, this machine.
ClusterName=servelab
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    alive "$DIR/munge/munged.pid" && return
    if [[ ! -s "$DIR/munge/munge.key" ]]; then
        (umask 077; dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none)
    fi
    chmod 700 "$DIR/munge"
    # --force: munged refuses some ownerships (root, /tmp) that are fine for a throw-away local cluster
    munged --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed"
}

wait_idle() {
    local state="" t=0
    while (( t < WAIT_S * 2 )); do
        state="$(node_state)"
        case "$state" in
            idle|mix|alloc) return 0 ;;
        esac
        sleep 0.5
        t=$((t + 1))
    done
    die "the node is not idle after ${WAIT_S}s (sinfo state '${state:-no answer}'); logs: $DIR/log/"
}

start() {
    [[ $EUID -eq 0 ]] || die "needs root (slurmd runs jobs as their owner); run it with sudo"
    for cmd in slurmctld slurmd munged sinfo; do
        command -v "$cmd" >/dev/null || die "$cmd not found: apt-get install -y slurm-wlm munge"
    done
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && [[ -n "$(node_state)" ]]; then
        wait_idle
        echo "export SLURM_CONF=$CONF"
        return
    fi
    stop >/dev/null
    write_conf
    start_munge
    slurmctld -f "$CONF"
    slurmd -f "$CONF"
    wait_idle
    echo "export SLURM_CONF=$CONF"
}

stop_pidfile() {   # stop_pidfile FILE: TERM the process, then wait for it (KILL after 10 s)
    local pidfile="$1" pid i
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

stop() {
    [[ -d "$DIR" ]] || { echo "no local cluster in $DIR"; return 0; }
    stop_pidfile "$DIR/slurmd.pid"
    stop_pidfile "$DIR/slurmctld.pid"
    stop_pidfile "$DIR/munge/munged.pid"
    # the saved state and the completion log hold the last run's jobs and ids: a fresh start begins from none
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/jobcomp.txt"
    echo "stopped the local cluster in $DIR"
}

status() {
    [[ -s "$CONF" ]] || { echo "no local cluster in $DIR"; return 1; }
    [[ -n "$(node_state)" ]] || { echo "slurmctld of $CONF does not answer"; return 1; }
    sinfo
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status   (folder: \$SERVELAB_SLURM_DIR, default /tmp/servelab-slurm)" >&2; exit 2 ;;
esac
