"""Import a sparkrun YAML recipe (reference: sparkrun.md §2-3) as a sparkfleet recipe.

sparkrun fills the ``command`` template's ``{key}`` placeholders from ``defaults`` (and
``model``), runs it on every node, and appends the per-rank flags itself (SGLang:
``--dist-init-addr head:25000 --nnodes N --node-rank r``; vLLM: ``--nnodes --node-rank
--master-addr --master-port`` and ``--headless`` above rank 0). sparkfleet appends the same
per-rank flags, so the import keeps the template's other flags as ``args`` and moves the model,
parallel sizes and port into recipe fields; the rendezvous port stays sparkrun's 25000.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from sparkfleet.errors import RecipeError
from sparkfleet.importers.report import ImportResult, Note, comment_block, placeholder
from sparkfleet.importers.toml_text import TomlDoc
from sparkfleet.plan.flags import is_flag
from sparkfleet.spec.secrets import is_secret

SPARKRUN_INIT_PORT = 25000
SPARKRUN_RAY_PORT = 46379
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Env each sparkrun runtime sets on every rank (sparkrun.md §3); recipe env wins over it.
RUNTIME_ENV = {
    "sglang": {"NCCL_CUMEM_ENABLE": "0", "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0"},
    "vllm": {"NCCL_CUMEM_ENABLE": "0", "OMP_NUM_THREADS": "4"},
    "vllm-ray": {"RAY_memory_monitor_refresh_ms": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"},
    "llama-cpp": {},
}
# Flags whose value becomes a recipe field (per engine), and flags sparkfleet sets per rank.
FIELD_FLAGS = {
    "sglang": {"--model-path": "model", "--model": "model", "--tp": "tp", "--tp-size": "tp",
               "--tensor-parallel-size": "tp", "--pp-size": "pp", "--pipeline-parallel-size": "pp",
               "--port": "port", "--host": "host"},
    "vllm": {"--model": "model", "-tp": "tp", "--tensor-parallel-size": "tp", "-pp": "pp",
             "--pipeline-parallel-size": "pp", "--port": "port", "--host": "host"},
    "llama-cpp": {"-m": "model", "--model": "model", "-hf": "hf", "--hf-repo": "hf", "--hf-file": "file",
                  "-hff": "file", "--port": "port", "--host": "host"},
}  # fmt: skip
PER_RANK = {"--nnodes", "--node-rank", "--dist-init-addr", "--master-addr", "--master-port", "--headless",
            "--rpc", "-n", "-r"}  # fmt: skip
# Without a command template, sparkrun builds flags from ``defaults`` through a flag map.
FLAG_MAPS = {
    "sglang": {"tensor_parallel": "--tp-size", "pipeline_parallel": "--pp-size", "port": "--port",
               "host": "--host", "gpu_memory_utilization": "--mem-fraction-static",
               "max_model_len": "--context-length", "served_model_name": "--served-model-name"},
    "vllm": {"tensor_parallel": "--tensor-parallel-size", "pipeline_parallel": "--pipeline-parallel-size",
             "port": "--port", "host": "--host", "gpu_memory_utilization": "--gpu-memory-utilization",
             "max_model_len": "--max-model-len", "served_model_name": "--served-model-name"},
    "llama-cpp": {"port": "--port", "host": "--host", "max_model_len": "--ctx-size"},
}  # fmt: skip
ENTRYPOINTS = {"sglang": ("python3", "-m", "sglang.launch_server"), "vllm": ("vllm", "serve"),
               "llama-cpp": ("llama-server",)}  # fmt: skip
NOT_CARRIED = {
    "pre_exec": "runs in every container before serve; bake it into the image",
    "post_exec": "runs in the head container after health; run it after `sparkfleet up`",
    "post_commands": "control-machine commands after health; run them after `sparkfleet up`",
    "stop_after_post": "sparkrun-only",
    "mods": "directories copied into containers; bake them into the image",
    "builder": "image builder; use docker_image_dir or a prebuilt docker_image",
    "builder_config": "image builder settings",
    "distribution_config": "sparkfleet reads weights from each node's HF cache and streams images itself",
    "benchmark": "use `sparkfleet bench`",
    "max_nodes": "sparkfleet runs exactly required_nodes",
    "metadata": "kept as comments; the [memory] table takes figures the memory plan needs",
    "recipe_version": "format version",
    "name": "sparkrun ignores it too (the name is the file stem)",
    "mode": "deprecated in sparkrun",
    "solo_only": "deprecated in sparkrun",
    "cluster_only": "deprecated in sparkrun",
}
KNOWN = {"model", "model_revision", "runtime", "container", "defaults", "env", "command", "min_nodes",
         "executor_config", *NOT_CARRIED}  # fmt: skip


@dataclass(frozen=True)
class SparkrunFile:
    """A sparkrun recipe as read from YAML."""

    source: str
    data: dict[str, Any]


def read_sparkrun(path: Path | str) -> SparkrunFile:
    """Read a sparkrun YAML recipe; malformed input is a RecipeError naming the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a sparkrun recipe is a YAML mapping")
    return SparkrunFile(str(path), data)


