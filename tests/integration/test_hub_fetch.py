"""The model from the Hub onto the source node, then to the others, on the loopback fleet (a real
sshd per node): the real ``huggingface_hub`` client on the node, pointed by ``HF_ENDPOINT`` at the
stand-in Hub (tests/hub_standin.py), which serves meta-llama/Llama-3.1-8B-Instruct's real file
list (a second checkpoint in ``original/`` as a 16 GB ``.pth``) with small contents."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

from sparkfleet.apply.staging.hub import HubReport
from sparkfleet.apply.staging.phase import StagePhase, stage
from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import StagingError
from sparkfleet.nodes.transport.ssh import SshTransport
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Plan
from tests.fleet.loopback import LoopbackFleet
from tests.hub_standin import Hub, standin_hub
from tests.integration.conftest import leftover_processes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="openssh-server missing"),
]

LOADER = Path(__file__).resolve().parents[1] / "hub_loading_engine.py"
REPO = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
FOLDER = "models--meta-llama--Llama-3.1-8B-Instruct"
TOKEN = "hf_standinTOKEN0123456789"
# What vLLM/SGLang load of this repo: the four shards the index names, the index, the configs
# and the tokenizer. Not original/ (consolidated.00.pth, params.json, tokenizer.model), nor the
# README, LICENSE, USE_POLICY.md and .gitattributes.
ENGINE_FILES = {
    "config.json", "generation_config.json", "model.safetensors.index.json",
    "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
    "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
    "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
}  # fmt: skip


def fetched(phase: StagePhase) -> HubReport | None:
    """What the phase's Hub fetch did (None: there was none)."""
    return next(iter(phase.of(HubReport)), None)


@dataclass
class Setup:
    fleet: LoopbackFleet
    plan: Plan
    transports: dict[str, SshTransport]
    hub: Hub

    def snapshot(self, i: int) -> Path:
        return self.fleet.nodes[i].hf_cache / "hub" / FOLDER / "snapshots" / COMMIT


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Setup]:
    with standin_hub(shrink=getattr(request, "param", 1024)) as hub:
        fleet = LoopbackFleet(3, tmp_path / "fleet")
        try:
            cluster_file = fleet.cluster_file
            # The node's python has huggingface_hub (the venv's): the fetch runs with it on the node.
            text = cluster_file.read_text().replace("[defaults]\n", f'[defaults]\npython = "{sys.executable}"\n', 1)
            cluster_file.write_text(text)
            recipe = tmp_path / "recipe"
            recipe.mkdir()
            (recipe / "recipe.toml").write_text(
                f'engine = "vllm"\nmodel = "{REPO}"\nrevision = "{COMMIT}"\nrequired_nodes = 3\n'
                f'tensor_parallel_size = 3\n[env]\nHF_TOKEN = "{TOKEN}"\n'
                f'[[staging]]\nkind = "sync"\nid = "weights"\nsrc = "{{{{hf}}}}/hub/{FOLDER}"\n'
                f'dst = "{{{{hf}}}}/hub/{FOLDER}"\nsource_node = "node0"\n'
            )
            monkeypatch.setenv("HF_ENDPOINT", hub.url)
            p = plan(load_recipe(recipe), load_cluster(cluster_file), "hub")
            transports = {r.node.name: SshTransport(r.node) for r in p.ranks}
            yield Setup(fleet, p, transports, hub)
            for t in transports.values():
                t.close()
        finally:
            fleet.close()


def test_only_the_engines_files_are_fetched_once_then_copied_node_to_node(setup: Setup) -> None:
    repo = setup.hub.repos[REPO]
    first = stage(setup.plan, setup.transports)
    assert fetched(first) is not None
    assert {name for name, _ in fetched(first).fetched} == ENGINE_FILES
    assert {name for name, _, _ in fetched(first).skipped} == set(repo.files) - ENGINE_FILES
    assert fetched(first).bytes_fetched == sum(len(repo.files[n]) for n in ENGINE_FILES) == setup.hub.bytes_served
    assert setup.hub.tokens == {TOKEN}  # the recipe's secret reached the Hub
    why = {name: reason for name, _, reason in fetched(first).skipped}
    assert "second copy" in why["original/consolidated.00.pth"] and why["README.md"] == "not read by the engine"
    # Every node holds exactly the engine's files, byte for byte the Hub's.
    served = {n: hashlib.sha256(repo.files[n]).hexdigest() for n in ENGINE_FILES}
    for i in range(3):
        assert _files(setup.snapshot(i)) == served, f"node{i}"
    assert first.bytes_between_nodes == 2 * setup.hub.bytes_served  # node0 → node1 → node2, once each

    setup.hub.requests.clear()
    second = stage(setup.plan, setup.transports)
    assert fetched(second) is not None and fetched(second).bytes_fetched == 0 and fetched(second).fetched == ()
    assert setup.hub.requests == [] and second.bytes_between_nodes == 0


