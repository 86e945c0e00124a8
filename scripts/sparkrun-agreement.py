#!/usr/bin/env python3
"""Does `sparkfleet import sparkrun` + `plan` run what sparkrun itself would run?

    .venv/bin/python scripts/sparkrun-agreement.py CORPUS_DIR SPARKRUN_SRC \\
        --sparkrun-python /path/to/sparkrun-venv/bin/python [--sparkrun-version 0.3.0] [--json OUT]

For every recipe file in CORPUS_DIR (third-party sparkrun recipes, kept outside the project):

* sparkrun: scripts/sparkrun_render.py runs under sparkrun's own Python with SPARKRUN_SRC/src on
  the path and asks sparkrun's code (Recipe.load, its placement, generate_command, a dry-run
  runtime.run with recording executor) what each container gets: image, volumes, env, and the
  serve command exec'd in it, on a stand-in cluster of eight nodes (10.99.0.1-8, HF cache
  /site/hf-cache).
* sparkfleet: `import_sparkrun` (the rules of --sparkrun-version, which should be the version of
  SPARKRUN_SRC), then `plan` on a cluster file of the same eight nodes.

Both are normalised for site values only, then compared per rank: the node count; the serve
command as a program, a positional model and a multiset of (flag, value) (flag spellings that
are the same option are one; the bind address, rendezvous/head and node addresses become
<BIND>/<HEAD>/<NODE>); the env without the site's network keys (NCCL/GLOO/UCX interfaces and
HCAs, *_HOST_IP, NODE_IP) with the HF cache's host path as <HF>; the container paths mounted; the
image. A recipe agrees when all of these are equal. There are no equivalences: a parallel size
of 1 written on one side only, or --host/--port on a vLLM --headless rank on one side only, is
a difference (an imported recipe's command_style "sparkrun" keeps the command's own size, host
and port flags, so sparkfleet writes what sparkrun writes; docs/import-export.md). A recipe
sparkfleet refuses (import or plan error) or warns about (its `not_carried` list, which
validate/plan print and --strict refuses) is listed with the reason. The last line is the share
that agrees.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOSTS = [f"10.99.0.{i}" for i in range(1, 9)]
HF_CACHE = "/site/hf-cache"
# Env keys whose values are the site's network (sparkrun detects them, sparkfleet reads them
# from the cluster file): not compared.
SITE_ENV = re.compile(
    r"^(NCCL_SOCKET_IFNAME|NCCL_IB_HCA|NCCL_IB_GID_INDEX|NCCL_IB_DISABLE|NCCL_NET|NCCL_CROSS_NIC|"
    r"NCCL_IGNORE_CPU_AFFINITY|NCCL_NET_PLUGIN|NCCL_IB_SUBNET_AWARE_ROUTING|NCCL_IB_MERGE_NICS|"
    r"GLOO_SOCKET_IFNAME|TP_SOCKET_IFNAME|UCX_NET_DEVICES|OMPI_MCA_btl_tcp_if_include|MN_IF_NAME|"
    r"NODE_IP|VLLM_HOST_IP|SGLANG_HOST_IP)$"
)
# One option, several spellings (the engines' own aliases).
ALIASES = {
    "--tp": "--tp-size", "--tensor-parallel-size": "-tp", "--pipeline-parallel-size": "-pp",
    "--model": "--model-path", "--alias": "-a",
}  # fmt: skip
SGLANG_ALIASES = {"--tp": "--tp-size", "--tensor-parallel-size": "--tp-size", "--model": "--model-path"}
VLLM_ALIASES = {"--tensor-parallel-size": "-tp", "--pipeline-parallel-size": "-pp", "--model": "<model>"}


def sparkrun_side(corpus: list[Path], src: Path, python: str, version: str | None = None) -> dict[str, dict]:
    # SPARKRUN_SRC is a source tree (its src/ on the path) or, for a release installed in
    # --sparkrun-python's venv (0.4.2 from PyPI), anything: the venv's copy is imported then.
    env = {**os.environ, "PYTHONPATH": str(src / "src"), "SPARKRUN_RENDER_VERSION": version or ""}
    proc = subprocess.run(
        [python, str(HERE / "sparkrun_render.py")],
        input="".join(f"{p}\n" for p in corpus), capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            out[item["file"]] = item
    if not out:
        sys.exit(f"sparkrun_render.py gave nothing (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return out


def cluster_file(tmp: Path) -> Path:
    nodes = "".join(f'[[nodes]]\nname = "n{i}"\nhost = "{h}"\nfabric_ip = "{h}"\n\n' for i, h in enumerate(HOSTS, 1))
    path = tmp / "standin-cluster.toml"
    path.write_text(f'name = "standin"\n\n[defaults]\nhf_cache = "{HF_CACHE}"\n\n{nodes}')
    return path


def sparkfleet_side(path: Path, version: str | None, cluster: Path, tmp: Path) -> dict:
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.config.recipe import load_recipe
    from sparkfleet.errors import SparkfleetError
    from sparkfleet.importers.sparkrun import import_sparkrun, read_sparkrun
    from sparkfleet.plan.build import plan

    try:
        result = import_sparkrun(read_sparkrun(path), sparkrun_version=version)
    except SparkfleetError as exc:
        return {"refused": f"import: {exc}"}
    recipe_path = tmp / (path.stem.replace(".", "_") + ".toml")
    recipe_path.write_text(result.recipe_toml)
    try:
        recipe = load_recipe(recipe_path)
        planned = plan(recipe, load_cluster(cluster), "standin")
    except SparkfleetError as exc:
        return {"refused": f"plan: {str(exc).replace(str(recipe_path), 'recipe')}", "not_carried": []}
    ranks = []
    for r in planned.ranks:
        ranks.append({
            "host": r.node.host, "argv": list(r.argv), "env": {e.key: e.value for e in r.env},
            "mounts": {m.container: m.host for m in r.mounts}, "image": r.image,
        })  # fmt: skip
    return {"ranks": ranks, "not_carried": list(recipe.not_carried)}


# --- normalising -------------------------------------------------------------------------------


def _serve_words(argv: list[str]) -> list[str]:
    """The engine command of a planned argv (a Ray head's `bash -c` runs it after `exec`)."""
    if argv[:2] == ["bash", "-c"]:
        script = argv[2]
        if " exec " in script:
            return shlex.split(script.split(" exec ", 1)[1])
        return shlex.split(script)
    return argv


def _sparkrun_words(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "))


def command_shape(words: list[str], head: str, node: str) -> tuple[tuple[str, ...], str | None, Counter]:
    """(program, positional model, multiset of (flag, value)), site values as placeholders."""
    if words[:1] == ["exec"]:
        words = words[1:]
    start = 3 if len(words) >= 3 and words[1] == "-m" else 0
    first = next((i for i, w in enumerate(words) if i >= start and w.startswith("-")), len(words))
    program, rest = tuple(words[:first]), words[first:]
    positional = None
    if program[:2] == ("vllm", "serve") and len(program) > 2:
        program, positional = program[:2], program[2]
    if program in (("sglang", "serve"), ("python3", "-m", "sglang.launch_server"),
                   ("python", "-m", "sglang.launch_server")):  # fmt: skip
        aliases = SGLANG_ALIASES
    elif program[:2] == ("vllm", "serve"):
        aliases = VLLM_ALIASES
    else:
        aliases = {}
    flags: Counter = Counter()
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", word):
            flag, eq, value = word.partition("=")
            if not eq:
                value = ""
                nxt = rest[i + 1] if i + 1 < len(rest) else None
                if nxt is not None and (not nxt.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", nxt)):
                    value = nxt
                    i += 1
            flag = aliases.get(flag, flag)
            if flag == "<model>":
                positional = value
                i += 1
                continue
            flags[(flag, _site(flag, value, head, node))] += 1
        else:
            flags[("<arg>", word)] += 1
        i += 1
    return program, positional, flags


def _site(flag: str, value: str, head: str, node: str) -> str:
    if flag == "--host":
        return "<BIND>"
    value = value.replace(HF_CACHE, "<HF>")
    if flag in ("--dist-init-addr", "--master-addr", "--data-parallel-address"):
        return re.sub(r"^[^:]+", "<HEAD>", value)
    if flag in ("--node-ip-address",):
        return "<NODE>"
    return value.replace(head, "<HEAD>") if head else value


def env_shape(env: dict[str, str]) -> dict[str, str]:
    return {k: v.replace(HF_CACHE, "<HF>") for k, v in env.items() if not SITE_ENV.match(k)}


# --- comparing ---------------------------------------------------------------------------------


def compare(sr: dict, sf: dict) -> list[str]:
    """What differs between sparkrun's containers and sparkfleet's ranks (empty: they agree)."""
    diffs: list[str] = []
    containers = [c for c in sr["containers"] if c.get("serve") or c.get("scripts")]
    if len(containers) != len(sf["ranks"]):
        diffs.append(f"nodes: sparkrun {len(containers)} ({len(sr['hosts'])} hosts), sparkfleet {len(sf['ranks'])}")
        return diffs
    head = sr["hosts"][0]
    for rank, (c, r) in enumerate(zip(containers, sf["ranks"], strict=True)):
        where = f"rank {rank}"
        for script in c.get("scripts", []):  # a Ray node: its container comes from the ray script
            kw = script["kwargs"]
            c = {**c, "image": kw.get("image", c.get("image")), "volumes": kw.get("volumes") or {},
                 "env": kw.get("env") or {}, "ray_worker": script["kind"] == "generate_ray_worker_script"}  # fmt: skip
        serve = c["serve"][-1]["command"] if c.get("serve") else ""
        a = command_shape(_sparkrun_words(serve), head, sr["hosts"][rank]) if serve else ((), None, Counter())
        b = command_shape(_serve_words(r["argv"]), head, r["host"])
        if c.get("ray_worker") and not serve:
            # Both join the head's Ray cluster and run nothing else (sparkrun: ray_worker.sh).
            joined = r["argv"][:2] == ["bash", "-c"] and "ray start --block --address=" in r["argv"][2]
            a = b = ((), None, Counter()) if joined else (("ray start",), None, Counter())
        if a[0] != b[0]:
            diffs.append(f"{where} program: {' '.join(a[0])} / {' '.join(b[0])}")
        if a[1] != b[1]:
            diffs.append(f"{where} model: {a[1]} / {b[1]}")
        fa, fb = a[2], b[2]
        only_a, only_b = fa - fb, fb - fa
        if only_a or only_b:
            show = lambda c: " ".join(f"{f} {v}".strip() for f, v in sorted(c.elements()))  # noqa: E731
            diffs.append(f"{where} flags: sparkrun-only [{show(only_a)}] sparkfleet-only [{show(only_b)}]")
        env_a = env_shape({**c.get("env", {}), **(c["serve"][-1]["env"] if c.get("serve") else {})})
        env_b = env_shape(r["env"])
        keys = sorted(set(env_a) | set(env_b))
        bad = [f"{k}={env_a.get(k, '-')}/{env_b.get(k, '-')}" for k in keys if env_a.get(k) != env_b.get(k)]
        if bad:
            diffs.append(f"{where} env (sparkrun/sparkfleet): {', '.join(bad)}")
        mounts_a = sorted(c.get("volumes", {}).values())
        mounts_b = sorted(r["mounts"])
        if mounts_a != mounts_b:
            diffs.append(f"{where} mounts: {mounts_a} / {mounts_b}")
        if r["image"] and c.get("image") and c["image"] != r["image"]:
            diffs.append(f"{where} image: {c['image']} / {r['image']}")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("sparkrun_src", type=Path)
    ap.add_argument("--sparkrun-python", default=sys.executable)
    ap.add_argument(
        "--sparkrun-version", default=None, help="the rules sparkfleet's import follows: the version of SPARKRUN_SRC"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every difference, not the first")
    # Every comparison is strict now; the flag stays accepted for older command lines.
    ap.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    corpus = sorted(p for p in args.corpus.iterdir() if p.suffix in (".yaml", ".yml"))
    sr_all = sparkrun_side(corpus, args.sparkrun_src, args.sparkrun_python, args.sparkrun_version)
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        cluster = cluster_file(tmp)
        for path in corpus:
            sr = sr_all.get(str(path), {"ok": False, "error": "no answer from sparkrun"})
            sf = sparkfleet_side(path, args.sparkrun_version, cluster, tmp)
            warned = sf.get("not_carried") or []
            if not sr.get("ok"):
                verdict, why = "sparkrun-refuses", sr.get("error") or "?"
                if "refused" in sf:
                    why += f" | sparkfleet: {sf['refused']}"
            elif "refused" in sf:
                verdict, why = "refused", sf["refused"]
            else:
                diffs = compare(sr, sf)
                verdict = "agree" if not diffs else "differs"
                why = "; ".join(diffs if args.verbose else diffs[:2])
                if warned:
                    verdict += "+warned"
                    why = (why + " | " if why else "") + "warned: " + "; ".join(w.split(":")[0] for w in warned)
            rows.append({"recipe": path.name, "verdict": verdict, "detail": why})
    width = max(len(r["recipe"]) for r in rows)
    for r in rows:
        print(f"{r['recipe']:<{width}}  {r['verdict']:<16}  {r['detail']}")
    counts = Counter(r["verdict"].split("+")[0] for r in rows)
    judged = [r for r in rows if r["verdict"] != "sparkrun-refuses"]
    agree = sum(1 for r in judged if r["verdict"].startswith("agree"))
    named = sum(1 for r in judged if r["verdict"] == "refused" or r["verdict"] == "differs+warned")
    print()
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    share = agree / len(judged) if judged else 0.0
    print(f"agree: {agree}/{len(judged)} = {share:.1%} of the recipes sparkrun itself can launch "
          f"({len(rows) - len(judged)} it refuses); refused or warned by name among the rest: "
          f"{named}/{len(judged) - agree}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