def substitute(template: str, values: dict[str, Any]) -> tuple[str, list[str]]:
    """sparkrun's iterative ``{key}`` substitution; unknown placeholders stay as they are."""
    text = template
    for _ in range(10):
        new = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), text)
        if new == text:
            break
        text = new
    return text, sorted(set(_PLACEHOLDER.findall(text)))


def _runtime(data: dict[str, Any], command: str, source: str) -> tuple[str, str]:
    """(sparkfleet engine, sparkrun runtime key for its env)."""
    runtime = str(data.get("runtime") or "").lower()
    defaults = data.get("defaults") or {}
    ray = (
        runtime == "vllm-ray"
        or defaults.get("distributed_executor_backend") == "ray"
        or bool(re.search(r"--distributed-executor-backend[ =]ray", command))
    )
    if runtime in ("", "vllm", "vllm-distributed", "vllm-ray"):
        first = command.split()[:3]
        if runtime == "" and any("sglang" in w for w in first):
            return "sglang", "sglang"
        if runtime == "" and first and first[0] == "llama-server":
            return "llama-cpp", "llama-cpp"
        return "vllm", "vllm-ray" if ray else "vllm"
    if runtime == "sglang":
        return "sglang", "sglang"
    if runtime in ("llama-cpp", "llama.cpp", "llamacpp", "llama-server"):
        return "llama-cpp", "llama-cpp"
    raise RecipeError(f"{source}: runtime: {runtime!r} has no sparkfleet engine (sglang, vllm, llama-cpp)")


def _command_words(engine: str, data: dict[str, Any], values: dict[str, Any], notes: list[Note]) -> list[str]:
    template = data.get("command")
    if template:
        text, unknown = substitute(str(template), values)
        for name in unknown:
            notes.append(Note(f"{{{name}}}", "placeholder with no value in defaults; left in the command"))
        return shlex.split(text.replace("\\\n", " "))
    words = list(ENTRYPOINTS[engine])
    if engine == "vllm":
        words.append(str(values["model"]))
    else:
        words += ["--model-path" if engine == "sglang" else "-m", str(values["model"])]
    for key, value in (data.get("defaults") or {}).items():
        flag = FLAG_MAPS[engine].get(key)
        if flag:
            words += [flag, str(value)]
        elif value is True:
            words.append("--" + key.replace("_", "-"))
        else:
            notes.append(Note(f"defaults.{key}", "no flag in sparkrun's flag map; not passed"))
    return words


def _split(engine: str, words: list[str]) -> tuple[list[str], list[list[str]], str | None]:
    """(entrypoint, flag groups, positional model) of a command line."""
    start = 3 if len(words) >= 3 and words[1] == "-m" else 0  # python3 -m module
    first_flag = next((i for i, w in enumerate(words) if i >= start and w.startswith("-")), len(words))
    head, rest = words[:first_flag], words[first_flag:]
    positional = None
    if engine == "vllm" and len(head) >= 3 and head[1] == "serve":
        head, positional = head[:2], head[2]
    groups: list[list[str]] = []
    for word in rest:
        if is_flag(word):
            flag, sep, value = word.partition("=")
            groups.append([flag, value] if sep and word.startswith("--") else [word])
        elif groups:
            groups[-1].append(word)
        else:
            groups.append([word])
    return head, groups, positional


