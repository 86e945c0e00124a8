"""image build|push against real dockerds: node0 is this machine's daemon, node1 (over its
own sshd) a second, private daemon that starts with no images at all."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkfleet.apply.images import build, distribute, image_id, verify_same_id
from sparkfleet.config.cluster import load_cluster
from sparkfleet.errors import NodeError
from sparkfleet.nodes.transport import transport_for
from sparkfleet.nodes.transport.base import Transport
from tests.fleet import loopback_fleet
from tests.fleet.loopback import LoopbackFleet
from tests.integration.second_dockerd import available, second_dockerd

BASE = "sparkfleet-test:latest"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="openssh-server missing"),
    pytest.mark.skipif(not available(), reason="needs root and a running dockerd"),
]


@pytest.fixture
def fleet2(tmp_path: Path) -> Iterator[tuple[LoopbackFleet, str]]:
    with second_dockerd() as docker_host, loopback_fleet(2, tmp_path / "fleet") as fleet:
        fleet.stop_node(1)
        cfg = fleet.nodes[1].sshd_config
        setenv = "SetEnv SPARKFLEET_NODE=node1"
        cfg.write_text(cfg.read_text().replace(setenv, f"{setenv} DOCKER_HOST={docker_host}"))
        fleet.start_node(1)
        yield fleet, docker_host


@pytest.fixture
def tag() -> Iterator[str]:
    ref = f"sparkfleet-imgtest:{uuid.uuid4().hex[:8]}"
    yield ref
    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)


def _transports(fleet: LoopbackFleet) -> dict[str, Transport]:
    return {n.name: transport_for(n) for n in load_cluster(fleet.cluster_file).nodes}


def _recipe(tmp: Path, ref: str, marker: str) -> Path:
    ctx = tmp / "docker-images" / "imgtest"
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "Dockerfile").write_text(f"FROM {BASE}\nCOPY marker /etc/marker\n")
    (ctx / "marker").write_text(marker)
    recipe = tmp / "recipes" / "imgtest"
    recipe.mkdir(parents=True, exist_ok=True)
    (recipe / "recipe.toml").write_text(
        f'engine = "vllm"\nmodel = "org/tiny"\ndocker_image = "{ref}"\ndocker_image_dir = "imgtest"\n'
        "required_nodes = 2\ntensor_parallel_size = 2\n"
    )
    return recipe


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sparkfleet.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_build_once_streams_to_the_other_daemon_and_skips_it_next_time(
    fleet2: tuple[LoopbackFleet, str], tag: str, tmp_path: Path
) -> None:
    fleet, _ = fleet2
    recipe = _recipe(tmp_path, tag, "one")
    ts = _transports(fleet)
    assert image_id(ts["node1"], BASE) is None  # the second daemon starts empty

    first = _cli("image", "build", str(recipe), "--cluster", str(fleet.cluster_file))
    assert first.returncode == 0, first.stdout + first.stderr
    lines = {
        line.split()[1]: line.split()[0] for line in first.stdout.splitlines() if line.startswith(("built", "loaded"))
    }
    assert lines == {"node0": "built", "node1": "loaded"}
    ids = verify_same_id(ts, tag)
    assert ids["node0"] == ids["node1"]
    marker = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", tag, "cat", "/etc/marker"],
        capture_output=True,
        text=True,
    )
    assert marker.stdout == "one"

    again = _cli("image", "build", str(recipe), "--cluster", str(fleet.cluster_file))
    assert again.returncode == 0 and "skipped  node1" in again.stdout, again.stdout
    push = _cli("image", "push", str(recipe), "--cluster", str(fleet.cluster_file))
    assert push.returncode == 0 and push.stdout.count("skipped") == 2, push.stdout

    _recipe(tmp_path, tag, "two")  # the context changed: a new ID, streamed again
    changed = build(tag, tmp_path / "docker-images" / "imgtest", ts, "node0")
    assert [(a.node, a.action) for a in changed] == [("node0", "built"), ("node1", "loaded")]
    assert changed[0].image_id != ids["node0"] and changed[1].image_id == changed[0].image_id


def test_differing_ids_are_refused_and_push_repairs_them(
    fleet2: tuple[LoopbackFleet, str], tag: str, tmp_path: Path
) -> None:
    fleet, _ = fleet2
    ts = _transports(fleet)
    base = distribute(BASE, "node0", ts)
    assert [(a.node, a.action) for a in base] == [("node0", "skipped"), ("node1", "loaded")]
    _recipe(tmp_path, tag, "each")
    each = build(tag, tmp_path / "docker-images" / "imgtest", ts, "node0", on_each_node=True)
    assert [a.action for a in each] == ["built", "built"]
    if each[0].image_id == each[1].image_id:
        pytest.skip("this docker built byte-identical images on both daemons")
    with pytest.raises(NodeError, match=r"differs across nodes .*node1"):
        verify_same_id(ts, tag)
    recipe = tmp_path / "recipes" / "imgtest"
    refused = _cli("up", str(recipe), "--cluster", str(fleet.cluster_file), "--timeout", "30")
    assert refused.returncode == 2 and "differs across nodes" in refused.stderr and "node1" in refused.stderr
    assert set(verify_same_id(ts, tag, allow_mismatch=True)) == {"node0", "node1"}
    fixed = distribute(tag, "node0", ts)
    assert [(a.node, a.action) for a in fixed] == [("node0", "skipped"), ("node1", "loaded")]
    assert len(set(verify_same_id(ts, tag).values())) == 1


def test_failures_name_the_node_and_pins_are_never_built(
    fleet2: tuple[LoopbackFleet, str], tag: str, tmp_path: Path
) -> None:
    fleet, _ = fleet2
    ts = _transports(fleet)
    _recipe(tmp_path, tag, "x")
    each = build(tag, tmp_path / "docker-images" / "imgtest", ts, "node0", on_each_node=True)
    failed = {a.node: a.detail for a in each if not a.ok}
    assert list(failed) == ["node1"] and BASE.split(":")[0] in failed["node1"]  # FROM image not on node1

    pinned = _recipe(tmp_path / "p", "sparkfleet-test@sha256:" + "0" * 64, "x")
    refused = _cli("image", "build", str(pinned), "--cluster", str(fleet.cluster_file))
    assert refused.returncode == 2 and "pinned to a registry digest" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
