#!/usr/bin/env bash
# One device call (docs/gateway.md, docs/gpu-run.md): llama.cpp's llama-server and rpc-server
# built with CUDA and RPC, a Llama-3-8B-shaped GGUF, then through sparkfleet itself:
#   A. one rank: decode c1/c4 directly and through `sparkfleet gateway serve`, alternating
#      (direct, gateway, direct, gateway), each as a stored bench run;
#   B. two ranks on the same GPU over RPC (rank 1 rpc-server with CUDA, rank 0 llama-server --rpc;
#      two nodes of one cluster on this host): up, decode c1/c4, down.
# Nothing is left running (each phase ends with down; the gateway is stopped).
#
# usage: benchmarks/gpu_front_door.sh LLAMA_SRC.tar.gz RESULTS WHEELS
#   SPARKFLEET_GW_ROUNDS=N (default 3): rounds of A; the order of the two paths swaps every round
#   (direct, gateway | gateway, direct | …) so a drift of the server's own speed falls on both.
#   SPARKFLEET_GW_PHASES=A: A alone.
set -uo pipefail
SRC=${1:?usage: gpu_front_door.sh LLAMA_SRC.tar.gz RESULTS WHEELS}
RESULTS=${2:?}
WHEELS=${3:?}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${SPARKFLEET_GPU_WORK:-/var/tmp/sparkfleet-gpu}
PY=${PYTHON:-python3}
MODEL_NAME=llama3-8b-shape-random
MODEL_FILE=llama3-8b-f16.gguf
RECIPE=$HERE/gpu_run/llama-server-cuda
ROUNDS=${SPARKFLEET_GW_ROUNDS:-3}
PHASES=${SPARKFLEET_GW_PHASES:-AB}
mkdir -p "$RESULTS" "$WORK/models" "$WORK/src" "$WORK/res"
RESULTS=$(cd "$RESULTS" && pwd)
RES=$WORK/res  # every capture; packed into $RESULTS/captures.tar.gz at the end (run.log beside it)
export SPARKFLEET_STATE_DIR=$WORK/state PYTHONUNBUFFERED=1 NO_COLOR=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
exec > >(tee -a "$RESULTS/run.log") 2>&1
T0=$SECONDS
say() { echo "=== [$((SECONDS - T0))s] $*"; }
sf() { "$PY" -m sparkfleet.cli.main "$@"; }

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
  "$WHEELS"/*.whl || exit 1
export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c 'import sparkfleet, uvicorn, aiohttp, prometheus_client; print("sparkfleet", sparkfleet.__file__)' || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

say "unpack, build (CUDA sm_90, RPC) and write the model at once"
tar -xzf "$SRC" -C "$WORK/src" || exit 1
(
  cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_RPC=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF >"$RES/build.log" 2>&1 &&
    timeout 420 ninja -C "$WORK/build" -j"$(nproc)" llama-server ggml-rpc-server >>"$RES/build.log" 2>&1
) &
BUILD=$!
PYTHONPATH=$WORK/src/gguf-py:$PYTHONPATH "$PY" "$HERE/gpu_run/make_gguf.py" "$WORK/models/$MODEL_FILE" \
  --shape llama3-8b --info "$RES/model.json" || exit 1
wait "$BUILD" || { tail -30 "$RES/build.log"; exit 1; }
cp "$WORK/build/bin/ggml-rpc-server" "$WORK/build/bin/rpc-server"
"$WORK/build/bin/llama-server" --version 2>&1 | tail -2
say "built"

sets=(--set "model=$WORK/models" --set "model_file=$MODEL_FILE" --set "entrypoint=[\"$WORK/build/bin/llama-server\"]"
  --set 'verify.expect=["model loaded", "listening on http://"]'
  --set 'args=["-ngl", "999", "-np", "4", "-c", "65536", "-fa", "on", "--metrics"]')
# (this llama.cpp logs "llama_server: model loaded" / "listening on", b4747 "main: …"; -fa takes a value)
decode=(--concurrency 1,4 --types prose --output-len 256 --repeats 3 --timeout 120)

say "A: one rank, direct and through the gateway"
# The random-weights model repeats one token (make_gguf.py): the loop abort would rightly stop
# every answer after 64 of them, so this route turns it off to compare the same 256-token answers.
printf 'loop_abort = false\n' >"$WORK/gateway.toml"
sf up "$RECIPE" --name one "${sets[@]}" --set port=18080 --timeout 240 || exit 1
"$PY" -m sparkfleet.cli.main gateway serve --config "$WORK/gateway.toml" --route "$MODEL_NAME=one" --port 18200 \
  >"$RES/gateway.log" 2>&1 &
GW=$!
for i in 1 2 3 4 5; do curl -sf http://127.0.0.1:18200/health >/dev/null && break; sleep 1; done
bench_direct() {
  sf bench decode one "${decode[@]}" --label "direct-$1" | tail -6
  sf bench export last -f json -o "$RES/direct-$1.json"
}
bench_gateway() {
  sf bench decode http://127.0.0.1:18200 --model "$MODEL_NAME" "${decode[@]}" --label "gateway-$1" | tail -6
  sf bench export last -f json -o "$RES/gateway-$1.json"
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then bench_direct "$round"; bench_gateway "$round"
  else bench_gateway "$round"; bench_direct "$round"; fi
done
"$PY" - "$RES" "$ROUNDS" <<'PY' | tee "$RESULTS/gateway-ratio.txt"
import json, statistics, sys
res, rounds = sys.argv[1], int(sys.argv[2])
def tps(path, conc):
    tiers = json.load(open(path))["tiers"]
    return next(t["steady_output_throughput"]["median"] for t in tiers if t["max_concurrency"] == conc)
for conc in (1, 4):
    d = [tps(f"{res}/direct-{r}.json", conc) for r in range(1, rounds + 1)]
    g = [tps(f"{res}/gateway-{r}.json", conc) for r in range(1, rounds + 1)]
    print(f"c{conc} per round (direct -> gateway, ratio): "
          + "; ".join(f"{a:.1f} -> {b:.1f} ({b / a:.3f})" for a, b in zip(d, g)))
    print(f"c{conc}: median of the {rounds} rounds' ratios {statistics.median(b / a for a, b in zip(d, g)):.4f}; "
          f"ratio of the medians {statistics.median(g) / statistics.median(d):.4f} "
          f"(direct {statistics.median(d):.1f}, gateway {statistics.median(g):.1f} tok/s)")
PY
sf gateway log --json >"$RES/gateway-requests.json" 2>&1
kill "$GW"; wait "$GW" 2>/dev/null
sf down one

if [ "$PHASES" != A ]; then
say "B: two ranks over RPC on the same GPU"
cat >"$WORK/two.toml" <<TOML
name = "one-host-two-nodes"
[defaults]
bind_address = "fabric"
gpus = "all"
[[nodes]]
name = "rank0"
host = "localhost"
transport = "local"
fabric_ip = "127.0.0.1"
[[nodes]]
name = "rank1"
host = "localhost"
transport = "local"
fabric_ip = "127.0.0.2"
TOML
rpc=(--set required_nodes=2 --set rendezvous_port=50052)
sf up "$RECIPE" --name rpc --cluster "$WORK/two.toml" "${sets[@]}" "${rpc[@]}" --set port=18090 --timeout 240 &&
  sf bench decode rpc "${decode[@]}" --label rpc | tail -12 && sf bench export last -f json -o "$RES/rpc.json"
sf logs rpc --tail 60 >"$RES/rpc-logs.txt" 2>&1
sf down rpc
fi
{ ps -eo pid,args | grep -E '[l]lama-server|[r]pc-server|[s]parkfleet' || echo none; } >"$RES/left-running.txt"
say "left running: $(cat "$RES/left-running.txt")"
tar -czf "$RESULTS/captures.tar.gz" -C "$WORK" res
nvidia-smi --query-gpu=memory.used --format=csv,noheader
