"""Staging kinds are a registry (docs/architecture.md, "A staging kind"): every kind loads from a
recipe, plans, shows in ``plan --json`` and survives the state store; a kind is one module in
plan/staging/ and one in apply/staging/, and nothing else names a kind to pick what to do."""

from __future__ import annotations

import ast
import json
import pkgutil
import shutil
from pathlib import Path

import pytest

import sparkfleet
from sparkfleet.apply.staging import RUNNERS
from sparkfleet.apply.staging.phase import distribute
from sparkfleet.config.cluster import local_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import RecipeError, StagingError
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan import staging as plan_staging
from sparkfleet.plan.build import plan
from sparkfleet.plan.render import plan_json
from sparkfleet.plan.staging import BY_KIND, KINDS
from sparkfleet.state.plans import plan_from_json, plan_to_json

SRC = Path(sparkfleet.__file__).parent
ALL_WRITTEN = """engine = "vllm"
model = "org/m"
[[staging]]
kind = "sparse-rows"
id = "rows"
src = "{{hf}}/snap"
dst = "{{state}}/rows"
min_free = "1G"
[[staging]]
kind = "sync"
id = "weights"
src = "{{hf}}/hub/models--org--m"
dst = "{{hf}}/hub/models--org--m"
source_node = "local"
[[staging]]
kind = "copy"
id = "tables"
files = ["a.json"]
dst = "/opt/tables"
[[staging]]
kind = "nfs"
id = "share"
src = "/export/m"
dst = "/models/m"
"""
COMPOSED = """engine = "vllm"
model = "org/m"
[composed_model]
mount = "/model"
sources = [{repo = "org/m"}, {repo = "org/n", revision = "abc"}]
local_files = [{host = "{{home}}/local.safetensors"}]
"""


def _plans(tmp_path: Path) -> list:
    out = []
    for i, text in enumerate((ALL_WRITTEN, COMPOSED)):
        recipe = tmp_path / f"r{i}.toml"
        recipe.write_text(text)
        out.append(plan(load_recipe(recipe), local_cluster(), f"kinds{i}"))
    return out


def test_every_kind_loads_plans_shows_and_round_trips(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(ALL_WRITTEN)
    loaded = load_recipe(recipe)
    assert [type(e) for e in loaded.staging] == [BY_KIND[e.kind] for e in loaded.staging]
    planned = _plans(tmp_path)
    kinds = {s.kind for p in planned for s in p.staging}
    assert kinds == set(BY_KIND), "a kind no recipe here plans: add it to this test"
    for p in planned:
        shown = plan_json(p)["staging"]
        assert [s["kind"] for s in shown] == [s.kind for s in p.staging]
        assert all("{{" not in s["dst"] and "{{" not in (s["src"] or "") for s in shown)
        assert plan_from_json(plan_to_json(p)) == p  # every entry comes back as its own kind
    hub, rows = planned[0].staging[0], planned[0].staging[1]
    assert hub.kind == "hub" and rows.kind == "sparse-rows" and rows.min_free == 1 << 30


def test_every_kind_has_a_runner_and_each_is_one_module_per_layer() -> None:
    plan_modules = {m.name for m in pkgutil.iter_modules(plan_staging.__path__)} - {"base"}
    assert {k.__module__.rsplit(".", 1)[1] for k in KINDS} == plan_modules
    assert set(RUNNERS) == set(KINDS)
    for entry, runner in RUNNERS.items():
        module = entry.__module__.rsplit(".", 1)[1]
        assert runner.stage.__module__ == f"sparkfleet.apply.staging.{module}"
        assert entry.model_fields["kind"].default == module.replace("_", "-")


def _kind_comparisons(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                words = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                hit = [w.value for w in words if isinstance(w, ast.Constant) and w.value in names]
                if hit:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} compares with {hit[0]!r}")
    return found


def test_nothing_outside_the_kind_modules_picks_what_to_do_by_a_kind_name() -> None:
    names = {k.model_fields["kind"].default for k in KINDS}
    kind_modules = {SRC / "plan" / "staging" / f"{n.replace('-', '_')}.py" for n in names}
    kind_modules |= {SRC / "apply" / "staging" / f"{n.replace('-', '_')}.py" for n in names}
    found = [f for path in sorted(SRC.rglob("*.py")) if path not in kind_modules
             for f in _kind_comparisons(path, names)]  # fmt: skip
    assert found == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('kind = "sync"\nid = "w"\nsrc = "/a"\ndst = "/b"\nsourcenode = "x"',
         "staging[0].sourcenode: unknown key (did you mean 'source_node'?)"),
        ('id = "w"\ndst = "/b"', "staging[0].kind: required key is missing"),
        ('kind = "hub"\nid = "w"\ndst = "/b"', "staging[0].kind: 'hub' is not one of"),  # planned, never written
        ('kind = "nfs"\nid = "w"\nsrc = "/a"\ndst = "/b"\nmin_free = "1Q"', "staging[0].min_free: '1Q' is not a size"),
        ('kind = "copy"\nid = "w"\ndst = "b"', "staging[0].dst: 'b' must be an absolute path"),
    ],
)  # fmt: skip
def test_an_entry_error_names_the_key_as_written(tmp_path: Path, entry: str, message: str) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'engine = "vllm"\nmodel = "org/m"\n[[staging]]\n{entry}\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert message in str(err.value)


def _flat(step: dict) -> dict:
    """A step as sparkfleet stored it before the kinds were a registry."""
    entry = step["entry"]
    spec = {k: v for k, v in entry.items() if k not in ("kind", "id", "src", "dst", "min_free")}
    common = {k: entry[k] for k in ("id", "kind", "src", "dst", "min_free")}
    if entry["kind"] == "composed":
        return {**common, "rank": step["rank"], "node": step["node"], "tp": step["tp"], "spec": None, **spec}
    return {**common, "rank": step["rank"], "node": step["node"], "tp": step["tp"], "spec": spec, "hf_cache": "/x"}


def test_a_plan_stored_before_the_registry_still_loads(tmp_path: Path) -> None:
    for p in _plans(tmp_path):
        data = json.loads(plan_to_json(p))
        data["staging"] = [_flat(s) for s in data["staging"]]
        data["fetch"] = None
        assert plan_from_json(json.dumps(data)) == p


def test_the_nfs_runner_exports_the_servers_folder_and_says_what_is_missing(tmp_path: Path) -> None:
    # The whole NFS path needs a kernel NFS server (tests/integration/test_distribution_nfs.py);
    # here the runner picks the server node and its folder, and stops at the first thing lacking.
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'engine = "vllm"\nmodel = "org/m"\n[[staging]]\nkind = "nfs"\nid = "share"\n'
                      f'src = "{tmp_path}/export"\ndst = "/models/m"\n')  # fmt: skip
    p = plan(load_recipe(recipe), local_cluster(), "nfs-kinds")
    with pytest.raises(StagingError, match=f"cannot export {tmp_path}/export: no such folder on the NFS server"):
        distribute(p, {"local": LocalTransport("local")})
    (tmp_path / "export").mkdir()
    if shutil.which("exportfs") is None and not Path("/usr/sbin/exportfs").exists():
        with pytest.raises(StagingError, match="exportfs not found"):
            distribute(p, {"local": LocalTransport("local")})
