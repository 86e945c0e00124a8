#!/usr/bin/env bash
# Install the system packages sparkfleet's tests and README need (Debian/Ubuntu, as root).
# Idempotent: only packages that are missing are installed; `apt-get update` runs at most
# once per day (stamp in /var/lib/sparkfleet) and only when something is missing.
# Then starts dockerd (scripts/start-dockerd.sh) unless SPARKFLEET_NO_DOCKERD=1.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

PKGS=(docker.io openssh-server openssh-client rsync iproute2 procps curl ca-certificates
      busybox-static python3 cmake ninja-build build-essential git
      iperf3 iputils-ping iptables  # doctor --fabric and its tests: iperf3, ping, loss injected by iptables
      perftest)  # ib_write_bw/ib_write_lat: the RDMA stand-in's flags are checked against the real tool's --help

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# docker.io may be absent while another docker CLI is installed (e.g. /usr/local/bin/docker);
# we still need dockerd + containerd + runc, which only docker.io provides here.
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: installing ${missing[*]}"
  stamp=/var/lib/sparkfleet/apt-updated
  if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
    $SUDO apt-get update -qq
    $SUDO mkdir -p /var/lib/sparkfleet && $SUDO touch "$stamp"
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO nice -n "${SPARKFLEET_NICE:-0}" apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confold "${missing[@]}"
else
  echo "setup-system: all packages present"
fi
# sshd needs its privilege-separation dir even when never started by systemd.
$SUDO mkdir -p /run/sshd
if [ "${SPARKFLEET_NO_DOCKERD:-0}" != 1 ]; then
  "$here/start-dockerd.sh"
fi
