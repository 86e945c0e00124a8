"""One rank of a collective sweep: all-reduce and all-gather over growing message sizes through
``torch.distributed``, measured as nccl-tests does, run with the interpreter and environment the
rank's engine would get, so the figure is the one the engine will see.

Every rank prints ``{"rank", "backend", "device"}`` first; rank 0 then one JSON line per
(op, size) and a last ``{"done": true}``. NCCL's INFO lines go to stderr, where the controller
reads the transport NCCL chose.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import json
import sys
import time
import warnings


def iterations(size: int) -> int:
    """Timed iterations for a message of size bytes: the same on every rank (a collective is
    called the same number of times everywhere), ~64 MiB moved per size, between 3 and 50."""
    return max(3, min(50, (64 << 20) // max(size, 1)))


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busBw / algBw: what one link carries, comparable with the link's rate."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    return (world - 1) / world


def sweep(args: dict) -> None:
    # torch 2.13 announces all_gather_into_tensor's successor on every call; the sweep's output is JSON.
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    backend = args.get("backend", "auto")
    cuda = bool(torch.cuda.is_available())
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    device, bound = "cpu", {}
    if backend == "nccl":
        local = int(args.get("local_rank", 0))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
        bound = {"device_id": torch.device(device)}  # the rank's GPU, for barrier() too
    rank, world = int(args["rank"]), int(args["world"])
    print(json.dumps({"rank": rank, "backend": backend, "device": device, "torch": torch.__version__}), flush=True)
    init = f"tcp://{args['master']}:{int(args['port'])}"
    timeout = datetime.timedelta(seconds=float(args.get("timeout_s", 120)))
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=timeout, **bound)
    try:
        for size in args["sizes"]:
            elems = max(1, int(size) // 4)
            data = torch.ones(elems, dtype=torch.float32, device=device)
            gathered = torch.empty(elems * world, dtype=torch.float32, device=device)
            calls = {
                "all_reduce": functools.partial(dist.all_reduce, data),
                "all_gather": functools.partial(dist.all_gather_into_tensor, gathered, data),
            }
            for op, call in calls.items():
                call()  # warm-up: connections and buffers for this size
                n = iterations(elems * 4)
                if cuda and backend == "nccl":
                    torch.cuda.synchronize()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(n):
                    call()
                if cuda and backend == "nccl":
                    torch.cuda.synchronize()
                took = (time.perf_counter() - start) / n
                # The slowest rank's time is the collective's (nccl-tests reports the same).
                slowest = torch.tensor([took], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                took = float(slowest.item())
                if rank == 0:
                    algbw = elems * 4 / took / 1e9
                    print(json.dumps({"op": op, "bytes": elems * 4, "iters": n, "time_us": took * 1e6,
                                      "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(op, world)}),
                          flush=True)  # fmt: skip
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    try:
        sweep(json.loads(sys.argv[1]))
    except ModuleNotFoundError as exc:
        print(json.dumps({"error": f"{sys.executable}: {exc} (the sweep runs in the engine's Python)"}), flush=True)
        sys.exit(3)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        sys.exit(1)
