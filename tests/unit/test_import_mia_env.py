"""`import mia-env`: the seed profile's production line imports to the seed recipe's line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.placeholders import PATTERN
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import PlanError
from sparkfleet.importers.mia_env import import_mia_env
from sparkfleet.importers.report import has_placeholders
from sparkfleet.importers.shell_profile import parse_profile
from sparkfleet.plan.build import plan
from tests.conftest import ROOT, SEEDS, SPARK4

PROFILE = ROOT / "tests" / "data" / "import" / "env.tp4.example"
SHARED_PROFILE = ROOT.parent / "shared" / "seeds" / "recipes" / "docker-images" / "mia-tp4" / ".env.tp4.example"
SEED = SEEDS / "dsv41-flash-4x-mia"
FILLED_REVISION = "0123456789abcdef0123456789abcdef01234567"


def filled(text: str) -> str:
    """An imported file with every placeholder given a value, as its user does before planning."""
    return PATTERN.sub(FILLED_REVISION, text)


def production_text() -> str:
    """The seed profile with docs/tp4.md "How to run" applied: canary-roce image, the last
    EXTRA_CONTAINER_ENV line uncommented, EP_SIZE=1."""
    text = PROFILE.read_text()
    edits = [
        ("#IMAGE=dsv41-4x-spark:canary-roce\n", "IMAGE=dsv41-4x-spark:canary-roce\n"),
        ("#BUILD_DOCKERFILE=Dockerfile.canary-roce\n", "BUILD_DOCKERFILE=Dockerfile.canary-roce\n"),
        ("\nEP_SIZE=2\n", "\nEP_SIZE=1\n"),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    last = text.rindex("\n#EXTRA_CONTAINER_ENV=")
    return text[: last + 1] + text[last + 2 :]


def _flags(argv: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    current = ""
    for word in argv[3:]:  # after python3 -m sglang.launch_server
        if word.startswith("--"):
            current = word
            assert current not in out, f"{current} twice"
            out[current] = ()
        else:
            out[current] += (word,)
    return out


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    profile = parse_profile(production_text(), "env.tp4")
    result = import_mia_env(profile)
    folder = tmp_path_factory.mktemp("imported")
    (folder / "recipe.toml").write_text(result.recipe_toml)
    assert result.cluster_toml is not None
    (folder / "cluster.toml").write_text(result.cluster_toml)
    return folder / "recipe.toml", folder / "cluster.toml", result


@pytest.fixture(scope="module")
def imported_variants(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    """The seed profile exactly as shipped: its switched-off blocks become variants."""
    result = import_mia_env(parse_profile(PROFILE.read_text(), "env.tp4"))
    folder = tmp_path_factory.mktemp("imported-variants")
    (folder / "recipe.toml").write_text(result.recipe_toml)
    assert result.cluster_toml is not None
    (folder / "cluster.toml").write_text(result.cluster_toml)
    return folder / "recipe.toml", folder / "cluster.toml", result


# The seed recipe's line, two ways: the profile hand-edited as docs/tp4.md says, or the profile as
# shipped with its production block chosen as a variant.
LINES = {"edited": ("imported", "base"), "variant": ("imported_variants", "production")}


@pytest.mark.skipif(not SHARED_PROFILE.is_file(), reason="../shared/seeds not beside this checkout")
def test_test_copy_is_the_seed_profile_unchanged() -> None:
    assert PROFILE.read_bytes() == SHARED_PROFILE.read_bytes()


def _plans(imported: tuple[Path, Path, object], variant: str = "base") -> tuple[object, object]:
    recipe, cluster, _ = imported
    ready = recipe.with_name("filled.toml")
    ready.write_text(filled(recipe.read_text()))
    mine = plan(load_recipe(ready, variant=variant), load_cluster(cluster), "imported")
    seed = plan(load_recipe(SEED), load_cluster(SPARK4), "seed")
    return mine, seed


# Where the imported line may differ from the seed recipe's, and why. Anything else differing
# fails the test.
SITE_FLAGS = {"--port", "--dist-init-addr"}  # PORT=8888 vs 30000; HEAD_IP vs the spark4 cluster
# The profile's EXTRA_SGLANG_ARGS (and docs/tp4.md "What runs" → Serving) has --sleep-on-idle;
# the seed recipe's copy of that line left it out.
SEED_OMITS_FLAGS = {"--sleep-on-idle"}


@pytest.mark.parametrize("line", sorted(LINES))
def test_engine_flags_identical_to_seed_recipe_apart_from_site_values(request: pytest.FixtureRequest,
                                                                     line: str) -> None:  # fmt: skip
    fixture, variant = LINES[line]
    mine, seed = _plans(request.getfixturevalue(fixture), variant)
    for r in range(4):
        a, b = _flags(mine.ranks[r].argv), _flags(seed.ranks[r].argv)  # type: ignore[attr-defined]
        differ = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        assert differ == SITE_FLAGS | SEED_OMITS_FLAGS, {k: (a.get(k), b.get(k)) for k in differ}
        assert all(k in a and k not in b for k in SEED_OMITS_FLAGS)
        assert a["--node-rank"] == (str(r),) and a["--tp"] == ("4",) and a["--ep-size"] == ("1",)
        assert a["--dist-init-addr"] == ("10.0.0.1:20000",)  # HEAD_IP:DIST_PORT


def _gate_keys() -> list[str]:
    line = [ln for ln in production_text().splitlines() if ln.startswith("EXTRA_CONTAINER_ENV=")][-1]
    return re.findall(r"(\w+)=", line.split("=", 1)[1])


# Env keys where the two may differ, each with the reason.
SITE_ENV = {
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",  # NIC names (cluster file)
    "SGLANG_HOST_IP",  # each node's fabric address
    "DSV41_SOURCE",  # checkpoint path: snapshot revision is a placeholder
    "DSV41_PACKED_DIR",  # profile mounts ENGRAM_DIR at /engram; the seed uses /state/engram
}  # fmt: skip
# aiden16's RoCE pins that the seed adds and the Mia profile does not have.
SEED_ONLY_ENV = {"NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
                 "NCCL_IB_SUBNET_PREFIX_LEN"}  # fmt: skip
# Profile keys start.sh passes that the seed recipe does not set (engine defaults there).
PROFILE_ONLY_ENV = {
    "CUDA_DEVICE_ORDER", "DSPARK_SPS_TABLE", "DSPARK_STS_TABLE", "DSV41_IO_THREADS", "DSV41_LOOP_ABORT",
    "DSV41_LOOP_LINE_REPEATS", "DSV41_LOOP_NGRAM", "DSV41_LOOP_REPEATS", "DSV41_MAX_NEW_TOKENS",
    "DSV41_MXFP8_BACKEND", "DSV41_PREFILL_EMPTY_CACHE_TOKENS", "DSV41_RESIDENT_SCALES",
    "DSV41_STATS_SECONDS", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
}  # fmt: skip
# The seed raises the default reasoning budget to 100; the profile pins 75.
SEED_CHOICE_ENV = {"SGLANG_DSV41_REASONING_EFFORT"}


@pytest.mark.parametrize("line", sorted(LINES))
def test_adapter_gates_and_env_identical_to_seed_recipe_key_by_key(request: pytest.FixtureRequest,
                                                                  line: str) -> None:  # fmt: skip
    fixture, variant = LINES[line]
    mine, seed = _plans(request.getfixturevalue(fixture), variant)
    gates = _gate_keys()
    assert len(gates) == 38
    for r in range(4):
        a, b = mine.ranks[r].env_dict(), seed.ranks[r].env_dict()  # type: ignore[attr-defined]
        for key in gates:
            assert a[key] == b[key], key
        both = a.keys() & b.keys()
        differ = {k for k in both if a[k] != b[k]}
        assert differ == SITE_ENV | SEED_CHOICE_ENV, {k: (a[k], b[k]) for k in differ}
        # spark4.toml pins the GID index; start.sh detects it per node at serve time.
        assert b.keys() - a.keys() == SEED_ONLY_ENV | {"NCCL_IB_GID_INDEX"}
        assert a.keys() - b.keys() == PROFILE_ONLY_ENV
        assert a["DSV41_LAUNCHER"] == "tp4" and a["EP_SIZE"] == "1" and a["TP_SIZE"] == "4"


def test_site_values_are_placeholders_or_cluster_values(imported) -> None:  # type: ignore[no-untyped-def]
    recipe, cluster, result = imported
    assert has_placeholders(load_recipe(recipe).env["DSV41_SOURCE"])
    with pytest.raises(PlanError) as refused:
        plan(load_recipe(recipe), load_cluster(cluster), "imported")
    assert str(refused.value) == (
        f"{recipe}: fill in the <SET ME: …> placeholders that sparkfleet import left: env.DSV41_SOURCE, staging[0].src"
    )
    mine, _ = _plans(imported)
    head = mine.ranks[0]  # type: ignore[attr-defined]
    env = {v.key: v for v in head.env}
    assert env["DSV41_SOURCE"].value.endswith(f"/snapshots/{FILLED_REVISION}")
    for key, value in (("NCCL_SOCKET_IFNAME", "enP7s7"), ("GLOO_SOCKET_IFNAME", "enP7s7"),
                       ("NCCL_IB_HCA", "rocep1s0f0,rocep1s0f1")):  # fmt: skip
        assert (env[key].value, env[key].source) == (value, "cluster")
    text = recipe.read_text()
    assert "Placeholders to fill in" in text and "DSV41_SOURCE" in text
    assert [n.key for n in result.placeholders] == ["DSV41_SOURCE"]  # type: ignore[attr-defined]
    assert [n.node.fabric_ip for n in mine.ranks] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]  # type: ignore[attr-defined]


def test_packed_engram_staging_and_image(imported) -> None:  # type: ignore[no-untyped-def]
    recipe = load_recipe(imported[0])
    assert recipe.docker_image == "dsv41-4x-spark:canary-roce"
    (stage,) = recipe.staging
    assert (stage.kind, stage.id, stage.dst) == ("sparse-rows", "engram", "{{home}}/dsv41-engram")
    assert stage.src is not None and stage.src.startswith("{{hf}}/hub/models--deepseek-ai--DeepSeek-V4.1-Flash/")
    mounts = {(m.host, m.container) for m in recipe.extra_mounts}
    assert ("{{home}}/dsv41-engram", "/engram") in mounts
    assert ("{{home}}/dsv41-4x-spark/state", "/state") in mounts


def test_every_profile_key_is_mapped_or_listed() -> None:
    text = production_text() + "\nMYSTERY_KNOB=7\nrun_something --now\nX=$(hostname)\n"
    profile = parse_profile(text, "p")
    result = import_mia_env(profile)
    everything = result.recipe_toml + (result.cluster_toml or "")
    for key in profile.values():
        assert key in everything, key
    unknown = {n.key for n in result.not_understood}
    assert "MYSTERY_KNOB" in unknown
    block = result.recipe_toml.split("NOT UNDERSTOOD", 1)[1]
    assert "MYSTERY_KNOB" in block and "run_something" in block and "command substitution" in block
    assert "NFS_SHARE" in {n.key for n in result.not_carried}


def test_secrets_in_a_profile_never_reach_the_recipe() -> None:
    text = "TP_SIZE=2\nNNODES=2\nWORKER_HOSTS=b\nSGLANG_API_KEY=sk-secret-value\n" \
           'EXTRA_CONTAINER_ENV="HF_TOKEN=hf_abcdefgh DSV41_X=1"\n'  # fmt: skip
    result = import_mia_env(parse_profile(text, "p"))
    assert "sk-secret-value" not in result.recipe_toml and "hf_abcdefgh" not in result.recipe_toml
    assert {"SGLANG_API_KEY", "HF_TOKEN"} <= {n.key for n in result.not_carried}
    assert 'DSV41_X = "1"' in result.recipe_toml


def test_per_rank_flag_in_extra_args_is_listed_not_duplicated(tmp_path: Path) -> None:
    extra = "--port 9 --watchdog-timeout 5 --enable-cache-report"
    text = f'TP_SIZE=1\nNNODES=1\nIMAGE=x:1\nEXTRA_SGLANG_ARGS="{extra}"\n'
    result = import_mia_env(parse_profile(text, "p"))
    (tmp_path / "recipe.toml").write_text(result.recipe_toml)
    recipe = load_recipe(tmp_path / "recipe.toml")
    assert "--port" not in recipe.args and recipe.args.count("--enable-cache-report") == 1
    assert any("--port 9" in n.detail for n in result.not_carried)


def test_the_profiles_switched_off_blocks_are_variants_in_a_chain(imported_variants) -> None:  # type: ignore[no-untyped-def]
    recipe = load_recipe(imported_variants[0])
    assert list(recipe.variants) == ["switchless-ring", "canary", "canary-roce", "prefill-tp-split", "production"]
    assert recipe.variants["production"].extends == "canary-roce"  # "(canary-roce image, …)"
    assert recipe.variants["prefill-tp-split"].extends == "canary-roce"
    assert recipe.variants["canary"].extends == "base"
    assert recipe.docker_image == "dsv41-4x-spark:local"  # the active profile is the base
    assert load_recipe(imported_variants[0], variant="canary").docker_image == "dsv41-4x-spark:canary"
    ring = load_recipe(imported_variants[0], variant="switchless-ring").env
    assert (ring["NCCL_ALGO"], ring["NCCL_MAX_NCHANNELS"]) == ("Ring", "4")


def test_production_variant_plans_exactly_the_hand_edited_profile(imported, imported_variants) -> None:  # type: ignore[no-untyped-def]
    edited, _ = _plans(imported)
    chosen, _ = _plans(imported_variants, "production")
    for a, b in zip(edited.ranks, chosen.ranks, strict=True):  # type: ignore[attr-defined]
        assert _flags(a.argv) == _flags(b.argv)
        assert a.env_dict() == b.env_dict() and a.image == b.image


def test_what_a_variant_cannot_carry_is_reported_with_its_name(imported_variants) -> None:  # type: ignore[no-untyped-def]
    result = imported_variants[2]
    carried = {n.key for n in result.not_carried}
    assert {"BUILD_DOCKERFILE (variant canary)", "NCCL_SWITCHLESS_RING_ONLY (variant switchless-ring)"} <= carried


def test_a_worker_host_ssh_would_read_as_an_option_is_not_copied(tmp_path: Path) -> None:
    text = 'TP_SIZE=2\nNNODES=2\nWORKER_HOSTS="-oProxyCommand=evil"\nWORKER_IPS=10.0.0.2\n'
    result = import_mia_env(parse_profile(text, "p"))
    assert result.cluster_toml is not None and "-oProxyCommand" not in result.cluster_toml
    assert any(n.key == "WORKER_HOSTS" and "not a host name" in n.detail for n in result.not_understood)
    (tmp_path / "cluster.toml").write_text(result.cluster_toml)
    assert load_cluster(tmp_path / "cluster.toml").nodes[1].name == "worker1"  # loads; plan asks for the host


def test_the_profiles_cap_loop_abort_and_reasoning_effort_become_the_gateway_route(imported) -> None:  # type: ignore[no-untyped-def]
    recipe, _, _ = imported
    serve = load_recipe(recipe).serve
    assert json.loads(serve.gateway_route() or "{}") == {
        "max_new_tokens": 32768,
        "loop_abort": {"ngram": 32, "repeats": 4, "token_repeats": 64, "line_repeats": 8},
        "fields": {"chat_template_kwargs": {"reasoning_effort": 75}},
    }
    assert "max_new_tokens = 32768  # DSV41_MAX_NEW_TOKENS" in recipe.read_text()
