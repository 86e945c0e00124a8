#!/usr/bin/env bash
# Start a single-host Slurm for sparkfleet's `export slurm` tests: slurmctld + slurmd on this
# machine, one node named after `hostname -s` with CPUs=2, partition `debug`, AuthType=auth/none
# (no munge key to manage on a throwaway test host). Debian's `slurm-wlm` is installed if missing.
#
# Idempotent: when the controller answers and the node is usable it only reports and exits 0.
# Usage: scripts/start-slurm.sh [--stop]
# Env:   SLURM_CONF_DIR (default /etc/slurm), SLURM_CPUS (default 2)
set -euo pipefail
CONF_DIR="${SLURM_CONF_DIR:-/etc/slurm}"
CONF="$CONF_DIR/slurm.conf"
NODE="$(hostname -s)"
CPUS="${SLURM_CPUS:-2}"
log() { echo "start-slurm: $*"; }

if [ "${1:-}" = "--stop" ]; then
  for d in slurmd slurmctld; do
    if pid=$(pgrep -x "$d"); then kill $pid && log "stopped $d ($pid)"; fi
  done
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null; then
  [ "$(id -u)" = 0 ] || { log "slurm-wlm is not installed and this is not root"; exit 1; }
  log "installing slurm-wlm"
  stamp=/var/lib/sparkfleet/apt-updated  # as scripts/setup-system.sh: lists at most a day old
  if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
    apt-get update -qq && mkdir -p /var/lib/sparkfleet && touch "$stamp"
  fi
  if ! out="$(DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm 2>&1)"; then
    printf '%s\n' "$out" | tail -20 >&2
    log "FAILED: apt-get install slurm-wlm" >&2
    exit 1
  fi
fi

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1; }
usable() { case "$(node_state)" in idle*|mixed*|allocated*|completing*) return 0;; *) return 1;; esac; }

if scontrol ping 2>/dev/null | grep -q UP && usable; then
  log "already running: node $NODE $(node_state)"
  exit 0
fi

want=$(cat <<EOF
# Written by sparkfleet scripts/start-slurm.sh: a one-node test cluster.
ClusterName=sparkfleet
SlurmctldHost=$NODE
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
InactiveLimit=0
MinJobAge=60
NodeName=$NODE CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
)
mkdir -p "$CONF_DIR" /var/spool/slurmd /var/spool/slurmctld /var/log/slurm
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
  printf '%s\n' "$want" > "$CONF"
  log "wrote $CONF"
  # A changed configuration needs fresh daemons.
  for d in slurmd slurmctld; do
    if pid=$(pgrep -x "$d"); then kill $pid; fi
  done
  sleep 1
fi

pgrep -x slurmctld >/dev/null || { slurmctld && log "started slurmctld"; }
for _ in $(seq 1 50); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
pgrep -x slurmd >/dev/null || { slurmd && log "started slurmd"; }

for _ in $(seq 1 100); do
  state=$(node_state)
  case "$state" in
    idle*|mixed*|allocated*) log "ready: node $NODE $state, partition debug"; exit 0;;
    down*|drain*|fail*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true;;
  esac
  sleep 0.3
done
log "node $NODE did not become usable (state: $(node_state)); see /var/log/slurm/"
exit 1
