#!/usr/bin/env bash
# What the `nfs` staging tests (tests/integration/test_distribution_nfs.py) need, idempotently:
# Debian's nfs-kernel-server (exportfs, rpc.nfsd, rpc.mountd) and nfs-common (mount.nfs4), then a
# report of whether this kernel can serve and mount NFS at all. No server is left running: the
# end-to-end test starts it (`service nfs-kernel-server start`), and the "export nobody serves"
# test needs it stopped.
#
# Exit 1 when a package cannot be installed, or when the kernel has nfsd but the server cannot
# start. A kernel without NFS support (no nfsd / nfs4 in /proc/filesystems, no loadable module) is
# a machine fact, not a set-up failure: it is printed, with the measured error, and the test that
# needs it must then be in tests/skip-allowlist.txt for a CI run to pass.
# Usage: scripts/setup-nfs.sh
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
log() { echo "setup-nfs: $*"; }

missing=()
for p in nfs-kernel-server nfs-common; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  stamp=/var/lib/sparkfleet/apt-updated
  if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
    $SUDO apt-get update -qq
    $SUDO mkdir -p /var/lib/sparkfleet && $SUDO touch "$stamp"
  fi
  # policy-rc.d may refuse to start the services in a container; that is not an install failure.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confold "${missing[@]}" >/dev/null
fi
for tool in /usr/sbin/exportfs /usr/sbin/rpc.nfsd /sbin/mount.nfs4; do
  [ -x "$tool" ] || { log "FAILED: $tool missing after installing nfs-kernel-server nfs-common" >&2; exit 1; }
done
log "nfs-kernel-server and nfs-common present"

# Can this kernel serve NFS? (nfsd built in or loadable, and its control filesystem mountable)
server=""
if ! grep -qw nfsd /proc/filesystems && [ ! -e /proc/fs/nfsd/threads ]; then
  command -v modprobe >/dev/null && $SUDO modprobe nfsd 2>/dev/null || :
fi
if [ ! -e /proc/fs/nfsd/threads ]; then
  $SUDO mkdir -p /proc/fs/nfsd 2>/dev/null || :
  if ! err="$($SUDO mount -t nfsd nfsd /proc/fs/nfsd 2>&1)"; then
    server="\`mount -t nfsd nfsd /proc/fs/nfsd\` fails: $(printf '%s' "$err" | head -n1)"
  fi
fi
client=""
if ! grep -qwE 'nfs4?' /proc/filesystems; then
  command -v modprobe >/dev/null && $SUDO modprobe nfs 2>/dev/null || :
  grep -qwE 'nfs4?' /proc/filesystems || client="no nfs/nfs4 in /proc/filesystems"
fi

if [ -n "$server" ] || [ -n "$client" ]; then
  cfg=""
  if [ -r /proc/config.gz ]; then
    for opt in MODULES NFSD NFS_FS; do
      v="$(zcat /proc/config.gz | grep -E "^CONFIG_$opt=" || :)"; cfg="$cfg ${v:-CONFIG_$opt unset}"
    done
    cfg=" (kernel $(uname -r):$cfg)"
  fi
  log "this kernel cannot run the NFS end-to-end test${cfg}:"
  [ -z "$server" ] || log "  no NFS server: $server"
  [ -z "$client" ] || log "  no NFS client: $client (Docker's type=nfs volumes need it)"
  log "  test_nfs_share_read_from_a_container_on_every_worker skips; CI needs it in tests/skip-allowlist.txt"
  exit 0
fi

# The kernel can: prove the server starts, then leave it stopped (see above).
if ! out="$($SUDO service nfs-kernel-server start 2>&1)" || [ "$(cat /proc/fs/nfsd/threads)" = 0 ]; then
  # With no exports Debian's init script declines to start; rpc.nfsd alone proves the kernel side.
  $SUDO rpc.nfsd 1 || { printf '%s\n' "$out" >&2; log "FAILED: the NFS server does not start" >&2; exit 1; }
fi
threads="$(cat /proc/fs/nfsd/threads)"
$SUDO rpc.nfsd 0 2>/dev/null || :
$SUDO service nfs-kernel-server stop >/dev/null 2>&1 || :
[ "$threads" != 0 ] || { log "FAILED: nfsd started no threads" >&2; exit 1; }
log "ready: the kernel serves NFS ($threads nfsd threads started and stopped again) and mounts nfs4"