# huggingface_hub writes what it received in 10 MiB chunks: shards shrunk only 128-fold (39 MB)
# so that a cut at three quarters leaves whole chunks behind to resume from.
@pytest.mark.parametrize("setup", [128], indirect=True)
def test_a_download_cut_half_way_is_resumed_from_where_it_stopped(setup: Setup) -> None:
    shard = "model-00002-of-00004.safetensors"
    size = len(setup.hub.repos[REPO].files[shard])
    cut = size * 3 // 4
    setup.hub.cut[shard] = cut
    report = stage(setup.plan, setup.transports)
    ranges = [r for method, path, r in setup.hub.requests if method == "GET" and path.endswith(shard) and r]
    assert len(ranges) == 1, setup.hub.requests
    resumed_at = int(ranges[0].removeprefix("bytes=").rstrip("-"))
    assert cut - DOWNLOAD_CHUNK_SIZE <= resumed_at <= cut  # not from the start
    assert setup.hub.served[shard] == cut + size - resumed_at
    assert fetched(report) is not None and dict(fetched(report).fetched)[shard] == size
    want = hashlib.sha256(setup.hub.repos[REPO].files[shard]).hexdigest()
    assert all(_files(setup.snapshot(i))[shard] == want for i in range(3))


def test_a_file_whose_hash_differs_from_the_listing_is_refused_and_not_kept(setup: Setup) -> None:
    shard = "model-00003-of-00004.safetensors"
    setup.hub.corrupt.add(shard)
    with pytest.raises(StagingError) as err:
        stage(setup.plan, setup.transports)
    assert err.value.node == "node0" and shard in str(err.value) and "sha256" in str(err.value)
    assert TOKEN not in str(err.value)
    blobs = setup.fleet.nodes[0].hf_cache / "hub" / FOLDER / "blobs"
    assert setup.hub.repos[REPO].sha256(shard) not in os.listdir(blobs)
    assert not (setup.snapshot(0) / shard).exists() and not setup.snapshot(1).exists()  # nothing distributed


def test_the_engine_loads_the_staged_model_offline_without_asking_the_hub(setup: Setup) -> None:
    stage(setup.plan, setup.transports)
    # What vLLM and SGLang do with a repo id: huggingface_hub resolves it in HF_HOME. With the
    # environment the plan gives every rank (HF_HUB_OFFLINE=1), that is the node's cache only.
    load = f"from huggingface_hub import snapshot_download; print(snapshot_download({REPO!r}, revision={COMMIT!r}))"
    for rank in setup.plan.ranks:
        env = {**os.environ, **rank.env_dict(), "HF_ENDPOINT": setup.hub.url}
        assert env["HF_HUB_OFFLINE"] == "1"
        setup.hub.requests.clear()
        out = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert Path(out.stdout.strip()) == setup.snapshot(rank.rank)
        assert setup.hub.requests == [], f"rank {rank.rank} asked the Hub: {setup.hub.requests}"
    # The same load with the Hub switched on asks it (the count above can see a request).
    env = {**os.environ, **setup.plan.head.env_dict(), "HF_ENDPOINT": setup.hub.url, "HF_HUB_OFFLINE": "0"}
    subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=60)
    assert setup.hub.requests != []


