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

if docker info >/dev/null 2>&1; then
  echo "start-dockerd: docker already running ($(docker info -f '{{.Driver}}' 2>/dev/null))"
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
