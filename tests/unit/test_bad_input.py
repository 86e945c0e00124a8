"""Every bad recipe or cluster gets exit code 2 and one line naming the file and key — never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_run import run_main
from tests.conftest import ROOT, SEEDS, SPARK4

BAD = sorted((ROOT / "tests" / "data" / "bad_recipes").glob("*.toml"))


def _expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_recipe_is_one_clear_line(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "validate", str(path))
    assert code == 2
    line = " ".join(err.split())  # rich may wrap a long line at the terminal width
    assert line.startswith(f"error: {path}")
    assert _expected(path) in line
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("path", BAD[:4], ids=[p.stem for p in BAD[:4]])
def test_plan_refuses_bad_recipes_too(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "plan", str(path), "--json")
    assert code == 2 and _expected(path) in " ".join(err.split())


def test_missing_recipe_and_folder_without_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "validate", str(tmp_path / "nope"))
    assert code == 2 and "no such recipe file or folder" in err
    code, _, err = run_main(capsys, "validate", str(tmp_path))
    assert code == 2 and "no recipe.toml in this folder" in err


def test_too_few_nodes_is_refused_at_plan_time(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "plan", str(SEEDS / "dsv41-flash-4x-mia"))
    text = " ".join(err.split())
    assert code == 2 and "required_nodes = 4" in text and "has 1 node(s)" in text


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ('name = "x"\n[[nodes]]\nname = "a"\nhost = "h"\nfabirc_ip = "1.2.3.4"\n',
         "nodes[0].fabirc_ip: unknown key (did you mean 'fabric_ip'?)"),
        ('name = "x"\n[defaults]\nmemlock = "lots"\n[[nodes]]\nname = "a"\nhost = "h"\n',
         "defaults.memlock: 'lots' is not 'unlimited', 'none' or a size like 64M"),
        ('name = "x"\n[[nodes]]\nname = "a"\nhost = "h"\n[[nodes]]\nname = "a"\nhost = "g"\n',
         "node name 'a' appears twice"),
        ('name = "x"\n', "nodes: required key is missing"),
        ('name = "x"\n[[nodes]]\nname = "a"\nhost = "h"\nssh_port = 0\n',
         "nodes[0].ssh_port: Input should be greater than or equal to 1"),
    ],
)  # fmt: skip
def test_bad_cluster_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, expect: str
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(body)
    code, _, err = run_main(capsys, "plan", str(SEEDS / "dsv41-flash-4x-mia"), "--cluster", str(cluster))
    text = " ".join(err.split())
    assert code == 2 and text.startswith(f"error: {cluster}") and expect in text


def test_bad_set_and_env_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    seed = str(SEEDS / "dsv41-flash-4x-mia")
    code, _, err = run_main(capsys, "plan", seed, "-c", str(SPARK4), "--set", "port=99999")
    assert code == 2 and "port: Input should be less than or equal to 65535" in " ".join(err.split())
    code, _, err = run_main(capsys, "plan", seed, "-c", str(SPARK4), "--env", "9X=1")
    assert code == 2 and "--env '9X=1'" in err


def test_set_override_changes_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "plan", str(SEEDS / "dsv41-flash-4x-mia"), "-c", str(SPARK4), "--json",
                        "--set", "port=31000", "--env", "EXTRA=1")  # fmt: skip
    assert code == 0
    assert '"--port",\n        "31000"' in out and '"EXTRA": "1"' in out


def test_console_script_exit_code_and_no_traceback(tmp_path: Path) -> None:
    bad = ROOT / "tests" / "data" / "bad_recipes" / "unknown_key.toml"
    proc = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", "validate", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "did you mean 'tensor_parallel_size'" in proc.stderr and "Traceback" not in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "validate", str(SEEDS / "dsv41-flash-4x-mia")],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr


SECRET = "hf_dontprintme123"


@pytest.mark.parametrize(
    "env",
    [
        f'HF_TOKEN = ["{SECRET}"]',
        f'MY_API_KEY = {{ value = "{SECRET}" }}',
        f'HF_TOKEN = ["{SECRET}", 1]',
    ],
    ids=["list", "table", "mixed"],
)
def test_wrongly_typed_secret_is_named_not_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env: str
) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'engine = "vllm"\nmodel = "org/m"\n[env]\n{env}\n')
    code, _, err = run_main(capsys, "validate", str(recipe))
    text = " ".join(err.split())
    assert code == 2 and SECRET not in err
    assert "env.HF_TOKEN" in text or "env.MY_API_KEY" in text


@pytest.mark.parametrize(
    "body",
    [f'env = "HF_TOKEN={SECRET}"', f'env = ["HF_TOKEN={SECRET}"]', f'env = [{{ HF_TOKEN = "{SECRET}" }}]'],
    ids=["string", "list-of-assignments", "list-of-tables"],
)
def test_env_of_the_wrong_shape_hides_the_secrets_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'engine = "vllm"\nmodel = "org/m"\n{body}\n')
    code, _, err = run_main(capsys, "validate", str(recipe))
    assert code == 2 and "env" in err and SECRET not in err and "***" in err


def test_cluster_secret_and_overrides_are_not_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'name = "x"\n[[nodes]]\nname = "a"\nhost = "h"\n[nodes.env]\nHF_TOKEN = ["{SECRET}"]\n')
    seed = str(SEEDS / "dsv41-flash-4x-mia")
    code, _, err = run_main(capsys, "plan", seed, "--cluster", str(cluster))
    assert code == 2 and "nodes[0].env.HF_TOKEN: input should be a valid string" in " ".join(err.split())
    assert SECRET not in err
    code, _, err = run_main(capsys, "plan", seed, "-c", str(SPARK4), "--set", f'env.HF_TOKEN=["{SECRET}"]')
    assert code == 2 and "env.HF_TOKEN" in err and SECRET not in err
    code, _, err = run_main(capsys, "plan", seed, "-c", str(SPARK4), "--env", f"9X_TOKEN={SECRET}")
    assert code == 2 and "9X_TOKEN" in err and SECRET not in err


def test_other_wrongly_typed_values_are_still_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('engine = "vllm"\nmodel = "org/m"\n[env]\nNCCL_DEBUG = ["INFO"]\n')
    code, _, err = run_main(capsys, "validate", str(recipe))
    assert code == 2 and "env.NCCL_DEBUG: input should be a valid string (got ['INFO'])" in " ".join(err.split())


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ('[[staging]]\nkind = "sync"\nid = "w"\ndst = "/y"\n', "staging 'w': kind = 'sync' needs src"),
        ('[[staging]]\nkind = "copy"\nid = "w"\ndst = "/y"\n', "staging 'w': kind = 'copy' needs files = [...]"),
        ("required_nodes = 3\ntensor_parallel_size = 1\npipeline_parallel_size = 2\n",
         "tensor_parallel_size × pipeline_parallel_size = 2 is smaller than required_nodes = 3"),
    ],
    ids=["sync-without-src", "copy-without-files", "tp-pp-short-of-nodes"],
)  # fmt: skip
def test_validate_refuses_what_plan_refuses_without_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, expect: str
) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'engine = "sglang"\nmodel = "org/m"\n{body}')
    for argv in (("validate", str(recipe)), ("plan", str(recipe), "-c", str(SPARK4))):
        code, out, err = run_main(capsys, *argv)
        assert code == 2 and out == "" and expect in " ".join(err.split()), argv


def test_placeholders_in_recipe_and_cluster_are_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('engine = "vllm"\nmodel = "org/m"\ndocker_image = "<SET ME: IMAGE>"\n')
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        'name = "x"\n[[nodes]]\nname = "head"\nhost = "localhost"\nfabric_ip = "<SET ME: HEAD_IP>"\n'
        '[[nodes]]\nname = "b"\nhost = "b"\nfabric_ip = "10.0.0.2"\n[nodes.env]\nNCCL_IB_HCA = "<SET ME: HCA>"\n'
    )
    code, _, err = run_main(capsys, "plan", str(recipe), "--cluster", str(cluster))
    text = " ".join(err.split())
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert text == (
        f"error: {recipe}: fill in the <SET ME: …> placeholders that sparkfleet import left: docker_image; "
        f"{cluster}: nodes[0].fabric_ip, nodes[1].env.NCCL_IB_HCA"
    )
    # The cluster alone, once the recipe is filled in.
    recipe.write_text('engine = "vllm"\nmodel = "org/m"\n')
    code, _, err = run_main(capsys, "plan", str(recipe), "--cluster", str(cluster))
    assert code == 2 and " ".join(err.split()).startswith(f"error: {cluster}: fill in the <SET ME: …> placeholders")
    code, _, err = run_main(capsys, "validate", str(recipe))
    assert code == 0, err


def _recipe(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text('engine = "vllm"\nmodel = "org/m"\n' + extra)
    return path


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        ('[env]\nX = "a\\nb"\n', "env: X: an env value cannot hold a newline"),
        ("required_nodes = 1000000000000\n", "required_nodes"),
        ("tensor_parallel_size = 99999999999\n", "tensor_parallel_size"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
        ("x = " + "[" * 40 + "1" + "]" * 40 + "\n", "nested more than 32"),
        ('args = ["' + "a" * 40000 + '"]\n', "characters"),
    ],
    ids=["env-newline", "huge-nodes", "huge-tp", "5000-deep", "40-deep", "huge-arg"],
)
def test_values_out_of_bounds_are_one_line(tmp_path: Path, extra: str, expect: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, _, err = run_main(capsys, "validate", str(_recipe(tmp_path, extra)))
    line = " ".join(err.split())
    assert code == 2 and expect in line, err
    assert len(err.strip().splitlines()) <= 2 and "internal error" not in err  # rich may wrap one line


@pytest.mark.parametrize("name", ["../evil", "a/b", "UPPER", "-dash", "x" * 64, "dot..dot"])
def test_deployment_names_that_are_not_plain_are_refused(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "plan", str(ROOT / "examples" / "gemma-llamacpp"), "--name", name, "--json")
    assert code == 2 and "deployment name" in err and "internal error" not in err


def test_a_recipe_folder_name_becomes_a_plain_deployment_name(tmp_path: Path) -> None:
    from sparkfleet.config.recipe import deployment_name

    folder = tmp_path / "My Recipe_v2"
    folder.mkdir()
    assert deployment_name(folder) == "my-recipe_v2"


def test_env_newline_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "plan", str(ROOT / "examples" / "gemma-llamacpp"), "--env", "X=a\nb")
    assert code == 2 and "cannot hold a newline" in err


def test_one_node_on_localhost_without_fabric_ip(tmp_path: Path) -> None:
    """The most natural cluster file: its fabric address is an address, and doctor's interface
    check takes a host name without crashing."""
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.doctor.probes.netif import Interface

    path = tmp_path / "one.toml"
    path.write_text('name = "one"\n[[nodes]]\nname = "n0"\nhost = "localhost"\n')
    node = load_cluster(path).nodes[0]
    assert node.fabric_ip == "127.0.0.1"
    lo = Interface("lo", 65536, "unknown", ("127.0.0.1",), (8,), loopback=True)
    assert lo.holds(node.fabric_ip) and not lo.holds("localhost")
