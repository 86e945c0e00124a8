"""Export a recipe as an sbatch script: one rank per node through ``srun``, then a readiness wait.

The allocation decides the addresses: the head is the first host of
``scontrol show hostnames $SLURM_JOB_NODELIST`` (``SPARKFLEET_HEAD_ADDR`` overrides it, e.g. with
the fabric address), and each task takes its rank from ``SLURM_PROCID``, which equals
``SLURM_NODEID`` with one task per node, so the script is right both on a real allocation and
on a single-host test Slurm. The commands come from the engine adapters (see rank_templates):
ranks run as plain processes, or in containers through pyxis/enroot or docker when the recipe
has an image. Secrets are never written into the script: they must be set in the environment
``sbatch`` runs in (Slurm exports it to the job) and are checked before anything starts.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from sparkfleet.config.cluster import Node
from sparkfleet.config.recipe import Recipe
from sparkfleet.exporters.rank_templates import Markers, NodeShape, gpus_per_node, rank_templates, staged_paths
from sparkfleet.plan.model import EnvVar, RankPlan
from sparkfleet.plan.secret_args import mask_words

ContainerTool = Literal["docker", "pyxis"]

# Marker -> the shell expression (already quoted) that replaces it inside a word.
_EXPR = {
    "@@HEAD@@": '"$HEAD_ADDR"',
    "@@SELF@@": '"$SELF_ADDR"',
    "@@RANK@@": '"$RANK"',
    "@@HF@@": '"$HF_CACHE"',
    "@@HOME@@": '"$HOME"',
    "@@STATE@@": '"$STATE_DIR"',
    "@@ENVFILE@@": '"$ENV_FILE"',
    "@@NODE@@": '"$(hostname -s)"',
}
_PEER = re.compile(r"@@PEER(\d+)@@")
_MARKER = re.compile(r"@@(?:HEAD|SELF|RANK|HF|HOME|STATE|ENVFILE|NODE|PEER\d+)@@")


@dataclass(frozen=True)
class SlurmOptions:
    """What the site, not the recipe, decides."""

    container: ContainerTool = "docker"
    # None: the cluster node's GPU count when --cluster names a device list, else one per node.
    gpus_per_node: int | None = None
    # Where `sparkfleet stage` wrote on the nodes; None: the cluster's state_dir, else the default.
    state_dir: str | None = None
    partition: str | None = None
    time_limit: str | None = None
    exclusive: bool = False
    poll_seconds: int = 2


def shell_word(word: str) -> str:
    """One argv word for bash: literal text single-quoted, markers as quoted expansions."""
    if not _MARKER.search(word):
        return shlex.quote(word)
    parts: list[str] = []
    pos = 0
    for m in _MARKER.finditer(word):
        if m.start() > pos:
            parts.append(shlex.quote(word[pos : m.start()]))
        peer = _PEER.fullmatch(m.group(0))
        parts.append(f'"${{PEERS[{peer.group(1)}]}}"' if peer else _EXPR[m.group(0)])
        pos = m.end()
    if pos < len(word):
        parts.append(shlex.quote(word[pos:]))
    return "".join(parts)


def _line(words: tuple[str, ...] | list[str]) -> str:
    return " ".join(shell_word(w) for w in words)


def _exports(env: tuple[EnvVar, ...]) -> list[str]:
    lines = []
    for var in env:
        if var.secret:
            message = f"{var.key} must be set in the environment that runs sbatch"
            lines.append(f': "${{{var.key}:?{message}}}"; export {var.key}')
        else:
            lines.append(f"export {var.key}={shell_word(var.value)}")
    return lines


def _env_file(env: tuple[EnvVar, ...]) -> list[str]:
    """Lines that write docker's --env-file on the node (secrets as bare names: docker reads them
    from the task's environment, so their values never touch the file)."""
    lines = [
        'ENV_FILE=$(mktemp "${TMPDIR:-/tmp}/sparkfleet-env.XXXXXX")',
        "{",
    ]
    for var in env:
        if var.secret:
            lines.append(f"  echo {var.key}")
        else:
            # docker's env-file takes the rest of the line literally: no quoting inside.
            lines.append(f"  printf '%s\\n' {shell_word(var.key + '=' + var.value)}")
    lines.append('} > "$ENV_FILE"')
    return lines


