"""One resolver for the Hugging Face and engine caches: the set-up, the local cluster and the
tests' skip checks all find the model where scripts/prepare-model.py put it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.config import caches
from sparkfleet.config.cluster import local_cluster
from sparkfleet.errors import ClusterError
from tests.conftest import ROOT

HOME = {"HOME": "/home/u"}


@pytest.mark.parametrize(
    ("env", "hub"),
    [
        ({}, "/home/u/.cache/huggingface/hub"),
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/huggingface/hub"),
        ({"HF_HOME": "/hf"}, "/hf/hub"),
        ({"HF_HOME": "/hf", "XDG_CACHE_HOME": "/xdg"}, "/hf/hub"),  # HF_HOME wins over XDG
        ({"HF_HUB_CACHE": "/models/hub"}, "/models/hub"),
        ({"HF_HUB_CACHE": "/models/hub", "HF_HOME": "/hf", "XDG_CACHE_HOME": "/xdg"}, "/models/hub"),
        ({"HUGGINGFACE_HUB_CACHE": "/legacy/hub", "HF_HOME": "/hf"}, "/legacy/hub"),
        ({"HF_HUB_CACHE": "/new/hub", "HUGGINGFACE_HUB_CACHE": "/legacy/hub"}, "/new/hub"),
        ({"HF_HOME": "~/hf"}, "/home/u/hf/hub"),
        ({"HF_HUB_CACHE": "", "HF_HOME": "", "XDG_CACHE_HOME": ""}, "/home/u/.cache/huggingface/hub"),  # empty = unset
    ],
)
def test_hub_cache_follows_huggingface_hub(env: dict[str, str], hub: str) -> None:
    env = {**HOME, **env}
    assert caches.hub_cache(env) == Path(hub)
    assert caches.local_hf_cache(env) == Path(hub).parent
    assert caches.repo_dir("org/name", env) == Path(hub) / "models--org--name"


def test_a_hub_cache_not_named_hub_cannot_be_a_node_cache() -> None:
    env = {**HOME, "HF_HUB_CACHE": "/data/models"}
    assert caches.hub_cache(env) == Path("/data/models")
    with pytest.raises(ValueError, match=r"^HF_HUB_CACHE=/data/models: .*named 'hub'"):
        caches.local_hf_cache(env)


def test_engine_cache() -> None:
    assert caches.engine_cache(HOME) == Path("/home/u/.cache/sparkfleet")
    assert caches.engine_cache({**HOME, "SPARKFLEET_CACHE": "/c"}) == Path("/c")
    assert caches.engine_cache({**HOME, "SPARKFLEET_CACHE": ""}) == Path("/home/u/.cache/sparkfleet")


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert caches.hub_cache() == tmp_path / "hub"


@pytest.mark.parametrize("var", ["HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"])
def test_local_cluster_reads_where_the_setup_writes(var: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    value = {"HF_HUB_CACHE": tmp_path / "hub", "HF_HOME": tmp_path, "XDG_CACHE_HOME": tmp_path.parent}[var]
    monkeypatch.setenv(var, str(value))
    node = local_cluster().nodes[0]
    assert Path(node.hf_cache) / "hub" == caches.hub_cache()


def test_local_cluster_refuses_an_unreachable_hub_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "models"))
    with pytest.raises(ClusterError, match=r"^local cluster: HF_HUB_CACHE="):
        local_cluster()


@pytest.mark.parametrize(
    "env",
    [
        {"HF_HUB_CACHE": "{tmp}/hub"},
        {"HF_HOME": "{tmp}/hf"},
        {"XDG_CACHE_HOME": "{tmp}/xdg"},
        {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy/hub", "HF_HOME": "{tmp}/hf"},
        {"HF_HOME": "~/hf-home"},
    ],
)
def test_prepare_model_places_the_model_where_the_tests_look(env: dict[str, str], tmp_path: Path) -> None:
    """scripts/prepare-model.py runs in an engine venv without sparkfleet installed (-S: no
    site-packages here either); it loads this resolver from src/ and writes where it says."""
    names = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
    full = {k: v for k, v in os.environ.items() if k not in names}
    full.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()})
    script = ROOT / "scripts" / "prepare-model.py"
    code = (
        "import importlib.util, sys; sys.argv = ['prepare-model.py'];"
        f"spec = importlib.util.spec_from_file_location('pm', {str(script)!r});"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "print(m.repo_dir(m.GGUF_REPO)); print(m.repo_dir(m.HF_REPO))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], env=full, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    want = [caches.repo_dir("sparkfleet/gemma3-270m-gguf", full), caches.repo_dir("sparkfleet/gemma3-270m", full)]
    assert [Path(line) for line in done.stdout.split()] == want
