#!/usr/bin/env bash
# The README's main command: set up, bring Gemma 3 270M up on llama.cpp with `sparkfleet up`,
# ask it something, and show the status table. The deployment keeps running afterwards:
# `.venv/bin/sparkfleet down gemma-llamacpp` stops it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
"$here/setup.sh" llama
sf="$root/.venv/bin/sparkfleet"
"$sf" down gemma-llamacpp >/dev/null 2>&1 || true
"$sf" plan "$root/examples/gemma-llamacpp"
"$sf" up "$root/examples/gemma-llamacpp"
echo
echo "Completion from the deployment:"
curl -s http://127.0.0.1:18080/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "gemma3-270m", "prompt": "The three primary colours are", "max_tokens": 24, "temperature": 0}' \
  | "$root/.venv/bin/python" -c 'import json,sys; r=json.load(sys.stdin); print("  " + repr(r["choices"][0]["text"]))'
echo
"$sf" status gemma-llamacpp
echo "Stop it with: $sf down gemma-llamacpp"
