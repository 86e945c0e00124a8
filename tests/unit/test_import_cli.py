"""The `import` commands: files written, lists printed, bad input one red line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkfleet.config.recipe import load_recipe
from tests.conftest import ROOT

PROFILE = ROOT / "tests" / "data" / "import" / "env.tp4.example"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True)


def test_import_mia_env_writes_recipe_and_cluster_and_lists_keys(tmp_path: Path) -> None:
    out = tmp_path / "line" / "recipe.toml"
    done = _run("import", "mia-env", str(PROFILE), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert load_recipe(out).tensor_parallel_size == 4
    assert (tmp_path / "line" / "cluster.toml").is_file()
    assert "placeholders to fill in" in done.stderr and "NFS_SHARE" in done.stderr
    again = _run("import", "mia-env", str(PROFILE), "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_import_to_stdout_is_a_clean_recipe(tmp_path: Path) -> None:
    done = _run("import", "sparkrun", str(ROOT / "tests/data/import/sparkrun/qwen3-sglang-2x.yaml"))
    assert done.returncode == 0
    (tmp_path / "r.toml").write_text(done.stdout)
    assert load_recipe(tmp_path / "r.toml").engine == "sglang"


def test_missing_file_is_one_red_line(tmp_path: Path) -> None:
    done = _run("import", "mia-env", str(tmp_path / "nope"))
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr
