#!/usr/bin/env bash
# Build the local test images (no registry needed):
#   sparkfleet-test:latest          `docker import` of a busybox-static root filesystem
#                                   + the stand-in rank (scripts/test-image/standin-rank)
#   sparkfleet-test-derived:latest  `docker build` FROM the first (proves build works offline)
# Skips a build when the image exists and its input hash label matches (FORCE=1 rebuilds).
# Needs: busybox-static (scripts/setup-system.sh), a running dockerd (scripts/start-dockerd.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ctx="$here/test-image"
IMAGE="${IMAGE:-sparkfleet-test:latest}"
DERIVED="${DERIVED:-sparkfleet-test-derived:latest}"
BB="$(command -v busybox || true)"
[ -n "$BB" ] && file -L "$BB" 2>/dev/null | grep -q static || BB=/bin/busybox
[ -x "$BB" ] || { echo "build-test-image: busybox-static missing (apt-get install busybox-static)" >&2; exit 1; }
"$here/start-dockerd.sh" >/dev/null  # starts dockerd if needed; repairs a vanished docker0

hash="$( (sha256sum "$BB" "$ctx/standin-rank" "$ctx/standin-handler" "$0" | cut -d' ' -f1) | sha256sum | cut -c1-16)"
have="$(docker image inspect -f '{{index .Config.Labels "org.sparkfleet.inputs"}}' "$IMAGE" 2>/dev/null || true)"
if [ "${FORCE:-0}" != 1 ] && [ "$have" = "$hash" ]; then
  echo "build-test-image: $IMAGE up to date ($hash)"
else
  root="$(mktemp -d)"; trap 'rm -rf "$root"' EXIT
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,root,var/log,srv}
  chmod 1777 "$root/tmp"
  cp "$BB" "$root/bin/busybox"
  for a in $("$BB" --list); do
    [ "$a" = busybox ] || ln -s busybox "$root/bin/$a"
  done
  install -m 0755 "$ctx/standin-rank" "$ctx/standin-handler" "$root/usr/bin/"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
  echo "127.0.0.1 localhost" > "$root/etc/hosts"
  tar -C "$root" --numeric-owner --owner=0 --group=0 -c . | docker import \
    -c 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["standin-rank"]' \
    -c "LABEL org.sparkfleet.inputs=$hash" \
    -c 'EXPOSE 8000' \
    -m "sparkfleet test image (busybox + stand-in rank)" - "$IMAGE" >/dev/null
  echo "build-test-image: imported $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
  FORCE=1
fi
dhave="$(docker image inspect -f '{{index .Config.Labels "org.sparkfleet.base"}}' "$DERIVED" 2>/dev/null || true)"
base_id="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
if [ "${FORCE:-0}" != 1 ] && [ "$dhave" = "$base_id" ]; then
  echo "build-test-image: $DERIVED up to date"
else
  DOCKER_BUILDKIT=0 docker build -q -f "$ctx/Dockerfile.derived" --label "org.sparkfleet.base=$base_id" \
    -t "$DERIVED" "$ctx" >/dev/null 2>/tmp/docker-build.err || { cat /tmp/docker-build.err >&2; exit 1; }
  echo "build-test-image: built $DERIVED"
fi
# Optional third image: the base plus Debian's python3 (binary, shared libraries, stdlib
# without tests/tk/idle; ~30 MB) for stand-ins written in Python. Skipped without
# /usr/bin/python3.X or with SKIP_PYTHON_IMAGE=1.
PYIMAGE="${PYIMAGE:-sparkfleet-test-python:latest}"
pybin="$(readlink -f /usr/bin/python3 2>/dev/null || true)"
if [ "${SKIP_PYTHON_IMAGE:-0}" != 1 ] && [ -x "$pybin" ] && [ "${pybin#/usr/bin/python3.}" != "$pybin" ]; then
  pyver="${pybin##*/}"
  pyhash="$( (echo "$hash"; sha256sum "$pybin" | cut -d' ' -f1) | sha256sum | cut -c1-16)"
  phave="$(docker image inspect -f '{{index .Config.Labels "org.sparkfleet.inputs"}}' "$PYIMAGE" 2>/dev/null || true)"
  if [ "${FORCE:-0}" != 1 ] && [ "$phave" = "$pyhash" ]; then
    echo "build-test-image: $PYIMAGE up to date"
  else
    proot="$(mktemp -d)"
    docker export "$(docker create "$IMAGE" true)" | tar -C "$proot" -x
    docker ps -aq --filter ancestor="$IMAGE" --filter status=created | xargs -r docker rm >/dev/null
    mkdir -p "$proot/usr/lib" "$proot/usr/bin"
    cp -a "$pybin" "$proot/usr/bin/"; ln -sf "$pyver" "$proot/usr/bin/python3"; ln -sf "$pyver" "$proot/usr/bin/python"
    tar -C /usr/lib -c --exclude="$pyver/test" --exclude="$pyver/*/test" --exclude="$pyver/*/tests" \
      --exclude="$pyver/idlelib" --exclude="$pyver/tkinter" --exclude="$pyver/turtledemo" \
      --exclude="$pyver/ensurepip" --exclude="$pyver/lib2to3" --exclude="$pyver/config-*" \
      --exclude="$pyver/site-packages" --exclude="$pyver/dist-packages" "$pyver" | tar -C "$proot/usr/lib" -x
    # shared libraries of the interpreter and of every extension module, at their own paths
    { ldd "$pybin"; find "/usr/lib/$pyver/lib-dynload" -name '*.so' -exec ldd {} \; ; } 2>/dev/null \
      | grep -o '/[^ ]*' | sort -u | while read -r lib; do
        [ -e "$lib" ] || continue
        mkdir -p "$proot$(dirname "$lib")"; cp -L "$lib" "$proot$lib"
      done
    [ -e /lib64/ld-linux-x86-64.so.2 ] && { mkdir -p "$proot/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$proot/lib64/"; }
    # Debian's /lib -> usr/lib merge: keep both spellings resolvable
    for d in lib/x86_64-linux-gnu; do
      if [ -d "$proot/$d" ] && [ -d "$proot/usr/$d" ]; then cp -a "$proot/$d/." "$proot/usr/$d/"; fi
    done
    tar -C "$proot" --numeric-owner --owner=0 --group=0 -c . | docker import \
      -c 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["standin-rank"]' \
      -c "LABEL org.sparkfleet.inputs=$pyhash" -m "sparkfleet test image + python3" - "$PYIMAGE" >/dev/null
    rm -rf "$proot"
    docker run --rm "$PYIMAGE" python3 -c 'import json, http.server, ssl, hashlib, sqlite3' \
      || { echo "build-test-image: $PYIMAGE python3 smoke failed" >&2; exit 1; }
    echo "build-test-image: imported $PYIMAGE ($(docker image inspect -f '{{.Size}}' "$PYIMAGE") bytes)"
  fi
fi
# Smoke: the image runs a command.
out="$(docker run --rm "$IMAGE" sh -c 'cat /etc/passwd | head -1; sleep 0; echo ok')"
[ "${out##*$'\n'}" = ok ] || { echo "build-test-image: smoke run failed: $out" >&2; exit 1; }
echo "build-test-image: smoke run ok"