def _docker_words(rank: RankPlan) -> list[str]:
    assert rank.container_argv is not None
    words = list(mask_words(rank.container_argv, rank.secret_words))  # an argv-only credential: never in a file
    words[words.index("-d")] = "--rm"
    words[words.index("--env-file") + 1] = "@@ENVFILE@@"
    name_at = words.index("--name") + 1
    words[name_at] = re.sub(r"-r\d+$", "-r@@RANK@@", words[name_at])
    words = [re.sub(r"^(sparkfleet\.rank=)\d+$", r"\g<1>@@RANK@@", w) for w in words]
    # The node decides GPUs, memlock and RDMA devices (NODE_FLAGS, computed on the node).
    for flag in ("--gpus", "--ulimit", "--device"):
        while flag in words:
            i = words.index(flag)
            del words[i : i + 2]
    return words


def _launch(rank: RankPlan, recipe: Recipe, opts: SlurmOptions) -> list[str]:
    """The lines of one rank's branch in the task script."""
    if rank.runtime == "process" or opts.container == "pyxis":
        return [*_exports(rank.env), f"exec {_line(mask_words(rank.argv, rank.secret_words))}"]
    words = _docker_words(rank)
    image_at = words.index(recipe.docker_image or "")
    head = _line(words[:image_at])
    return [
        *_exports(rank.env),
        f"CONTAINER={shell_word(words[words.index('--name') + 1])}",
        *_env_file(rank.env),
        # scancel signals the docker client, not the container: remove the container on the way out.
        'cleanup() { docker rm -f "$CONTAINER" >/dev/null 2>&1 || true; rm -f "$ENV_FILE"; }',
        "trap cleanup EXIT",
        "trap 'exit 143' TERM INT",
        'docker rm -f "$CONTAINER" >/dev/null 2>&1 || true',
        "NODE_FLAGS=()",
        "if command -v nvidia-smi >/dev/null; then NODE_FLAGS+=(--gpus all); fi",
        'if [ "$(ulimit -H -l)" = unlimited ]; then NODE_FLAGS+=(--ulimit memlock=-1); fi',
        "if [ -e /dev/infiniband ]; then NODE_FLAGS+=(--device /dev/infiniband); fi",
        f'{head} "${{NODE_FLAGS[@]}}" {_line(words[image_at:])} &',
        'wait "$!"',
    ]


def pyxis_image(ref: str) -> str:
    """A docker image reference as pyxis/enroot's ``--container-image`` takes it: a registry host
    is separated by ``#`` (``ghcr.io#org/img:tag``); a Docker Hub reference stays as it is."""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def _staging_check(recipe: Recipe, deployment: str) -> list[str]:
    """Lines that stop a rank before it starts when what `sparkfleet stage` writes is missing."""
    values = {"hf": "@@HF@@", "state": "@@STATE@@", "home": "@@HOME@@", "name": deployment, "node": "@@NODE@@",
              "rank": "@@RANK@@"}  # fmt: skip
    paths = staged_paths(recipe, deployment, values)
    if not paths:
        return []
    hint = f"run sparkfleet stage for deployment {deployment} (same state_dir) before sbatch"
    return [
        f"for staged in {' '.join(shell_word(p) for p in paths)}; do",
        '  if [ ! -e "$staged" ]; then',
        f'    echo "sparkfleet: $(hostname): $staged is missing: {hint}" >&2; exit 1',
        "  fi",
        "done",
    ]


def _task_script(leader: RankPlan, worker: RankPlan | None, recipe: Recipe, opts: SlurmOptions,
                 deployment: str) -> str:  # fmt: skip
    lines = [
        "set -euo pipefail",
        "RANK=$SLURM_PROCID  # one task per node, so this is also SLURM_NODEID",
        'read -r -a PEERS <<< "$PEER_ADDRS"',
        "SELF_ADDR=${PEERS[$RANK]}",
        'echo "sparkfleet: rank $RANK on $(hostname) ($SELF_ADDR)"',
        *_staging_check(recipe, deployment),
        'if [ "$RANK" = 0 ]; then',
        *("  " + x for x in _launch(leader, recipe, opts)),
    ]
    if worker is not None:
        lines += ["else", *("  " + x for x in _launch(worker, recipe, opts))]
    else:
        lines += [
            "else",
            '  echo "sparkfleet: recipe has one rank; task $RANK has nothing to run" >&2',
            "  exit 1",
        ]
    lines.append("fi")
    return "\n".join(lines)


