"""`export slurm`: the script's per-rank commands are the planner's commands, run by real bash.

The single-host Slurm test (tests/integration/test_slurm_export.py) can only give one task per
node, so multi-rank scripts are checked here by running their task script under bash for each
rank, with the engine replaced by a program that prints the argv and env it was given.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import Recipe, load_recipe, parse_recipe
from sparkfleet.exporters.slurm import SlurmOptions, shell_word, slurm_script
from sparkfleet.plan.build import plan
from tests.conftest import SEEDS

PEERS = ["10.1.0.5", "10.1.0.6", "10.1.0.7"]
# Prints its argv and the env keys the recipe sets, as JSON, then exits.
ECHO = ["python3", "-c", "import json,os,sys; print(json.dumps([sys.argv[1:], dict(os.environ)]))"]


def _task(script: str) -> str:
    return script.split("<<'SPARKFLEET_TASK' || true\n", 1)[1].split("\nSPARKFLEET_TASK\n", 1)[0]


def _run_rank(script: str, rank: int, home: Path) -> tuple[list[str], dict[str, str]]:
    env = {"PATH": os.environ["PATH"], "HOME": str(Path.home()), "SLURM_PROCID": str(rank),
           "PEER_ADDRS": " ".join(PEERS), "HEAD_ADDR": PEERS[0], "HF_CACHE": f"{home}/hf",
           "STATE_DIR": f"{home}/state"}  # fmt: skip
    done = subprocess.run(["bash", "-c", _task(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    argv, seen = json.loads(done.stdout.strip().splitlines()[-1])
    return argv, seen


def _cluster(home: Path):  # type: ignore[no-untyped-def]
    nodes = [{"name": f"n{i}", "host": ip, "hf_cache": f"{home}/hf", "state_dir": f"{home}/state"}
             for i, ip in enumerate(PEERS)]  # fmt: skip
    return parse_cluster({"name": "t", "nodes": nodes}, "t")


def _echo_recipe(engine: str, nodes: int, **extra: object) -> Recipe:
    data = {"engine": engine, "model": "org/model", "required_nodes": nodes, "tensor_parallel_size": nodes,
            "entrypoint": ECHO, "args": ["--json-arg", "{\"a\": 1}", "--quote", "it's"],
            "env": {"MY_KNOB": "two words", "HOME_DIR": "{{home}}/x"}, **extra}  # fmt: skip
    return parse_recipe(data, "r.toml")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_rank_runs_the_planned_command(engine: str, tmp_path: Path) -> None:
    recipe = _echo_recipe(engine, 3)
    script = slurm_script(recipe, "t")
    planned = plan(recipe, _cluster(tmp_path), "t")
    for rank in range(3):
        argv, env = _run_rank(script, rank, tmp_path)
        assert argv == list(planned.ranks[rank].argv[3:]), rank
        want = planned.ranks[rank].env_dict()
        assert {k: env.get(k) for k in want} == want


def test_llamacpp_head_waits_for_every_rpc_server_and_workers_bind_their_own_address(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = {"engine": "llama-cpp", "model": "/m", "model_file": "f.gguf", "required_nodes": 3,
            "tensor_parallel_size": 3, "entrypoint": ECHO, "rendezvous_port": port}  # fmt: skip
    recipe = parse_recipe(data, "r.toml")
    task = _task(slurm_script(recipe, "t"))
    peers = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    env = {"PATH": os.environ["PATH"], "HOME": str(Path.home()), "SLURM_PROCID": "0", "PEER_ADDRS": " ".join(peers),
           "HEAD_ADDR": peers[0], "HF_CACHE": f"{tmp_path}/hf", "STATE_DIR": f"{tmp_path}/state"}  # fmt: skip
    listeners = []
    head = subprocess.Popen(["bash", "-c", task], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Only one rpc-server is up: the leader must not start.
        listeners.append(socket.create_server((peers[1], port)))
        with pytest.raises(subprocess.TimeoutExpired):
            head.wait(timeout=3)
        listeners.append(socket.create_server((peers[2], port)))
        out, err = head.communicate(timeout=20)
    finally:
        head.kill()
        for s in listeners:
            s.close()
    assert head.returncode == 0, err
    assert f"waiting for rpc-server {peers[2]}:{port}" in err
    argv, _ = json.loads(out.strip().splitlines()[-1])
    assert argv[argv.index("--rpc") + 1] == f"{peers[1]}:{port},{peers[2]}:{port}"
    # Ranks above 0 are rpc-server (not the entrypoint): check the script line itself.
    assert f'exec rpc-server --host "$SELF_ADDR" --port {port}' in task


def test_secrets_are_required_from_the_environment_never_written(tmp_path: Path) -> None:
    recipe = _echo_recipe("vllm", 1, env={"HF_TOKEN": "hf_verysecret"})
    script = slurm_script(recipe, "t")
    assert "hf_verysecret" not in script
    assert ': "${HF_TOKEN:?HF_TOKEN must be set in the environment that runs sbatch}"' in script
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "0", "PEER_ADDRS": "1.2.3.4", "HEAD_ADDR": "1.2.3.4",
           "HF_CACHE": "/h", "STATE_DIR": "/s", "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(["bash", "-c", _task(script)], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "HF_TOKEN must be set" in done.stderr
    done = subprocess.run(["bash", "-c", _task(script)], env={**env, "HF_TOKEN": "x"}, capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1])[1]["HF_TOKEN"] == "x"


def test_docker_ranks_use_foreground_containers_and_an_env_file(tmp_path: Path) -> None:
    script = slurm_script(load_recipe(SEEDS / "dsv41-flash-4x-mia"), "mia", SlurmOptions(gpus_per_node=1))
    assert "#SBATCH --nodes=4" in script and "#SBATCH --gpus-per-node=1" in script
    assert 'docker run --rm --name sparkfleet-mia-r"$RANK"' in script
    assert '--env-file "$ENV_FILE"' in script and '"${NODE_FLAGS[@]}"' in script
    assert "--gpus all" not in script.replace("NODE_FLAGS+=(--gpus all)", "")
    assert '--dist-init-addr "$HEAD_ADDR":20000' in script and '--node-rank "$RANK"' in script
    assert "srun --nodes=4 --ntasks=4 --ntasks-per-node=1" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_pyxis_runs_the_command_inside_the_image(tmp_path: Path) -> None:
    script = slurm_script(load_recipe(SEEDS / "dsv41-flash-4x-mia"), "mia", SlurmOptions(container="pyxis"))
    assert "--container-image=dsv41-4x-spark:mia-tp4" in script
    assert "--container-mounts=" in script and "/home/kilork/mia-state:/state" in script
    assert "docker run" not in script and "exec python3 -m sglang.launch_server" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_shell_word_quotes_text_and_expands_markers() -> None:
    assert shell_word("it's") == "'it'\"'\"'s'"
    assert shell_word("@@HEAD@@:20000") == '"$HEAD_ADDR":20000'
    assert shell_word("@@PEER2@@:1,@@PEER1@@") == '"${PEERS[2]}":1,"${PEERS[1]}"'
    out = subprocess.run(["bash", "-c", f"HEAD_ADDR='a b'; printf '%s|' {shell_word('x@@HEAD@@y $z')}"],
                         capture_output=True, text=True).stdout  # fmt: skip
    assert out == "xa by $z|"


def test_rank_template_in_env_and_args_follows_each_rank(tmp_path: Path) -> None:
    recipe = _echo_recipe("sglang", 3, env={"LOG_NAME": "rank-{{rank}}.log"}, args=["--tag", "r{{rank}}"])
    script = slurm_script(recipe, "t")
    for rank in range(3):
        argv, env = _run_rank(script, rank, tmp_path)
        assert env["LOG_NAME"] == f"rank-{rank}.log" and argv[argv.index("--tag") + 1] == f"r{rank}"


def test_imported_profile_exports_with_its_cluster_nics(tmp_path: Path) -> None:
    # import mia-env puts NICs in the cluster file; export --cluster must carry them to every rank.
    from sparkfleet.importers.mia_env import import_mia_env
    from sparkfleet.importers.shell_profile import parse_profile
    from tests.unit.test_import_mia_env import filled, production_text

    result = import_mia_env(parse_profile(production_text(), "env.tp4"))
    (tmp_path / "recipe.toml").write_text(filled(result.recipe_toml))
    (tmp_path / "cluster.toml").write_text(filled(result.cluster_toml or ""))
    out = tmp_path / "job.sbatch"
    cmd = [sys.executable, "-m", "sparkfleet.cli.main", "export", "slurm", str(tmp_path / "recipe.toml"),
           "--cluster", str(tmp_path / "cluster.toml"), "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    script = out.read_text()
    # Both branches (rank 0, ranks above 0) export it and write it to the container env file.
    assert script.count("export NCCL_SOCKET_IFNAME=enP7s7") == 2
    assert script.count("NCCL_IB_HCA=rocep1s0f0,rocep1s0f1") == 4
    assert out.stat().st_mode & 0o111


def test_image_forms_gpus_and_staging_checked_before_a_rank_starts(tmp_path: Path) -> None:
    from sparkfleet.exporters.slurm import pyxis_image

    assert pyxis_image("ghcr.io/spark-arena/vllm:1") == "ghcr.io#spark-arena/vllm:1"
    assert pyxis_image("localhost:5000/img") == "localhost:5000#img"
    assert pyxis_image("lmsysorg/sglang:spark") == "lmsysorg/sglang:spark"
    recipe = _echo_recipe("vllm", 2, docker_image="nvcr.io/nvidia/vllm:25.09", staging=[
        {"kind": "sync", "id": "weights", "src": "/data/w", "dst": "{{state}}/staged/{{name}}/w"}])  # fmt: skip
    script = slurm_script(recipe, "t", SlurmOptions(container="pyxis"))
    assert "--container-image=nvcr.io#nvidia/vllm:25.09" in script
    assert "#SBATCH --gpus-per-node=1" in script  # one GPU per node unless told otherwise
    assert "#SBATCH --gpus-per-node=4" in slurm_script(recipe, "t", SlurmOptions(gpus_per_node=4))
    like = _cluster(tmp_path).nodes[0].model_copy(update={"gpus": "0,1", "state_dir": "/srv/sf"})
    from_cluster = slurm_script(recipe, "t", SlurmOptions(container="pyxis"), like=like)
    assert "#SBATCH --gpus-per-node=2" in from_cluster
    assert 'STATE_DIR="${SPARKFLEET_STATE_DIR:-/srv/sf}"' in from_cluster
    # Without what `sparkfleet stage` writes the rank stops with a line naming the path.
    env = {"PATH": os.environ["PATH"], "HOME": str(Path.home()), "SLURM_PROCID": "1", "PEER_ADDRS": " ".join(PEERS),
           "HEAD_ADDR": PEERS[0], "HF_CACHE": f"{tmp_path}/hf", "STATE_DIR": f"{tmp_path}/state"}  # fmt: skip
    done = subprocess.run(["bash", "-c", _task(script)], env=env, capture_output=True, text=True, timeout=30)
    missing = f"{tmp_path}/state/staged/t/w"
    assert done.returncode == 1 and f"{missing} is missing: run sparkfleet stage" in done.stderr
    Path(missing).mkdir(parents=True)
    argv, _ = _run_rank(script, 1, tmp_path)
    assert "--headless" in argv
