#!/usr/bin/env bash
# One real GPU run through sparkfleet (docs/gpu-run.md), made for one call of the device tool:
# build llama.cpp's llama-server with CUDA, generate a Llama-3-8B-shaped GGUF, install sparkfleet
# from carried wheels, then through sparkfleet itself: doctor, up (process runtime, local cluster),
# status, bench decode c1/c4, bench prefill, doctor while serving, down; results as JSON + Markdown.
#
# usage: benchmarks/gpu_device_run.sh LLAMA_SRC RESULTS [WHEELS]
#   LLAMA_SRC  a llama.cpp source tree, or a .tar.gz of one (git archive; never committed here)
#   RESULTS    where results.json, results.md, run.log and captures.tar.gz go ($OUT on the device)
#   WHEELS     a folder of wheels to install first (sparkfleet and what the machine lacks)
# environment: SPARKFLEET_GPU_WORK (/var/tmp/sparkfleet-gpu), SPARKFLEET_GPU_SHAPE (llama3-8b, or
#   tiny), SPARKFLEET_GPU_CUDA (1; 0 builds for the CPU: a rehearsal anywhere), SPARKFLEET_GPU_PORT
#   (18080, the recipe's), SPARKFLEET_GPU_QUICK (0; 1: one short bench tier each, for rehearsals),
#   SPARKFLEET_GPU_DEADLINE (0; N: every step is cut short so the whole run ends within N seconds,
#   30 s kept for down and the report), PYTHON (python3).
set -uo pipefail

SRC=${1:?usage: gpu_device_run.sh LLAMA_SRC RESULTS [WHEELS]}
RESULTS=${2:?usage: gpu_device_run.sh LLAMA_SRC RESULTS [WHEELS]}
WHEELS=${3:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${SPARKFLEET_GPU_WORK:-/var/tmp/sparkfleet-gpu}
SHAPE=${SPARKFLEET_GPU_SHAPE:-llama3-8b}
CUDA=${SPARKFLEET_GPU_CUDA:-1}
PY=${PYTHON:-python3}
NAME=llama-server-cuda                 # the deployment: the recipe folder's name
RECIPE=$HERE/gpu_run/$NAME
PORT=${SPARKFLEET_GPU_PORT:-18080}     # the recipe's port unless told
MODEL_NAME=llama3-8b-shape-random      # the recipe's served_model_name
MODEL_FILE=$SHAPE-f16.gguf
URL=http://127.0.0.1:$PORT
CAP=$WORK/captures

mkdir -p "$RESULTS" "$WORK/models"
rm -rf "$CAP" "$WORK/state"
mkdir -p "$CAP"
RESULTS=$(cd "$RESULTS" && pwd)
: >"$RESULTS/run.log"
exec > >(tee -a "$RESULTS/run.log") 2>&1
export SPARKFLEET_STATE_DIR=$WORK/state PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=160
T0=$EPOCHREALTIME

# step NAME CMD...: run CMD, log its time and exit code in steps.tsv, return its code. Its own
# lines go to stderr: a step's stdout is often a capture file.
step() {
  local name=$1 t=$EPOCHREALTIME rc
  shift
  echo "=== [$(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%6.1f", b-a}')s] $name" >&2
  "$@"
  rc=$?
  awk -v n="$name" -v a="$t" -v b="$EPOCHREALTIME" -v rc="$rc" 'BEGIN{printf "%s\t%.1f\t%d\n", n, b-a, rc}' \
    >>"$CAP/steps.tsv"
  [ "$rc" = 0 ] || echo "=== $name failed with exit code $rc" >&2
  return "$rc"
}
sf() { "$PY" -m sparkfleet.cli.main "$@"; }
DEADLINE=${SPARKFLEET_GPU_DEADLINE:-0}
left() {  # left MAX: the seconds a step may take: MAX, or less so that the run ends by the deadline
  [ "$DEADLINE" = 0 ] && { echo "$1"; return; }
  awk -v m="$1" -v a="$T0" -v b="$EPOCHREALTIME" -v d="$DEADLINE" \
    'BEGIN{r=int(d-(b-a)-30); if (r<m) m=r; if (m<1) m=1; print m}'
}
gpu_query() {  # gpu_query FILE: what nvidia-smi says of the GPUs and the processes holding them
  command -v nvidia-smi >/dev/null || { echo "no nvidia-smi" >"$1"; return 0; }
  nvidia-smi --query-gpu=name,memory.total,memory.used,memory.free,driver_version,compute_cap \
    --format=csv,noheader >"$1"
}

UP=0
finish() {
  local rc=$?
  trap - EXIT
  trap '' PIPE  # if tee is gone, what follows still writes its files
  if [ "$UP" = 1 ]; then sf down "$NAME" || true; fi  # never leave the server running
  step report "$PY" "$HERE/gpu_run/capture.py" report "$CAP" "$RESULTS" || true
  [ -f "$RESULTS/results.md" ] && cat "$RESULTS/results.md"
  tar -czf "$RESULTS/captures.tar.gz" -C "$WORK" captures
  echo "=== done in $(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s (exit $rc)"
  exit "$rc"
}
trap finish EXIT
trap 'exit 143' TERM INT

echo "sparkfleet GPU run: shape $SHAPE, cuda $CUDA, work $WORK, results $RESULTS"
nproc; free -g | head -2; df -h "$WORK" | tail -1

if [ -n "$WHEELS" ]; then
  step install "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WORK/site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
fi
step imports "$PY" -c 'import sparkfleet, pydantic, typer, httpx; print(sparkfleet.__file__, pydantic.VERSION, typer.__version__, httpx.__version__)' || exit 1

