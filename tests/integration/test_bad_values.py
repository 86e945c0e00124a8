"""Cluster and recipe values that would reach ssh's argv, a path or an env file: refused when
the file is read, one line, exit 2 — with real ssh (OpenSSH before 9.6 runs a ProxyCommand given
as the destination) and a real state store holding a record an older version wrote."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe
from tests.integration.test_instances import _free_port

pytestmark = pytest.mark.integration


def _cluster(path: Path, host: str, user: str = "root") -> Path:
    path.write_text(f'name = "bad"\n[defaults]\nuser = {json.dumps(user)}\n[[nodes]]\nname = "n0"\n'
                    f"host = {json.dumps(host)}\n")  # fmt: skip
    return path


@pytest.mark.parametrize("host", ["-oProxyCommand=touch {mark}", "node 1", "-oProxyCommand=true"])
def test_a_host_that_ssh_would_read_as_an_option_or_two_words_is_refused(host: str, tmp_path: Path) -> None:
    mark = tmp_path / "proxycommand-ran"
    cluster = _cluster(tmp_path / "cluster.toml", host.format(mark=mark))
    recipe = standin_recipe(tmp_path / "r", nodes=1, port=_free_port())
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    for command in (["validate", str(recipe), "--cluster", str(cluster)], ["doctor", "--cluster", str(cluster)],
                    ["up", str(recipe), "--cluster", str(cluster), "--timeout", "20"]):  # fmt: skip
        out = sparkfleet(*command, env=env, timeout=120)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert str(cluster) in out.stderr and "nodes[0].host" in out.stderr and "not a host name" in out.stderr
        assert not mark.exists(), command  # ssh never saw it


def test_a_user_starting_with_a_dash_is_refused(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "cluster.toml", "127.0.0.1", user="-oProxyCommand=true")
    out = sparkfleet("doctor", "--cluster", str(cluster), env={"SPARKFLEET_STATE_DIR": str(tmp_path / "s")})
    assert out.returncode == 2 and "defaults.user" in out.stderr and "not a user name" in out.stderr


def test_status_and_down_survive_a_record_an_older_version_wrote(tmp_path: Path) -> None:
    """A host with a space in a record (an older sparkfleet let it through): status still shows
    every deployment, down frees the name with one line."""
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    good = standin_recipe(tmp_path / "good", nodes=1, port=_free_port())
    bad = standin_recipe(tmp_path / "old", nodes=1, port=_free_port())
    assert sparkfleet("up", str(bad), env=env).returncode == 0
    assert sparkfleet("down", "old", env=env).returncode == 0
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    with db:
        (ranks,) = db.execute("SELECT ranks_json FROM deployments WHERE name = 'old'").fetchone()
        broken = json.loads(ranks)
        broken[0]["node"]["host"] = "node 1"
        db.execute("UPDATE deployments SET ranks_json = ?, status = 'ready' WHERE name = 'old'", (json.dumps(broken),))
    db.close()
    assert sparkfleet("up", str(good), env=env).returncode == 0
    try:
        status = sparkfleet("status", env=env)
        assert status.returncode == 0, status.stderr
        assert "good" in status.stdout and "old" in status.stdout and "unreadable" in status.stdout
        assert "internal error" not in status.stderr
        listed = json.loads(sparkfleet("status", "--json", env=env).stdout)
        assert {d["name"] for d in listed} == {"good", "old"}
        down = sparkfleet("down", "old", env=env)
        assert down.returncode == 2 and len(down.stderr.strip().splitlines()) == 1, down.stderr
        assert "cannot be read" in down.stderr
        again = sparkfleet("up", str(bad), env=env)  # the name is free again
        assert again.returncode == 0, again.stderr
        assert sparkfleet("down", "old", env=env).returncode == 0
    finally:
        sparkfleet("down", "good", env=env)
        sparkfleet("down", "old", "--sweep", env=env)
    assert leftover_processes("good") == [] and leftover_processes("old") == []
