#!/usr/bin/env bash
# Start dockerd in the background if `docker info` fails; wait until ready (max 60 s).
# Log: /tmp/dockerd.log (override DOCKERD_LOG). Tries, in order, until one comes up:
#   storage driver overlay2, then vfs  (override: DOCKERD_STORAGE_DRIVER=vfs)
#   with iptables, then --iptables=false --ip-masq=false (no NAT on this kind of host)
# The working flags are written to /tmp/dockerd.flags for later runs.
# Exit 0 when docker answers, 1 otherwise (prints the log tail).
set -uo pipefail
LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
FLAGS_FILE=/tmp/dockerd.flags
TIMEOUT="${DOCKERD_TIMEOUT:-60}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

ensure_docker0() {
  # Seen on the test VM: docker0 vanished while dockerd kept running, and every container on
  # the default bridge then failed ("could not find bridge docker0"). Recreate it in place
  # (restarting dockerd would stop running containers). --network host/none never need it.
  ip link show docker0 >/dev/null 2>&1 && ip link show docker0 | grep -q '[<,]UP[,>]' && return 0
  local sub; sub="$(docker network inspect bridge -f '{{range .IPAM.Config}}{{.Subnet}}{{end}}' 2>/dev/null)"
  [ -n "$sub" ] || return 0
  local pfx="${sub#*/}" base="${sub%/*}"; local gw="${base%.*}.$(( ${base##*.} + 1 ))"
  echo "start-dockerd: docker0 missing or down; recreating ($gw/$pfx)"
  { ip link show docker0 >/dev/null 2>&1 || $SUDO ip link add docker0 type bridge; } &&
    { ip addr show docker0 | grep -q "inet $gw/" || $SUDO ip addr add "$gw/$pfx" dev docker0; } &&
    $SUDO ip link set docker0 up &&
    return 0
  # Containers on the default bridge would all fail ("could not find bridge docker0").
  echo "start-dockerd: FAILED to recreate docker0 ($gw/$pfx)" >&2
  return 1
}

if docker info >/dev/null 2>&1; then
  echo "start-dockerd: docker already running ($(docker info -f '{{.Driver}}' 2>/dev/null))"
  ensure_docker0 || exit 1
  exit 0
fi
command -v dockerd >/dev/null || { echo "start-dockerd: dockerd not installed (run scripts/setup-system.sh)" >&2; exit 1; }

try_start() {  # $@: extra dockerd flags; returns 0 when ready
  echo "start-dockerd: trying dockerd $*" | tee -a "$LOG"
  $SUDO nohup dockerd "$@" >>"$LOG" 2>&1 &
  local pid=$! t=0
  while [ $t -lt "$TIMEOUT" ]; do
    if docker info >/dev/null 2>&1; then
      echo "$*" > "$FLAGS_FILE"
      echo "start-dockerd: ready after ${t}s (pid $pid, flags: $*, driver $(docker info -f '{{.Driver}}'))"
      ensure_docker0 || exit 1
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "start-dockerd: dockerd exited" | tee -a "$LOG"; return 1; }
    sleep 1; t=$((t+1))
  done
  echo "start-dockerd: not ready after ${TIMEOUT}s; stopping pid $pid" | tee -a "$LOG"
  $SUDO kill "$pid" 2>/dev/null; sleep 2
  return 1
}

# Stale pid file from an earlier, dead dockerd blocks a new one.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  $SUDO rm -f /var/run/docker.pid
fi
if ! pgrep -x containerd >/dev/null 2>&1; then :; fi  # dockerd starts its own containerd

candidates=()
if [ -f "$FLAGS_FILE" ]; then candidates+=("$(cat "$FLAGS_FILE")"); fi
drivers="${DOCKERD_STORAGE_DRIVER:-overlay2 vfs}"
for d in $drivers; do
  candidates+=("--storage-driver=$d")
  candidates+=("--storage-driver=$d --iptables=false --ip-masq=false")
done
for c in "${candidates[@]}"; do
  # shellcheck disable=SC2086
  try_start $c && exit 0
done
echo "start-dockerd: FAILED; last lines of $LOG:" >&2
tail -20 "$LOG" >&2
exit 1