if [ -d "$SRC" ]; then
  LL=$(cd "$SRC" && pwd)
else
  LL=$WORK/llama.cpp
  rm -rf "$LL" && mkdir -p "$LL"
  step unpack tar -xzf "$SRC" -C "$LL" || exit 1
fi

# The build (all cores) and the model (one core and the disk) at the same time.
cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
[ "$CUDA" = 1 ] || cuda=(-DGGML_CUDA=OFF)
(
  step configure cmake -S "$LL" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF >"$CAP/build.log" 2>&1 &&
    step build timeout "$(left 420)" ninja -C "$WORK/build" -j"$(nproc)" llama-server >>"$CAP/build.log" 2>&1
) &
BUILD=$!
PYTHONPATH=$LL/gguf-py${PYTHONPATH:+:$PYTHONPATH} step model "$PY" "$HERE/gpu_run/make_gguf.py" \
  "$WORK/models/$MODEL_FILE" --shape "$SHAPE" --info "$CAP/model.json" &
MODEL=$!

gpu_query "$CAP/gpu-idle.csv"
step doctor-idle sf doctor --json >"$CAP/doctor-idle.json"
cat "$CAP/doctor-idle.json"
wait "$MODEL" || exit 1
wait "$BUILD" || { tail -30 "$CAP/build.log"; exit 1; }
tail -3 "$CAP/build.log"

sets=(--set "model=$WORK/models" --set "model_file=$MODEL_FILE"
  --set "entrypoint=[\"$WORK/build/bin/llama-server\"]" --set "port=$PORT")
if [ "$CUDA" != 1 ]; then  # a CPU rehearsal: no CUDA boot lines, a smaller context
  sets+=(--set 'verify.expect=["main: model loaded", "server is listening on http://\\S+ - starting the main loop"]'
    --set 'args=["-np", "4", "-c", "32768", "--metrics"]')
fi
cp "$RECIPE/recipe.toml" "$CAP/recipe.toml"
step plan sf plan "$RECIPE" "${sets[@]}" >"$CAP/plan.txt" || exit 1
cat "$CAP/plan.txt"

# Every change of /health and /v1/models while the server loads (the 503 phase), from outside.
"$PY" "$HERE/gpu_run/capture.py" health-trace "$URL" "$CAP/health-trace.json" &
TRACE=$!
UP=1
step up timeout "$(left 300)" "$PY" -m sparkfleet.cli.main up "$RECIPE" "${sets[@]}" --timeout 240 2>&1 | tee "$CAP/up.txt"
up_rc=${PIPESTATUS[0]}
wait "$TRACE"
step deployment-up "$PY" "$HERE/gpu_run/capture.py" deployment "$NAME" "$CAP/deployment.json"
if [ "$up_rc" != 0 ]; then  # up rolled back; finish's down makes sure
  log=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["log_path"] or "")' "$CAP/deployment.json")
  [ -n "$log" ] && cp "$log" "$CAP/server.log"
  exit 1
fi

step status sf status "$NAME" --json >"$CAP/status.json"
cat "$CAP/status.json"
step streams "$PY" "$HERE/gpu_run/capture.py" streams "$URL" "$MODEL_NAME" "$CAP"

decode=(--concurrency 1,4 --output-len 256 --repeats 3)
prefill=(--input-len 1k,4k,8k,16k --repeats 2)
if [ "${SPARKFLEET_GPU_QUICK:-0}" = 1 ]; then
  decode=(--concurrency 1,4 --types prose --output-len 32 --repeats 1)
  prefill=(--input-len 1k --repeats 1)
fi
# Inside the device call's 10 minutes whatever happens: a stopped bench keeps what it measured.
step bench-decode timeout "$(left 300)" "$PY" -m sparkfleet.cli.main bench decode "$NAME" "${decode[@]}" --timeout 120 \
  --label gpu-run 2>&1 | tee "$CAP/bench-decode.txt"
sf bench export last -f json -o "$CAP/bench-decode.json"
sf bench export last -f md -o "$CAP/bench-decode.md"
step bench-prefill timeout "$(left 150)" "$PY" -m sparkfleet.cli.main bench prefill "$NAME" "${prefill[@]}" \
  --label gpu-run 2>&1 | tee "$CAP/bench-prefill.txt"
sf bench export last -f json -o "$CAP/bench-prefill.json"
sf bench export last -f md -o "$CAP/bench-prefill.md"

gpu_query "$CAP/gpu-serving.csv"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv,noheader >"$CAP/apps-serving.csv"
  nvidia-smi >"$CAP/nvidia-smi-serving.txt"
fi
step doctor-serving sf doctor --json >"$CAP/doctor-serving.json"
cat "$CAP/doctor-serving.json"
sf logs "$NAME" --tail 40 >"$CAP/logs-tail.txt"

step down sf down "$NAME" && UP=0
step deployment-down "$PY" "$HERE/gpu_run/capture.py" deployment "$NAME" "$CAP/deployment.json"
read -r log exit_path < <("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["log_path"], d["exit_path"])' \
  "$CAP/deployment.json")
cp "$log" "$CAP/server.log"
sleep 0.5
cat "$exit_path" >"$CAP/exit-code.txt" 2>/dev/null || echo "none" >"$CAP/exit-code.txt"
sf status "$NAME" --json >"$CAP/status-after.json"
gpu_query "$CAP/gpu-after.csv"
{ ps -eo pid,args | grep '[l]lama-server' || echo none; } >"$CAP/left-running.txt"
echo "rank 0 exit code: $(cat "$CAP/exit-code.txt"); left running: $(cat "$CAP/left-running.txt")"