def import_sparkrun(file: SparkrunFile) -> ImportResult:
    """Map a sparkrun recipe to recipe TOML, listing what could not be carried over."""
    data, source = file.data, file.source
    if not data.get("model"):
        raise RecipeError(f"{source}: model: required")
    defaults = dict(data.get("defaults") or {})
    values: dict[str, Any] = {**defaults, "model": data["model"]}
    not_understood: list[Note] = []
    not_carried: list[Note] = []
    placeholders: list[Note] = []
    engine, runtime = _runtime(data, str(data.get("command") or ""), source)
    words = _command_words(engine, data, values, not_understood)
    entrypoint, groups, positional = _split(engine, words)
    fields: dict[str, str] = {}
    if positional:
        fields["model"] = positional
    args: list[tuple[list[str], str | None]] = []
    for group in groups:
        flag = group[0]
        target = FIELD_FLAGS[engine].get(flag)
        if target and len(group) >= 2:
            fields[target] = group[1]
        elif flag in PER_RANK:
            not_carried.append(Note(" ".join(group), "sparkfleet appends the per-rank flags itself"))
        else:
            args.append((group, None))
    if fields.get("host") not in (None, "0.0.0.0"):
        not_carried.append(Note("--host " + fields["host"], "sparkfleet serves on 0.0.0.0"))
    model = fields.get("model", str(data["model"]))
    model_file: str | None = None
    if engine == "llama-cpp":
        if "hf" in fields:
            repo, _, quant = fields["hf"].partition(":")
            model = repo
            model_file = fields.get("file") or placeholder(f"GGUF file name in {repo} for quant {quant or '?'}")
        elif model.startswith("/") and model.endswith(".gguf"):
            model, model_file = str(PurePosixPath(model).parent), PurePosixPath(model).name
        elif ":" in model and not model.startswith("/"):
            repo, _, quant = model.partition(":")
            model = repo
            model_file = fields.get("file") or placeholder(f"GGUF file name in {repo} for quant {quant}")
        if model_file and model_file.startswith("<SET ME"):
            placeholders.append(Note("model_file", "sparkrun resolves repo:QUANT at download time"))
        if not model.startswith("/") and not data.get("model_revision"):
            placeholders.append(Note("revision", "sparkrun downloads the latest; pin the snapshot you have"))
    env: dict[str, tuple[str, str | None]] = {k: (v, f"sparkrun {runtime} default")
                                              for k, v in RUNTIME_ENV[runtime].items()}  # fmt: skip
    for key, value in (data.get("env") or {}).items():
        text = str(value)
        if is_secret(str(key)) or "$" in text:
            not_carried.append(Note(f"env.{key}", "expanded from your environment by sparkrun: "
                                    f"pass it at launch with --env {key}"))  # fmt: skip
            continue
        env[str(key)] = (text, None)
    executor = data.get("executor_config") or {}
    shm = executor.get("shm_size")
    for key in executor:
        if key != "shm_size":
            not_carried.append(Note(f"executor_config.{key}", "sparkfleet's docker runtime sets its own flags"))
    for key in data:
        if key in NOT_CARRIED:
            not_carried.append(Note(key, NOT_CARRIED[key]))
        elif key not in KNOWN:
            not_understood.append(Note(key, "unknown sparkrun key (sparkrun sweeps these into runtime_config)"))

    doc = TomlDoc()
    doc.comment(f"Imported from {source} by `sparkfleet import sparkrun`.")
    doc.comment("sparkfleet appends the per-rank flags (node count and rank, rendezvous address, host, port)")
    doc.comment("as sparkrun did; the rendezvous port is sparkrun's init port.")
    for key, value in (data.get("metadata") or {}).items():
        doc.comment(f"metadata.{key}: {value}")
    doc.blank()
    doc.set("engine", engine)
    doc.set("name", Path(source).stem)
    if data.get("container"):
        doc.set("docker_image", str(data["container"]), "container")
    doc.set("model", model)
    if model_file:
        doc.set("model_file", model_file)
    if data.get("model_revision"):
        doc.set("revision", str(data["model_revision"]), "model_revision")
    elif engine == "llama-cpp" and not model.startswith("/"):
        # llama.cpp opens the GGUF by path inside the pinned snapshot of the node's HF cache.
        doc.set("revision", placeholder(f"snapshot revision of {model} in the HF cache"))
    if fields.get("port"):
        doc.set("port", int(fields["port"]))
    doc.set("rendezvous_port", SPARKRUN_RAY_PORT if runtime == "vllm-ray" else SPARKRUN_INIT_PORT)
    doc.set("required_nodes", int(data.get("min_nodes") or 1), "min_nodes")
    if fields.get("tp"):
        doc.set("tensor_parallel_size", int(fields["tp"]))
    if fields.get("pp"):
        doc.set("pipeline_parallel_size", int(fields["pp"]))
    if engine == "vllm":
        doc.set("distributed_backend", "ray" if runtime == "vllm-ray" else "mp")
    if shm:
        doc.set("shm_size", str(shm), "executor_config.shm_size")
    if tuple(entrypoint) != ENTRYPOINTS[engine]:
        doc.set("entrypoint", entrypoint)
    doc.blank()
    doc.words("args", args)
    if env:
        doc.blank()
        doc.table("env")
        for key, (value, note) in env.items():
            doc.set(key, value, note)
    comment_block(doc, "Placeholders to fill in", placeholders)
    comment_block(doc, "sparkrun keys not carried over", not_carried)
    comment_block(doc, "NOT UNDERSTOOD (review them)", not_understood)
    return ImportResult(
        recipe_toml=doc.text(),
        placeholders=tuple(placeholders),
        not_carried=tuple(not_carried),
        not_understood=tuple(not_understood),
    )
