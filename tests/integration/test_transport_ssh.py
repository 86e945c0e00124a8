"""The SSH transport against real sshd nodes: words arrive unchanged (no shell injection), one
handshake per node however many commands run, files move byte for byte, dead nodes are named."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.errors import CommandError, TransportError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport import transport_for
from tests.fleet.loopback import LoopbackFleet

pytestmark = pytest.mark.integration

NASTY = ["$(touch /tmp/sparkfleet-pwned)", "`id`", "a b\tc", "'single'", '"double"', "semi;colon", "back\\slash",
         "*", "~", "new\nline", "ünïcødé", ""]  # fmt: skip


def test_every_word_reaches_the_node_unchanged(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[1]
    out = transport_for(node).run(["python3", "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *NASTY])
    assert json.loads(out.stdout) == NASTY
    assert not Path("/tmp/sparkfleet-pwned").exists()


def test_one_handshake_per_node_for_many_commands(fleet4: LoopbackFleet) -> None:
    cluster = load_cluster(fleet4.cluster_file)
    transports = {n.name: transport_for(n) for n in cluster.nodes}
    for _ in range(5):
        outcomes = fan_out(transports, lambda name: transports[name].run(["hostname"]).stdout)
        assert all(o.ok for o in outcomes.values())
    for node in fleet4.nodes:
        accepted = [line for line in node.log_file.read_text().splitlines() if "Accepted publickey" in line]
        assert len(accepted) == 1, f"{node.name}: {len(accepted)} handshakes"


def test_put_and_get_are_exact_and_private(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[2]
    transport = transport_for(node)
    payload = os.urandom(300_000) + b"\x00\xff end"
    remote = str(tmp_path / "remote" / "dir" / "blob.bin")
    transport.put_bytes(payload, remote, mode=0o600)
    assert Path(remote).read_bytes() == payload
    assert stat.S_IMODE(os.stat(remote).st_mode) == 0o600
    back = tmp_path / "back.bin"
    transport.get(remote, back)
    assert back.read_bytes() == payload
    assert not list(Path(remote).parent.glob("*.partial*"))


def test_failing_command_carries_its_output_and_dead_node_is_named(fleet4: LoopbackFleet) -> None:
    nodes = load_cluster(fleet4.cluster_file).nodes
    with pytest.raises(CommandError) as failed:
        transport_for(nodes[0]).run(["sh", "-c", "echo oops >&2; exit 3"])
    assert "exited 3" in str(failed.value) and "oops" in str(failed.value) and failed.value.node == "node0"
    fleet4.stop_node(3)
    with pytest.raises(TransportError) as dead:
        transport_for(nodes[3]).run(["true"])
    assert str(dead.value).startswith(f"node3: cannot reach root@{fleet4.nodes[3].host}:22 over SSH")


def test_unknown_host_key_is_refused_unless_asked(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    text = fleet4.cluster_file.read_text().replace(f'ssh_config = "{fleet4.ssh_config}"\n', "")
    bare = tmp_path / "bare.toml"
    bare.write_text(text)
    node = load_cluster(bare).nodes[0]
    home_known = Path.home() / ".ssh" / "known_hosts"
    before = home_known.read_bytes() if home_known.exists() else None
    try:
        with pytest.raises(TransportError) as refused:
            transport_for(node).run(["true"])
        assert "Host key verification failed" in str(refused.value)
        assert transport_for(node, accept_new_host_keys=True).run(["true"]).ok
    finally:
        if before is None:
            home_known.unlink(missing_ok=True)
        else:
            home_known.write_bytes(before)


def test_a_stream_keeps_argv_feeds_stdin_and_keeps_stderr_apart(fleet4: LoopbackFleet) -> None:
    transport = transport_for(load_cluster(fleet4.cluster_file).nodes[3])
    transport.run(["true"])  # the master is up
    script = "import json,sys; print(json.dumps([sys.argv[1:], sys.stdin.read()])); print('to stderr', file=sys.stderr)"
    argv = ["python3", "-c", script + "; sys.exit(7)", *NASTY]
    with transport.stream(argv, stdin=True, merge_stderr=False) as stream:
        stream.write("fed ünï\n".encode())
        stream.close_stdin()
        assert json.loads(stream.read()) == [NASTY, "fed ünï\n"]
        assert stream.wait(30) == 7
        assert stream.errors() == "to stderr\n"
    with transport.stream(["sh", "-c", "echo out; echo err >&2; kill -9 $$"]) as killed:
        assert list(killed) == ["out", "err"]
        assert killed.wait(30) == 255  # no exit status, as the ssh client reports it


def test_a_stale_master_socket_falls_back_to_the_ssh_client(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[2]
    transport = transport_for(node)
    transport.run(["true"])
    master = transport.control_path()  # type: ignore[attr-defined]
    os.unlink(master)  # the master lives on, unreachable: as after a crash that left the path
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(master)  # a socket file that nobody listens on
    with transport.stream(["echo", "still here"]) as stream:
        assert list(stream) == ["still here"]
        assert stream.wait(30) == 0
    assert transport.run(["echo", "and again"]).stdout == "and again\n"
