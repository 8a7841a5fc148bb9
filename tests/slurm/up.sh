#!/usr/bin/env bash
# A single-node SLURM on loopback for the SLURM launcher's tests (Debian's slurm-wlm + munge).
#
#   tests/slurm/up.sh [--install]    start it (as root); --install apt-gets the packages first
#   prints SLURM_CONF=<state>/slurm.conf: what the clients (srun, squeue, scancel) then need
#
# State lives in $SIMPLEFSDP_SLURM_DIR (default /tmp/simplefsdp-slurm). Idempotent: a running
# controller with this configuration is left alone. One node (this host at 127.0.0.1) with the
# CPUs nproc reports, in one oversubscribed partition `cpu`, so 4-rank CPU cells fit on 2 cores.
# SLURM nodes: $SIMPLEFSDP_SLURM_NODES (default 2) slurmd daemons on this host, n1..nK, each with
# its own port and all of the CPUs, so that multi-node cells (torchrun on 2 nodes) can be tested.
set -euo pipefail
state=${SIMPLEFSDP_SLURM_DIR:-/tmp/simplefsdp-slurm}
if [[ ${1:-} == --install ]] && ! command -v slurmctld >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi
for cmd in munged slurmctld slurmd srun; do
    command -v "$cmd" >/dev/null || { echo "up.sh: $cmd not installed (run with --install as root)" >&2; exit 3; }
done
[[ $(id -u) == 0 ]] || { echo "up.sh: the SLURM daemons are started as root" >&2; exit 3; }
export SLURM_CONF=$state/slurm.conf
nodes=${SIMPLEFSDP_SLURM_NODES:-2}
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
nodes_up() { [[ $(sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)') == "$nodes" ]]; }
if ! munge_ok; then  # (a munged that is ending, or a stale socket, counts as not running)
    mkdir -p /run/munge
    chown munge:munge /run/munge
    [[ -s /etc/munge/munge.key ]] || { mungekey --create 2>/dev/null || create-munge-key -f; }
    pkill -x munged 2>/dev/null && sleep 1
    runuser -u munge -- munged --force
    for _ in $(seq 20); do munge_ok && break; sleep 0.5; done
    munge_ok || { echo "up.sh: munged does not answer (munge -n | unmunge)" >&2; exit 4; }
fi
if pgrep -x slurmctld >/dev/null && [[ -f $SLURM_CONF ]] && nodes_up; then
    echo "up.sh: SLURM already up" >&2; echo "SLURM_CONF=$SLURM_CONF"; exit 0
fi
mkdir -p "$state"/ctld
host=$(hostname -s)
cpus=$(nproc)
mem=$(( ($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024) / nodes ))
cat >"$SLURM_CONF" <<CONF
ClusterName=simplefsdp
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
KillWait=5
EnforcePartLimits=ALL
MailProg=/bin/true
InactiveLimit=0
MinJobAge=60
NodeName=n[1-$nodes] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-$((17000 + nodes))] CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE OverSubscribe=FORCE:8 State=UP
CONF
pkill -x slurmctld 2>/dev/null || true
pkill -x slurmd 2>/dev/null || true
sleep 1
slurmctld -f "$SLURM_CONF" -c -i  # a clean start: no jobs of an earlier run
for n in $(seq "$nodes"); do mkdir -p "$state/spool-n$n"; slurmd -f "$SLURM_CONF" -N "n$n"; done
for _ in $(seq 60); do
    if nodes_up; then
        echo "up.sh: SLURM up: nodes n[1-$nodes] on $host, $cpus CPUs each" >&2
        echo "SLURM_CONF=$SLURM_CONF"; exit 0
    fi
    sleep 0.5
done
echo "up.sh: SLURM did not come up; logs in $state" >&2
tail -n 20 "$state"/*.log >&2 || true
exit 4
