"""Distribution on the ``local`` cluster (no SSH): the controller's snapshot into this machine's
cache, with the progress the CLI draws."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from sparkfleet.apply.staging.phase import distribute, rich_progress
from sparkfleet.apply.staging.transfer import SyncReport
from sparkfleet.config.cluster import local_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import PlanError
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan.build import plan
from sparkfleet.plan.staging import StagingStep
from tests.integration.test_distribution_sync import REPO, REV1, assert_hub_layout, make_hf_snapshot, model_files

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync missing")


def test_local_node_sync_with_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    source = make_hf_snapshot(tmp_path / "src" / REPO, REV1, files := model_files(shard_bytes=1 << 20))
    (tmp_path / "recipe.toml").write_text(
        'engine = "vllm"\nmodel = "acme/tiny"\n'
        f'[[staging]]\nkind = "sync"\nid = "weights"\nsrc = "{source}"\n'
        f'dst = "{{{{hf}}}}/hub/{REPO}"\nexclude = ["original/*"]\n'
    )
    p = plan(load_recipe(tmp_path / "recipe.toml"), local_cluster(), "local-test")
    seen: list[tuple[str, int, int]] = []

    def record(step: StagingStep, done: int, total: int) -> None:
        seen.append((step.node, done, total))

    report = distribute(p, {"local": LocalTransport("local")}, progress=record)
    (r,) = report.of(SyncReport)
    assert r.method == "rsync" and r.bytes_sent >= 4 << 20
    assert_hub_layout(tmp_path / "hf" / "hub" / REPO, REV1, files, excluded=("original/consolidated.pth",))
    assert seen and seen[-1][1] == seen[-1][2] == r.bytes_total  # the bar ends full
    assert all(node == "local" for node, _, _ in seen)

    out = io.StringIO()
    with rich_progress(Console(file=out, width=100)) as bar:
        distribute(p, {"local": LocalTransport("local")}, progress=bar)
    assert "weights → local" in out.getvalue()


@pytest.mark.parametrize(
    ("staging", "message"),
    [
        ('kind = "sync"\nsrc = "/x"\ndst = "/y"\nsource_node = "dgx9"',
         "staging 'w': source_node = 'dgx9' is not one of the planned nodes (local)"),
        ('kind = "nfs"\nsrc = "/x"\ndst = "/y"\nserver_node = "nas"',
         "staging 'w': server_node = 'nas' is not one of the planned nodes (local)"),
        ('kind = "sync"\ndst = "/y"', "staging 'w': kind = 'sync' needs src"),
        ('kind = "copy"\ndst = "/y"', "staging 'w': kind = 'copy' needs files = [...]"),
    ],
)  # fmt: skip
def test_bad_distribution_steps_are_refused_by_plan(tmp_path: Path, staging: str, message: str) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'engine = "vllm"\nmodel = "acme/tiny"\n[[staging]]\nid = "w"\n{staging}\n')
    with pytest.raises(PlanError) as err:
        plan(load_recipe(recipe), local_cluster(), "bad")
    assert str(err.value).startswith(f"{recipe}: {message}")