def test_the_node_needs_huggingface_hub_and_is_told_so(setup: Setup, tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec {shutil.which("python3") or "/usr/bin/python3"} -I "$@"\n')
    bare.chmod(0o755)
    text = setup.fleet.cluster_file.read_text().replace(sys.executable, str(bare))
    setup.fleet.cluster_file.write_text(text)
    p = plan(load_recipe(Path(setup.plan.recipe_source).parent), load_cluster(setup.fleet.cluster_file), "hub")
    with pytest.raises(StagingError, match="huggingface_hub is not installed"):
        stage(p, setup.transports)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def test_plan_and_stage_say_what_is_fetched_and_why_the_rest_is_not(setup: Setup) -> None:
    # Unpinned this time: the Hub names the commit, and the cache resolves `main` to it afterwards.
    recipe = Path(setup.plan.recipe_source)
    recipe = recipe if recipe.is_file() else recipe / "recipe.toml"
    recipe.write_text(recipe.read_text().replace(f'revision = "{COMMIT}"\n', ""))
    cluster = str(setup.fleet.cluster_file)
    planned = _cli("plan", str(recipe), "--cluster", cluster)
    assert planned.returncode == 0, planned.stderr
    assert f"from the Hub: {REPO}@main onto node0" in planned.stdout
    assert "a second copy the engine does not load" in planned.stdout

    bad = _cli("stage", str(recipe), "--cluster", cluster, "--method", "sideways")
    assert bad.returncode == 2 and "--method 'sideways': choose pipeline or push" in bad.stderr

    staged = _cli("stage", str(recipe), "--cluster", cluster, "--method", "push")
    assert staged.returncode == 0, staged.stderr
    fetched = sum(len(setup.hub.repos[REPO].files[n]) for n in ENGINE_FILES)
    assert f"from the Hub onto node0: {fetched:,} bytes (10 file(s) fetched, 0 already there); " \
           f"between nodes: " in staged.stdout  # fmt: skip
    assert "not fetched: original/consolidated.00.pth (15,684,196 bytes): in original/: a second copy" in staged.stdout
    assert TOKEN not in staged.stdout + staged.stderr
    for i in range(3):
        repo = setup.fleet.nodes[i].hf_cache / "hub" / FOLDER
        assert (repo / "refs" / "main").read_text() == COMMIT
        assert set(_files(setup.snapshot(i))) == ENGINE_FILES


def test_up_after_stage_starts_every_rank_without_a_hub_request(setup: Setup, tmp_path: Path) -> None:
    port = _free_port()
    recipe = tmp_path / "up" / "recipe.toml"
    recipe.parent.mkdir()
    # The ranks open the model as SGLang does (tests/hub_loading_engine.py), with HF_ENDPOINT at the
    # stand-in: a request they made would be counted.
    recipe.write_text(
        f'engine = "sglang"\nmodel = "{REPO}"\nrevision = "{COMMIT}"\nport = {port}\nrendezvous_port = {port + 1}\n'
        f'required_nodes = 3\ntensor_parallel_size = 3\nentrypoint = ["{sys.executable}", "{LOADER}"]\n'
        f'[env]\nHF_TOKEN = "{TOKEN}"\nHF_ENDPOINT = "{setup.hub.url}"\n'
        f'[[staging]]\nkind = "sync"\nid = "weights"\nsrc = "{{{{hf}}}}/hub/{FOLDER}"\n'
        f'dst = "{{{{hf}}}}/hub/{FOLDER}"\nsource_node = "node0"\n'
    )
    cluster = str(setup.fleet.cluster_file)
    staged = _cli("stage", str(recipe), "--cluster", cluster)
    assert staged.returncode == 0, staged.stderr
    setup.hub.requests.clear()
    up = _cli("up", str(recipe), "--cluster", cluster, "--name", "hubup")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert setup.hub.requests == [], setup.hub.requests
        logs = _cli("logs", "hubup")
        for i in range(3):
            assert f"hub-loading-engine: loaded {setup.snapshot(i)}" in logs.stdout, logs.stdout
    finally:
        _cli("down", "hubup")
    assert leftover_processes("hubup") == []


def test_with_the_hub_down_a_complete_copy_in_the_cache_is_used_and_said(setup: Setup) -> None:
    recipe = Path(setup.plan.recipe_source)
    recipe = recipe if recipe.is_file() else recipe / "recipe.toml"
    recipe.write_text(recipe.read_text().replace(f'revision = "{COMMIT}"\n', ""))  # `main`: the Hub is asked
    unpinned = plan(load_recipe(recipe.parent), load_cluster(setup.fleet.cluster_file), "hub")
    assert fetched(stage(unpinned, setup.transports)) is not None
    setup.hub.down = True
    again = stage(unpinned, setup.transports)
    assert fetched(again) is not None and fetched(again).bytes_fetched == 0
    assert again.notes == (f"node0: the Hub did not answer (HfHubHTTPError): using the cache's main = {COMMIT}, "
                           "which holds what the engine loads",)  # fmt: skip
    # Nothing in the cache: the outage stops the stage, naming the node.
    shutil.rmtree(setup.fleet.nodes[0].hf_cache / "hub" / FOLDER)
    with pytest.raises(StagingError, match="503") as err:
        stage(unpinned, setup.transports)
    assert err.value.node == "node0"