def slurm_script(recipe: Recipe, deployment: str, opts: SlurmOptions | None = None, like: Node | None = None) -> str:
    """The sbatch script for recipe as deployment NAME; ``like`` lends its NIC settings to every node."""
    opts = opts or SlurmOptions()
    n = recipe.required_nodes
    markers = Markers(head="@@HEAD@@", self_addr="@@SELF@@", rank="@@RANK@@", peer=lambda i: f"@@PEER{i}@@")
    t = rank_templates(recipe, deployment, markers, NodeShape("@@HF@@", "@@HOME@@", "@@STATE@@", like))
    plan = t.plan
    ready = t.leader.readiness
    health = ready.health_path or "/"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", deployment)
    sbatch = [f"#SBATCH --job-name=sparkfleet-{name}", f"#SBATCH --nodes={n}", "#SBATCH --ntasks-per-node=1"]
    gpus = opts.gpus_per_node if opts.gpus_per_node is not None else gpus_per_node(like, recipe)
    if gpus:
        sbatch.append(f"#SBATCH --gpus-per-node={gpus}")
    if opts.partition:
        sbatch.append(f"#SBATCH --partition={opts.partition}")
    if opts.time_limit:
        sbatch.append(f"#SBATCH --time={opts.time_limit}")
    if opts.exclusive:
        sbatch.append("#SBATCH --exclusive")
    srun = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if recipe.docker_image and opts.container == "pyxis":
        srun.append(f"--container-image={pyxis_image(recipe.docker_image)}")
        mounts = ",".join(f"{m.host}:{m.container}" + (":ro" if m.read_only else "") for m in t.leader.mounts)
        if mounts:
            srun.append(f"--container-mounts={mounts}")
    runtime = "process" if not recipe.docker_image else opts.container
    task = _task_script(t.leader, t.worker, recipe, opts, deployment)
    state_default = opts.state_dir or (like.state_dir if like is not None else "$HOME/.local/state/sparkfleet")
    return f"""#!/bin/bash
# sparkfleet export slurm of {recipe.source}: deployment {deployment!r}, {n} rank(s), {runtime}.
# Submit with: sbatch THIS_FILE   (secrets the recipe names must be set in that environment)
# Optional env at submit time: SPARKFLEET_HEAD_ADDR (address ranks reach the head at, e.g. its
# fabric IP; default: the first host's resolved address), SPARKFLEET_HF_CACHE (default
# ~/.cache/huggingface on the nodes), SPARKFLEET_STATE_DIR (default {state_default}: where
# `sparkfleet stage` wrote; each rank checks the staged paths there before it starts).
{chr(10).join(sbatch)}
set -euo pipefail

PORT={plan.port}
HEALTH_URL_PATH={shlex.quote(health)}
READY_TIMEOUT={int(recipe.verify.timeout)}
HF_CACHE="${{SPARKFLEET_HF_CACHE:-$HOME/.cache/huggingface}}"
STATE_DIR="${{SPARKFLEET_STATE_DIR:-{state_default}}}"
export HF_CACHE STATE_DIR

resolve() {{ getent ahostsv4 "$1" | awk 'NR == 1 {{ print $1 }}'; }}
mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
PEERS=()
for host in "${{HOSTS[@]}}"; do PEERS+=("$(resolve "$host")"); done
HEAD_ADDR=${{SPARKFLEET_HEAD_ADDR:-${{PEERS[0]}}}}
PEER_ADDRS="${{PEERS[*]}}"
export HEAD_ADDR PEER_ADDRS
echo "sparkfleet: head ${{HOSTS[0]}} at $HEAD_ADDR; nodes ${{HOSTS[*]}}"

read -r -d '' TASK_SCRIPT <<'SPARKFLEET_TASK' || true
{task}
SPARKFLEET_TASK

{_line(srun)} bash -c "$TASK_SCRIPT" &
SRUN_PID=$!
trap 'kill "$SRUN_PID" 2>/dev/null || true' TERM INT

# Ready when rank 0 answers its health endpoint; a rank exiting first fails the job.
URL="http://$HEAD_ADDR:$PORT$HEALTH_URL_PATH"
deadline=$((SECONDS + READY_TIMEOUT))
# (and the ranks still alive: a stale server on the same port must not pass for this job's).
until curl -fs -o /dev/null --max-time 5 "$URL" && kill -0 "$SRUN_PID" 2>/dev/null; do
  if ! kill -0 "$SRUN_PID" 2>/dev/null; then
    rc=0; wait "$SRUN_PID" || rc=$?
    echo "sparkfleet: ranks exited (status $rc) before $URL answered" >&2
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "sparkfleet: $URL not ready after $READY_TIMEOUT s" >&2
    kill "$SRUN_PID" 2>/dev/null || true
    exit 1
  fi
  sleep {opts.poll_seconds}
done
echo "sparkfleet: {deployment} ready at http://$HEAD_ADDR:$PORT (job $SLURM_JOB_ID)"
rc=0; wait "$SRUN_PID" || rc=$?
exit "$rc"
"""
