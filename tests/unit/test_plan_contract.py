"""The Plan is the whole contract: what up, doctor, image and the renderings read is resolved
into it (no recipe inside), engine adapters see a narrow LaunchSpec, one flag parser answers for
everyone, one MemAvailable-based memory budget, one safetensors header reader."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from sparkfleet.apply.staging import nfs
from sparkfleet.config.cluster import load_cluster, local_cluster
from sparkfleet.config.recipe import load_recipe, parse_recipe
from sparkfleet.doctor.probes import gpu, meminfo
from sparkfleet.doctor.probes.checkpoint import parse as parse_checkpoint
from sparkfleet.evals.memguard import abort_action_for
from sparkfleet.nodes.shipped.failure import StageFailure
from sparkfleet.nodes.shipped.safetensors_index import header_tensors, read_header, tensor_nbytes
from sparkfleet.plan.build import plan
from sparkfleet.plan.engines import ENGINES, LaunchSpec, engine_for
from sparkfleet.plan.flags import flag_names, flag_value, has_flag, is_flag, is_number
from sparkfleet.plan.memory import MIB, memory_plan, plan_memory_lines, usable_memory
from sparkfleet.plan.model import ImageSpec, Plan, VerifySpec
from sparkfleet.plan.staging.nfs import volume_name
from sparkfleet.plan.staging.sparse_rows import SparseRows
from tests.conftest import ROOT, SEEDS, SPARK4
from tests.unit._captures import h200_section

MIA = SEEDS / "dsv41-flash-4x-mia"
EUGR = SEEDS / "dsv41-flash-eugr-0913-4x"
SRC = ROOT / "src" / "sparkfleet"


def _mia() -> Plan:
    return plan(load_recipe(MIA), load_cluster(SPARK4), "mia")


def _eugr() -> Plan:
    return plan(load_recipe(EUGR), load_cluster(SPARK4), "eugr")


# --- one flag parser -----------------------------------------------------------------------


def test_flag_value_reads_both_spellings_aliases_and_the_last_occurrence() -> None:
    args = ("--a", "1", "--b=2", "--max_model_len", "4096", "--a=3", "-tp", "4", "--neg", "-1")
    assert flag_value(args, "--a") == "3"  # the last one wins, as in argparse
    assert flag_value(args, "--b") == "2"
    assert flag_value(args, "--max-model-len") == "4096"  # _ and - are the same
    assert flag_value(args, "--tensor-parallel-size", "-tp") == "4"  # aliases of one option
    assert flag_value(args, "--neg") == "-1"
    assert flag_value(args, "--absent") is None
    assert flag_value(("--dangling",), "--dangling") is None
    assert is_number("-1") and is_number("0.5") and not is_number("--x")
    assert is_flag("-a") and is_flag("--x=y") and not is_flag("-1") and not is_flag("-")
    assert flag_names(args) == {"--a", "--b", "--max_model_len", "-tp", "--neg"}
    assert has_flag(("--enforce_eager",), "--enforce-eager") and not has_flag(("-1",), "-1")


def _served_recipe(args: list[str], engine: str = "vllm") -> dict[str, object]:
    return {"engine": engine, "model": "org/model", "args": args, "model_file": "m.gguf", "revision": "abc"}


@pytest.mark.parametrize("args", [["--served-model-name=foo"], ["--served-model-name", "foo"],
                                  ["--served_model_name", "foo"]])  # fmt: skip
def test_served_model_name_inline_gives_foo_in_the_plan_and_the_memory_model(args: list[str]) -> None:
    recipe = parse_recipe(_served_recipe(args), "r.toml")
    p = plan(recipe, local_cluster(), "x")
    assert p.served_model == "foo"
    # The memory model reads flags out of the planned argv with the same parser: it agrees.
    assert flag_value(p.head.argv, "--served-model-name") == "foo"
    assert engine_for("vllm").served_model(recipe.launch_spec()) == "foo"


def test_served_model_falls_back_to_the_field_then_the_model_and_llamacpp_reads_its_alias() -> None:
    with_field = parse_recipe({**_served_recipe([]), "served_model_name": "bar"}, "r.toml")
    assert plan(with_field, local_cluster(), "x").served_model == "bar"
    assert plan(parse_recipe(_served_recipe([]), "r.toml"), local_cluster(), "x").served_model == "org/model"
    for args in (["--alias=g"], ["-a", "g"], ["--model_alias", "g"]):
        llama = parse_recipe(_served_recipe(args, "llama-cpp"), "r.toml")
        assert plan(llama, local_cluster(), "x").served_model == "g"


def test_reserved_flags_are_found_inline_and_in_either_spelling() -> None:
    from sparkfleet.errors import RecipeError

    with pytest.raises(RecipeError, match=r"--node_rank is set by sparkfleet"):
        parse_recipe({"engine": "sglang", "model": "m/m", "args": ["--node_rank=1"]}, "r.toml")
    # A contradicting executor written inline is refused (it used to crash the check).
    bad = {"engine": "vllm", "model": "m/m", "distributed_backend": "ray",
           "args": ["--distributed-executor-backend=mp"]}  # fmt: skip
    with pytest.raises(RecipeError, match="contradicts distributed_backend"):
        parse_recipe(bad, "r.toml")
    ok = {**bad, "args": ["--distributed-executor-backend=ray"]}
    assert parse_recipe(ok, "r.toml").engine == "vllm"


# --- the Plan carries what its readers need ------------------------------------------------


def test_the_plan_has_no_recipe_and_carries_verify_revision_image_memory_and_identity() -> None:
    assert "recipe" not in {f.name for f in dataclasses.fields(Plan)}
    recipe = load_recipe(MIA)
    p = _mia()
    assert p.verify == VerifySpec(
        expect=recipe.verify.expect, forbid=recipe.verify.forbid, smoke_prompt=recipe.verify.smoke_prompt,
        smoke_expect=recipe.verify.smoke_expect, smoke_max_tokens=recipe.verify.smoke_max_tokens,
        timeout=recipe.verify.timeout,
    )  # fmt: skip
    assert p.revision == recipe.revision
    assert p.cluster_name == load_cluster(SPARK4).name and p.cluster_source == load_cluster(SPARK4).source
    assert p.model_repo == "deepseek-ai/DeepSeek-V4.1-Flash"
    # docker_image_dir "mia-tp4" does not exist beside the test copy: no context, and where it looked.
    assert p.image is not None and p.image.ref == "dsv41-4x-spark:mia-tp4"
    assert p.image.build_dir == "mia-tp4" and p.image.context is None
    assert p.image.looked_in[0] == str(MIA.resolve() / "mia-tp4")
    # The memory inputs, the SGLang DeepSeek-V4 indexer coefficient already defaulted.
    assert (p.memory.engine, p.memory.tp, p.memory.nnodes) == ("sglang", 4, 4)
    assert p.memory.prefill_bytes_per_token2 == 14.0
    eugr = _eugr()
    assert eugr.memory.prefill_bytes_per_token2 is None  # vLLM: no known coefficient
    assert eugr.image == ImageSpec("eugr/spark-vllm-b12x:nightly-20260913")
    assert eugr.model_repo == "deepseek-ai/DeepSeek-V4.1-Flash"  # the composed model's first source
    # Staging steps carry their kind's entry, its paths rendered for the step's node.
    engram = next(s for s in p.staging if s.kind == "sparse-rows")
    assert isinstance(engram.entry, SparseRows) and engram.entry.tables == recipe.staging[0].tables
    assert "{{" not in engram.dst


def test_a_build_context_that_exists_is_resolved_to_an_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "docker-images" / "ctx").mkdir(parents=True)
    folder = tmp_path / "recipes" / "r"
    folder.mkdir(parents=True)
    text = 'engine = "vllm"\nmodel = "m/m"\ndocker_image = "i:1"\ndocker_image_dir = "ctx"\n'
    (folder / "recipe.toml").write_text(text)
    image = plan(load_recipe(folder), local_cluster(), "r").image
    assert image is not None and (image.ref, image.build_dir) == ("i:1", "ctx")
    assert image.context == str(tmp_path / "docker-images" / "ctx") and Path(image.context).is_absolute()
    assert image.looked_in[0] == str(folder / "ctx")  # beside the recipe first
    process = plan(parse_recipe({"engine": "vllm", "model": "m/m"}, "r.toml"), local_cluster(), "r")
    assert process.image is None


def test_the_nfs_volume_name_is_the_plans_rule() -> None:
    assert nfs.volume_name is volume_name
    assert volume_name("my dep", "w/1") == "sparkfleet-my-dep-w-1"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_plan_imports_no_apply_and_adapters_import_no_recipe() -> None:
    for path in (SRC / "plan").rglob("*.py"):
        assert not any(m.startswith("sparkfleet.apply") for m in _imports(path)), path
    for path in (SRC / "plan" / "engines").glob("*.py"):
        assert not any(m.startswith("sparkfleet.config") for m in _imports(path)), path


def test_nothing_outside_the_plan_package_reads_a_plans_recipe() -> None:
    offenders = []
    for path in SRC.rglob("*.py"):
        if (SRC / "plan") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # plan.recipe, planned.recipe, p.recipe, self.plan.recipe, ...
            if isinstance(node, ast.Attribute) and node.attr == "recipe":
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name in ("plan", "planned", "p", "the_plan"):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


# --- engine-specific rules live in the adapters ---------------------------------------------


def test_adapters_take_a_launch_spec_and_own_the_engine_branches() -> None:
    spec = LaunchSpec(args=("--enforce-eager",), model="m/m")
    assert engine_for("vllm").cuda_graphs(spec.args) == (0, "--enforce-eager: no graphs")
    assert engine_for("vllm").cuda_graphs(())[0] == 2 * 1024**3
    graphs, detail = engine_for("sglang").cuda_graphs(("--cuda-graph-max-bs=32",))
    assert graphs == int(5.6e9 / 16 * 32) and "max bs 32" in detail
    assert engine_for("llama-cpp").cuda_graphs(()) == (0, "none for this engine")
    assert engine_for("llama-cpp").hub_model_ref("org/g", "abc", "/hf/") == "/hf/hub/models--org--g/snapshots/abc"
    assert engine_for("vllm").hub_model_ref("org/g", "abc", "/hf") == "org/g"
    assert engine_for("sglang").prefill_bytes_per_token2("x", "deepseek-ai/DeepSeek-V4-Base") == 14.0
    assert engine_for("sglang").prefill_bytes_per_token2("org/llama", None) is None
    assert engine_for("llama-cpp").memory is None and engine_for("vllm").memory is not None
    spread = LaunchSpec(args=(), model="m", required_nodes=4, tensor_parallel_size=2)
    problem = engine_for("sglang").check_layout(spread)
    assert problem is not None and "some nodes would hold no rank" in problem


def test_a_cpu_engine_gets_no_memory_lines() -> None:
    llama = parse_recipe({"engine": "llama-cpp", "model": "/m", "model_file": "g.gguf"}, "r.toml")
    assert plan_memory_lines(plan(llama, load_cluster(SPARK4), "g")) == []


def test_the_memory_guard_aborts_the_way_the_adapter_says() -> None:
    client = httpx.Client()
    sglang = abort_action_for("sglang", "http://127.0.0.1:1", client)
    assert sglang is not None and "/abort_request" in sglang()  # refused: the route is still named
    assert abort_action_for("vllm", "http://x", client)() == "closed the client's connections to the vllm server"  # type: ignore[misc]
    other = httpx.Client()
    note = abort_action_for("llama-cpp-python", "http://x", other)()  # type: ignore[misc]
    assert "may still run to its end" in note
    assert abort_action_for("llama-cpp", "http://x", None) is None
    assert set(ENGINES) == {"sglang", "vllm", "llama-cpp"}


# --- GB10 memory: one MemAvailable-based answer --------------------------------------------


def _gb10() -> gpu.GpuFacts:
    line = h200_section("query-gpu csv", "nvidia-smi-h200.txt").strip().split(", ")
    line[1], line[3:6] = "NVIDIA GB10", ["[N/A]", "[N/A]", "[N/A]"]
    return gpu.parse(", ".join(line) + "\n", 0, "")


def test_unified_memory_plans_with_memavailable_not_memtotal() -> None:
    mem = meminfo.parse(h200_section("meminfo"))
    assert mem.available < mem.total
    assert usable_memory(_gb10(), mem) == (mem.available, "unified memory: MemAvailable")
    assert usable_memory(None, mem) == (mem.available, "no GPU: MemAvailable")
    h200 = gpu.parse(h200_section("query-gpu csv", "nvidia-smi-h200.txt"), 0, "")
    assert usable_memory(h200, mem)[0] == 143771 * MIB
    assert usable_memory(None, None) == (None, "unknown")
    # The memory plan doctor makes on a Spark uses the same figure (no [memory] device_memory).
    p = _mia()
    mp = memory_plan(p.ranks[1], p.memory, gpu=_gb10(), meminfo=mem)
    assert mp.device_memory == mem.available and mp.device_source == "unified memory: MemAvailable"
    assert mp.static_pool == int(0.80 * mem.available)


# --- one safetensors header reader ---------------------------------------------------------


def test_one_header_reader_for_node_side_staging_doctor_and_memory(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((4, 8), dtype=np.float16), "b": np.zeros((3,), dtype=np.float32)}, str(file),
              metadata={"format": "pt"})  # fmt: skip
    data = file.read_bytes()
    sizes = tensor_nbytes(read_header(str(file)).tensors)  # the node-side reader
    assert sizes == {"a": 64, "b": 12}
    length = int.from_bytes(data[:8], "little")
    probe_out = f"## header model.safetensors {length}\n{data[8 : 8 + length].decode()}\n"
    assert parse_checkpoint(probe_out) == (None, sizes)  # doctor's probe agrees
    with pytest.raises(ValueError, match="not a JSON object"):
        header_tensors(b"[1]")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((2).to_bytes(8, "little") + b"{x" + b"\0" * 8)
    with pytest.raises(StageFailure, match="safetensors header is not JSON"):
        read_header(str(bad))
