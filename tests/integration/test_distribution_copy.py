"""``copy`` staging on the loopback fleet: small files pushed to every node, verified by hash."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sparkfleet.apply.staging.copy import CopyReport
from sparkfleet.apply.staging.phase import distribute
from sparkfleet.errors import StagingError
from tests.fleet.loopback import LoopbackFleet
from tests.integration.test_distribution_sync import (
    REPO,
    REV1,
    build,
    fleet_of,
    make_hf_snapshot,
    model_files,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="openssh-server missing"),
]


@pytest.fixture
def fleet4(tmp_path: Path):
    with fleet_of(4, tmp_path) as fleet:
        yield fleet


def tables(tmp_path: Path) -> Path:
    recipe = tmp_path / "recipe"
    recipe.mkdir(exist_ok=True)
    (recipe / "dspark_sps.json").write_text('{"schedule": [1, 2, 3, 5]}')
    (recipe / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return recipe


COPY = '\n[[staging]]\nkind = "copy"\nid = "tables"\nfiles = ["dspark_sps.json", "chat_template.jinja"]\n'
COPY += 'dst = "{{state}}/tables"\n'


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_reach_every_node_and_are_not_resent(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = tables(tmp_path)
    setup = build(fleet4, tmp_path, COPY, nodes=4)
    first = distribute(setup.plan, setup.transports)
    assert sorted(r.node for r in first.of(CopyReport)) == ["node0", "node1", "node2", "node3"]
    for node in fleet4.nodes:
        for name in ("dspark_sps.json", "chat_template.jinja"):
            assert digest(node.state_dir / "tables" / name) == digest(recipe / name)
    again = distribute(setup.plan, setup.transports)
    assert all(r.sent == () and r.bytes_sent == 0 for r in again.of(CopyReport))

    # A node whose table drifted gets it back; the others are left alone.
    (fleet4.nodes[1].state_dir / "tables" / "dspark_sps.json").write_text('{"schedule": [9]}')
    fixed = {r.node: r for r in distribute(setup.plan, setup.transports).of(CopyReport)}
    assert fixed["node1"].sent == ("dspark_sps.json",)
    assert all(fixed[n].sent == () for n in ("node0", "node2", "node3"))
    assert digest(fleet4.nodes[1].state_dir / "tables" / "dspark_sps.json") == digest(recipe / "dspark_sps.json")


def test_a_failed_push_names_node_and_file_and_stops_later_steps(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    tables(tmp_path)
    sync = (
        f'\n[[staging]]\nkind = "sync"\nid = "weights"\nsrc = "{tmp_path / "src" / REPO}"\n'
        f'dst = "{{{{hf}}}}/hub/{REPO}"\n'
    )
    setup = build(fleet4, tmp_path, COPY + sync, nodes=4)
    make_hf_snapshot(setup.source, REV1, model_files(shard_bytes=1 << 16, shards=2))
    (fleet4.nodes[2].state_dir / "tables").write_text("a file where the folder should be")
    with pytest.raises(StagingError) as err:
        distribute(setup.plan, setup.transports)
    message = str(err.value)
    assert message.startswith("node2: staging 'tables': could not write ")
    assert "/tables/" in message and ("dspark_sps.json" in message or "chat_template.jinja" in message)
    # copy comes first in the recipe: its failure aborts before the sync touches any node
    assert not any((n.hf_cache / "hub" / REPO).exists() for n in fleet4.nodes)


def test_a_missing_local_file_is_named(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = tables(tmp_path)
    setup = build(fleet4, tmp_path, COPY, nodes=2)
    (recipe / "chat_template.jinja").unlink()
    with pytest.raises(StagingError, match=r"staging 'tables': cannot read .*chat_template.jinja"):
        distribute(setup.plan, setup.transports)
