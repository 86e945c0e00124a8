"""Import a sparkrun YAML recipe as a sparkfleet recipe, by sparkrun's own rules (sparkrun_rules).

sparkrun renders the ``command`` template from ``defaults`` (and ``model``), or, without one,
builds the engine command from its per-runtime flag map; it runs that on every node and appends
the per-rank flags itself (SGLang: ``--dist-init-addr head:25000 --nnodes N --node-rank r``;
vLLM: ``--nnodes --node-rank --master-addr --master-port`` and ``--headless`` above rank 0).
sparkfleet appends the same per-rank flags, so the import keeps the command's other flags as
``args`` and moves the model into a recipe field. An imported recipe gets ``command_style =
"sparkrun"``: the parallel sizes and port also become fields, but their flags (and --host; for
llama.cpp the -hf/-m model flag) stay in ``args`` as the command spells them, and plan replaces
only their values, so the planned command is sparkrun's flag for flag. A llama.cpp ``-hf
repo:QUANT`` stays for llama-server to download (warned about by ``model``). The rendezvous
port stays sparkrun's 25000. Every key of the file is carried, noted as not carried, or listed as
not understood; malformed input is a RecipeError naming the file and the key.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from sparkfleet.config.secrets import is_secret
from sparkfleet.errors import RecipeError
from sparkfleet.importers.report import ImportResult, Note, comment_block, placeholder
from sparkfleet.importers.sparkrun_rules import (
    LLAMA_CPP_DEFAULTS,
    TEMPLATES_VERSION,
    env_parts,
    flag_rules,
    flag_words,
    parse_bool,
    parse_version,
    render_template,
    render_vpd,
    required_nodes,
)
from sparkfleet.importers.toml_text import TomlDoc, typed
from sparkfleet.plan.flags import is_flag

SPARKRUN_INIT_PORT = 25000
SPARKRUN_RAY_PORT = 46379
# llama.cpp's RPC: sparkrun's workers run `rpc-server --port 50052` (llama_cpp._DEFAULT_RPC_PORT).
SPARKRUN_RPC_PORT = 50052
# Where sparkrun mounts the node's HF cache in every container (primitives.build_volumes), and
# the HF_HOME every runtime sets there (RuntimePlugin.get_extra_env).
SPARKRUN_HF_MOUNT = "/cache/huggingface"
# sparkrun repairs a line continuation followed by blanks (spaces and, from 0.3.9, tabs: its
# changelog); the first release with the spaces-only repair was not checked, so earlier rules keep
# the text as the shell reads it.
CONTINUATION_REPAIR_VERSION = (0, 3, 9)
# sparkrun 0.4.2: the current release, whose rules a recipe without min_sparkrun_version gets.
V042 = (0, 4, 2)
# 0.4.2's DGX Spark platform (platforms/dgx_spark.py): container env defaults for the vLLM and
# SGLang families, the lowest tier (the recipe's env wins).
DGX_SPARK_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUTE_DSL_ARCH": "sm_121a"}

# The image sparkrun runs when a recipe names none (resolve_container: default_image_prefix:latest).
DEFAULT_IMAGES = {
    "vllm": "ghcr.io/spark-arena/dgx-vllm-eugr-nightly-tf5:latest",
    "vllm-ray": "ghcr.io/spark-arena/dgx-vllm-eugr-nightly-tf5:latest",
    "sglang": "scitrera/dgx-spark-sglang:latest",
    "llama-cpp": "scitrera/dgx-spark-llama-cpp:latest",
}
# Env every rank of these runtimes gets, solo or cluster (get_common_env: default_env_hf_offline);
# sparkfleet's plan sets HF_HUB_OFFLINE itself. llama.cpp's runtime sets none.
COMMON_ENV = {
    "sglang": {"TRANSFORMERS_OFFLINE": "1"},
    "vllm": {"TRANSFORMERS_OFFLINE": "1"},
    "vllm-ray": {"TRANSFORMERS_OFFLINE": "1"},
    "llama-cpp": {},
}
# Env only a multi-node launch gets (get_cluster_env); recipe env wins over both.
CLUSTER_ENV = {
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
    "llama-cpp": {"-m": "model", "--model": "model", "-hf": "hf", "-hfr": "hf", "--hf-repo": "hf", "--hf-file": "file",
                  "-hff": "file", "--port": "port", "--host": "host"},
}  # fmt: skip
# What validate/plan say (the recipe's not_carried) about an imported -hf repo[:QUANT] model.
HUB_FETCH_WARNING = (
    "llama.cpp downloads {spec} on each node at start: not pinned to a revision, each node needs "
    "the Hub; set model to the repo, model_file and revision to stage one pinned file once"
)
# Field flags a vLLM/SGLang import also keeps in args as the recipe spells them (-tp 2, --tp-size,
# --host, --port): the recipe says command_style = "sparkrun", and plan writes these flags where
# and as the recipe wrote them, with this plan's values, as sparkrun runs the rendered command.
STYLE_KEPT = ("tp", "pp", "port", "host")
PER_RANK = {"--nnodes", "--node-rank", "--dist-init-addr", "--master-addr", "--master-port", "--headless",
            "--rpc", "-n", "-r"}  # fmt: skip
ENTRYPOINTS = {"sglang": ("python3", "-m", "sglang.launch_server"), "vllm": ("vllm", "serve"),
               "llama-cpp": ("llama-server",)}  # fmt: skip
# sparkrun 0.4's SGLang runtime builds `sglang serve` (the entrypoint that replaced launch_server).
SGLANG_SERVE = ("sglang", "serve")
NOT_CARRIED = {
    "pre_exec": "runs in every container before serve; bake it into the image",
    "post_exec": "runs in the head container after health; run it after `sparkfleet up`",
    "post_commands": "control-machine commands after health; run them after `sparkfleet up`",
    "stop_after_post": "sparkrun-only",
    "mods": "directories copied into containers; bake them into the image",
    "builder": "image builder; use docker_image_dir or a prebuilt docker_image",
    "builder_config": "image builder settings",
    "build_args": "eugr build-and-copy.sh flags; build the image with them, then name it in docker_image",
    "distribution_config": "sparkfleet reads weights from each node's HF cache and streams images itself",
    "benchmark": "use `sparkfleet bench`",
    "max_nodes": "sparkfleet runs exactly required_nodes",
    "metadata": "kept as comments; the [memory] table takes figures the memory plan needs",
    "recipe_version": "format version",
    "sparkrun_version": "format version",
    "min_sparkrun_version": "chose which sparkrun version's rules the import follows",
    "name": "sparkrun ignores it too (the name is the file stem)",
    "description": "kept as a comment",
    "runtime_version": "informational in sparkrun",
    "mode": "deprecated in sparkrun",
    "solo_only": "deprecated in sparkrun",
    "cluster_only": "deprecated in sparkrun (folded into the node count)",
}
KNOWN = {"model", "model_revision", "runtime", "container", "defaults", "env", "command", "min_nodes",
         "executor_config", *NOT_CARRIED}  # fmt: skip
# executor_config keys sparkfleet carries; the rest are the docker runtime's own choice.
EXECUTOR_CARRIED = {"shm_size", "volumes"}


# Keys whose loss changes what runs (hooks, image contents, container options, env, replicas);
# the rest of NOT_CARRIED is bookkeeping that changes nothing on the nodes.
_MATTERS = ("pre_exec", "post_exec", "post_commands", "mods", "builder", "builder_config", "build_args", "model_path",
            "model",
            "executor_config.", "env.", "defaults.data_parallel", "--host ")  # fmt: skip


def _matters(key: str) -> bool:
    """Whether a note's key names something sparkrun would run or set that the import drops: a
    hook, image contents, a container option, an env value, replicas, a bind address, or a
    placeholder left in the command. Defaults keys without a flag, per-rank flags sparkfleet
    appends itself and unknown top-level keys (sparkrun keeps those in runtime_config, which no
    command reads) change nothing on the nodes."""
    if key == "env.HF_HOME":
        return False  # sparkrun overrides it the same way
    if key.startswith("{") or key in _MATTERS or key == "runtime_config.mods":
        return True
    return any(key.startswith(p) for p in _MATTERS if p.endswith((".", " ")))


@dataclass(frozen=True)
class SparkrunFile:
    """A sparkrun recipe as read from YAML."""

    source: str
    data: dict[str, Any]


def read_yaml_mapping(path: Path | str, what: str) -> SparkrunFile:
    """Read a YAML file that must hold a mapping; every failure is one line naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: is not a UTF-8 text file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"{path}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: {what} is a YAML mapping, not {type(data).__name__}")
    return SparkrunFile(str(path), {str(k): v for k, v in data.items()})


def read_sparkrun(path: Path | str) -> SparkrunFile:
    """Read a sparkrun YAML recipe; malformed input is a RecipeError naming the file."""
    return read_yaml_mapping(path, "a sparkrun recipe")


def substitute(
    template: str, values: dict[str, Any], version: tuple[int, ...] | None = (0, 4, 0), recipe_version: str = "2"
) -> tuple[str, list[str]]:
    """sparkrun's ``{key}`` rendering of a command template at that sparkrun version: the 0.4
    line's render_template, or vpd's arg_substitute before it (sparkrun_rules)."""
    if version is not None and version >= TEMPLATES_VERSION:
        return render_template(template, values)
    return render_vpd(template, values, collapse_escapes=recipe_version == "1")


# --- checking the file's shape --------------------------------------------------------------


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "empty"}.get(type(value), type(value).__name__)  # fmt: skip


class _Checker:
    """One-line errors naming the file and the key, for every shape sparkrun itself would refuse
    (or crash on)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> RecipeError:
        return RecipeError(f"{self.source}: {key}: {message}")

    def mapping(self, data: Mapping[str, Any], key: str) -> dict[str, Any]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, not {_type_name(value)}")
        return {str(k): v for k, v in value.items()}

    def string(self, data: Mapping[str, Any], key: str, required: bool = False) -> str | None:
        value = data.get(key)
        if value is None or value == "":
            if required:
                raise self.fail(key, "required")
            return None
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise self.fail(key, f"must be a string, not {_type_name(value)}")
        return str(value)

    def integer(self, data: Mapping[str, Any], key: str, where: str | None = None) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            number = int(value)
        except (TypeError, ValueError):
            raise self.fail(where or key, f"must be a whole number, not {value!r}") from None
        if number < 1:
            raise self.fail(where or key, f"must be at least 1, not {number}")
        return number

    def scalar_map(self, data: Mapping[str, Any], key: str) -> dict[str, Any]:
        table = self.mapping(data, key)
        for name, value in table.items():
            if isinstance(value, dict | list):
                raise self.fail(f"{key}.{name}", f"must be a single value, not {_type_name(value)}")
        return table

    def string_list(self, data: Mapping[str, Any], key: str) -> list[str]:
        value = data.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or any(isinstance(v, dict | list) for v in value):
            raise self.fail(key, f"must be a list of strings, not {_type_name(value)}")
        return [str(v) for v in value]


# --- the import -----------------------------------------------------------------------------


@dataclass
class _Notes:
    placeholders: list[Note] = field(default_factory=list)
    not_carried: list[Note] = field(default_factory=list)
    not_understood: list[Note] = field(default_factory=list)


def _runtime(data: dict[str, Any], defaults: dict[str, Any], command: str, check: _Checker) -> tuple[str, str]:
    """(sparkfleet engine, sparkrun runtime) by sparkrun's resolvers (core/recipe.py)."""
    runtime = (check.string(data, "runtime") or "").lower()
    cmd = command.strip()
    if not runtime:
        if re.match(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b", cmd):
            runtime = "sglang"
        elif re.match(r"^llama-server\b", cmd):
            runtime = "llama-cpp"
    if runtime in ("", "vllm", "vllm-distributed", "vllm-ray", "eugr-vllm"):
        # _resolve_vllm_variant: only a bare "vllm" (or none) is decided by Ray hints; a recipe
        # that names vllm-distributed stays native even with a Ray backend flag in its command.
        ray = runtime in ("vllm-ray", "eugr-vllm") or (
            runtime in ("", "vllm")
            and (
                str(defaults.get("distributed_executor_backend", "")).lower() == "ray"
                or bool(re.search(r"--distributed-executor-backend\s+ray\b", cmd))
            )
        )
        return "vllm", "vllm-ray" if ray else "vllm"
    if runtime == "sglang":
        return "sglang", "sglang"
    if runtime in ("llama-cpp", "llama.cpp", "llamacpp", "llama-server"):
        return "llama-cpp", "llama-cpp"
    raise check.fail("runtime", f"{runtime!r} has no sparkfleet engine (sglang, vllm, llama-cpp)")


def _command_words(
    engine: str,
    runtime: str,
    data: dict[str, Any],
    values: dict[str, Any],
    min_version: tuple[int, ...] | None,
    check: _Checker,
    notes: _Notes,
    rpc_cluster: bool = False,
) -> list[str]:
    template = check.string(data, "command")
    defaults = {k: v for k, v in values.items() if k not in ("model", "resolved_model_path")}
    if template and not rpc_cluster:
        text, unknown = substitute(template.strip(), values, min_version, str(data.get("recipe_version") or "2"))
        if min_version is not None and min_version >= CONTINUATION_REPAIR_VERSION:
            # Recipe.render_command's sanitize_line_continuations: "\\<blank><newline>" (an escaped
            # blank, which would end the shell command there) is read as a line continuation.
            text = re.sub(r"\\[ \t]+\n", "\\\n", text)
        for name in unknown:
            detail = "placeholder with no value in defaults; left in the command"
            notes.not_understood.append(Note(f"{{{name}}}", detail))
        try:
            words = shlex.split(text.replace("\\\n", " "))
        except ValueError as exc:
            raise check.fail("command", f"not a complete shell command line: {exc}") from None
        script = next((w for w in words if w in ("&&", "||", "|", ";") or w.endswith(";")), None)
        if script or (words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            shown = script or words[0].split("=")[0] + "=…"
            raise check.fail("command", f"a shell script ({shown!r}), not one engine command line: sparkfleet "
                             "starts the engine itself and appends the per-rank flags; do the script's steps "
                             "in the image or a staging step and keep only the engine command")  # fmt: skip
        served = values.get("served_model_name")
        if served is None and _vllm_names_model(engine, min_version):
            served = data["model"]
        flag = "--alias" if engine == "llama-cpp" else "--served-model-name"
        if served is not None and flag not in text:
            # sparkrun's _augment_served_model_name appends "FLAG VALUE" to the command text
            # when the flag is not in it (unquoted: the shell splits a value with spaces).
            words += [flag, *shlex.split(str(served))]
        return words
    rules = flag_rules(engine, runtime == "vllm-ray", min_version)
    model = str(data["model"])  # the command-less builders write recipe.model, not defaults.model
    if engine == "sglang":
        new = min_version is not None and min_version >= TEMPLATES_VERSION
        words = [*(SGLANG_SERVE if new else ENTRYPOINTS["sglang"]), "--model-path", model]
        if values.get("tensor_parallel"):
            words += ["--tp-size", str(values["tensor_parallel"])]
    elif engine == "vllm":
        words = ["vllm", "serve", model]
        if values.get("tensor_parallel"):
            words += ["-tp", str(values["tensor_parallel"])]
    else:
        words = ["llama-server", "-hf" if "/" in model and not model.endswith(".gguf") else "-m", model]
        defaults = {**LLAMA_CPP_DEFAULTS, **defaults}
        if "max_model_len" in defaults and "ctx_size" not in defaults:
            defaults["ctx_size"] = defaults["max_model_len"]
    special: list[str] = []
    if engine == "llama-cpp" and min_version is not None and min_version >= V042:
        # 0.4.2's _special_flags, after the map: --flash-attn valued (a boolean as on/off),
        # --no-webui / --no-mmap when webui / mmap are false.
        fa, webui, mmap = (defaults.pop(k, None) for k in ("flash_attn", "webui", "mmap"))
        if fa is not None:
            special += ["--flash-attn", ("on" if fa else "off") if isinstance(fa, bool) else str(fa)]
        special += [flag for flag, on in (("--no-webui", webui), ("--no-mmap", mmap)) if on is not None
                    and not parse_bool(on)]  # fmt: skip
    flags, dropped = flag_words(defaults, rules)
    flags += special
    if engine == "vllm" and "served_model_name" not in defaults and _vllm_names_model(engine, min_version):
        flags += ["--served-model-name", model]
    for key in dropped:
        if engine == "llama-cpp" and key == "max_model_len":
            continue  # carried as --ctx-size above
        notes.not_carried.append(Note(f"defaults.{key}", f"sparkrun {rules.version} has no flag for it: not passed"))
    return words + flags


def _vllm_names_model(engine: str, min_version: tuple[int, ...] | None) -> bool:
    """sparkrun 0.4.2's vLLM runtimes (_augment_vllm_served_model_name) append
    ``--served-model-name <recipe model>`` when neither the defaults nor the command name one, so the
    server answers to the model id even when it is given a local snapshot path."""
    return engine == "vllm" and min_version is not None and min_version >= V042


def _split(engine: str, words: list[str]) -> tuple[list[str], list[list[str]], str | None]:
    """(entrypoint, flag groups, positional model) of a command line."""
    python = len(words) >= 3 and words[1] == "-m" and PurePosixPath(words[0]).name.startswith("python")
    start = 3 if python else 0  # python3 -m module (llama-server -m is its model flag)
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


def _gguf_pick(repo: str, quant: str) -> str:
    """What sparkrun opens for ``repo:QUANT`` (models/download.py resolve_gguf_path)."""
    return f"GGUF file of {repo} for {quant}: sparkrun takes the first *{quant}*.gguf of the snapshot, sorted"


def _hub_dir(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def runtime_env(runtime: str, nodes: int, version: tuple[int, ...] | None) -> dict[str, tuple[str, str]]:
    """What sparkrun's runtime itself puts in every rank's env (common, then cluster-only on more
    than one node), each with where it came from."""
    env = {k: (v, f"sparkrun {runtime} common env") for k, v in COMMON_ENV[runtime].items()}
    if nodes > 1:
        cluster = dict(CLUSTER_ENV[runtime])
        if runtime == "vllm" and version is not None and version >= TEMPLATES_VERSION:
            cluster.pop("OMP_NUM_THREADS")  # 0.4.0: "vLLM no longer supplies OMP_NUM_THREADS=4"
        env.update({k: (v, f"sparkrun {runtime} cluster env") for k, v in cluster.items()})
    return env


def _env(
    data: dict[str, Any],
    runtime: str,
    nodes: int,
    launch: dict[str, str],
    values: dict[str, Any],
    min_version: tuple[int, ...] | None,
    check: _Checker,
    notes: _Notes,
) -> dict[str, tuple[str, str | None]]:
    """The recipe env: the runtime's own, then the recipe's, templates resolved."""
    env: dict[str, tuple[str, str | None]] = dict(runtime_env(runtime, nodes, min_version))
    # Before 0.3.0 sparkrun expanded $VAR in env from the control machine's environment; 0.3.0
    # stopped ("Recipe env no longer expanded"): the text reaches the container as written.
    expands_vars = min_version is None or min_version < (0, 3, 0)
    for key, raw in check.scalar_map(data, "env").items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise check.fail(f"env.{key}", "is not a valid environment variable name")
        text = "" if raw is None else str(raw)
        if is_secret(key):
            notes.not_carried.append(Note(f"env.{key}", f"a secret: pass it at launch with --env {key}"))
            continue
        if key == "HF_HOME":
            # get_extra_env is merged after the recipe's env: sparkrun's HF_HOME wins.
            notes.not_carried.append(Note("env.HF_HOME", f"= {text}: sparkrun sets HF_HOME={SPARKRUN_HF_MOUNT} "
                                          "over it (hf_mount)"))  # fmt: skip
            continue
        if expands_vars and "$" in text:
            notes.not_carried.append(Note(f"env.{key}", "expanded from your environment by sparkrun: "
                                          f"pass it at launch with --env {key}"))  # fmt: skip
            continue
        try:
            parts = env_parts(text)
        except ValueError as exc:
            raise check.fail(f"env.{key}", str(exc)) from None
        out: list[str] = []
        resolved: list[str] = []
        for literal, name in parts:
            out.append(literal)
            if name is None:
                continue
            namespace, _, field_name = name.partition(".")
            if namespace == "config":
                value = values.get(field_name)
                if value is None or isinstance(value, dict | list):
                    raise check.fail(f"env.{key}", f"{{{name}}}: no scalar value in defaults (sparkrun refuses "
                                     "to launch such a recipe)")  # fmt: skip
                out.append(str(value))
            else:
                out.append(launch[field_name])
            resolved.append("{" + name + "}")
        note = f"from {' '.join(resolved)}" if resolved else None
        env[key] = ("".join(out), note)
    return env


# sparkrun 0.4's persistent runtime cache (core/runtime_cache.py): a host folder per runtime family
# and model mounted at /cache/runtime, XDG_CACHE_HOME pointed there, and the paths each runtime
# declares (runtime_cache_paths) below it.
RUNTIME_CACHE_MOUNT = "/cache/runtime"
_FLASH = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "FLASHINFER_CACHE_DIR": "flashinfer",
          "FLASHINFER_WORKSPACE_BASE": "flashinfer", "CUTE_DSL_CACHE_DIR": "cute_dsl",
          "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "flash_attn_cute_dsl"}  # fmt: skip
RUNTIME_CACHE_PATHS = {
    "vllm": {"VLLM_CACHE_ROOT": "vllm", **_FLASH},
    "sglang": {**_FLASH, "SGLANG_CACHE_DIR": "sglang", "SGLANG_JIT_CACHE_DIR": "sglang/jit",
               "TILELANG_CACHE_DIR": "tilelang", "TVM_FFI_CACHE_DIR": "tvm_ffi"},
    "llama-cpp": {},  # 0.4.2 (read from its dry run): XDG_CACHE_HOME only
}  # fmt: skip


def runtime_cache_key(model: str, revision: str | None) -> str:
    """sparkrun's model key for the runtime cache folder: a readable label and a short hash."""
    label = model.rstrip("/").rsplit("/", 1)[-1] if model.startswith("/") else model
    label = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]+", "-", label.strip().replace("/", "__"))).strip("-._")
    label = label[:48].strip("-._") or "unknown"
    identity = f"{model}@{revision or ''}"
    return f"{label}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def runtime_cache(
    engine: str, model: str, revision: str | None, version: tuple[int, ...] | None = None
) -> tuple[str, dict[str, str]]:
    """(host folder, env) of sparkrun 0.4's runtime cache for this engine and model (0.4.2's vLLM
    runtime also points TORCH_HOME and TORCH_EXTENSIONS_DIR there)."""
    env = {"XDG_CACHE_HOME": RUNTIME_CACHE_MOUNT}
    paths = dict(RUNTIME_CACHE_PATHS[engine])
    if engine == "vllm" and version is not None and version >= V042:
        paths.update(TORCH_HOME="torch", TORCH_EXTENSIONS_DIR="torch_extensions")
    for var, sub in sorted(paths.items()):
        env[var] = f"{RUNTIME_CACHE_MOUNT}/{sub}"
    return f"{{{{state}}}}/runtime-cache/{engine}/{runtime_cache_key(model, revision)}", env


def _mounts(executor: dict[str, Any], check: _Checker) -> list[tuple[str, str, bool]]:
    """executor_config.volumes: ``host:container[:ro]`` strings, or a host → container mapping."""
    raw = executor.get("volumes")
    if raw is None:
        return []
    items: list[str]
    if isinstance(raw, dict):
        items = [f"{k}:{v}" for k, v in raw.items()]
    elif isinstance(raw, list) and all(isinstance(v, str) for v in raw):
        items = list(raw)
    else:
        raise check.fail("executor_config.volumes", "must be a list of HOST:CONTAINER[:ro] strings or a mapping")
    mounts = []
    for item in items:
        parts = item.split(":")
        if len(parts) not in (2, 3) or not parts[0].startswith("/") or not parts[1].startswith("/"):
            raise check.fail("executor_config.volumes", f"{item!r}: expected /HOST:/CONTAINER[:ro|rw]")
        if len(parts) == 3 and parts[2] not in ("ro", "rw"):
            raise check.fail("executor_config.volumes", f"{item!r}: mode must be ro or rw")
        mounts.append((parts[0], parts[1], len(parts) == 3 and parts[2] == "ro"))
    return mounts


def import_sparkrun(file: SparkrunFile, label: str = "sparkrun", sparkrun_version: str | None = None) -> ImportResult:
    """Map a sparkrun recipe to recipe TOML, listing what could not be carried over. The rules are
    those of ``sparkrun_version`` when given, else of the recipe's ``min_sparkrun_version``, else
    of the current release (0.4.2), which is what runs a recipe that names no floor."""
    data, source = file.data, file.source
    check = _Checker(source)
    model_name = check.string(data, "model", required=True)
    assert model_name is not None
    defaults = check.mapping(data, "defaults")
    executor = check.mapping(data, "executor_config")
    metadata = check.mapping(data, "metadata")
    min_nodes = check.integer(data, "min_nodes") or 1
    check.integer(data, "max_nodes")
    if data.get("cluster_only"):
        min_nodes = max(min_nodes, 2)
    for key in ("tensor_parallel", "pipeline_parallel", "data_parallel"):
        check.integer(defaults, key, f"defaults.{key}")
    min_version = None
    if data.get("min_sparkrun_version") is not None:
        try:
            min_version = parse_version(data["min_sparkrun_version"], "min_sparkrun_version")
        except ValueError as exc:
            raise RecipeError(f"{source}: {exc}") from None
    if sparkrun_version is not None:
        try:
            min_version = parse_version(sparkrun_version, "--sparkrun-version")
        except ValueError as exc:
            raise RecipeError(str(exc)) from None
    if min_version is None:
        # min_sparkrun_version is a floor, not a pin: the sparkrun that runs such a recipe today
        # is the current release, which renders it with its own rules.
        min_version = V042
    for key in ("build_args", "mods", "post_exec", "post_commands"):
        check.string_list(data, key)
    revision = check.string(data, "model_revision")
    # sparkrun's config chain (Recipe.build_config_chain): the defaults, then model and
    # resolved_model_path where the defaults have none.
    values: dict[str, Any] = {"model": model_name, "resolved_model_path": model_name, **defaults}
    notes = _Notes()
    command = check.string(data, "command") or ""
    engine, runtime = _runtime(data, defaults, command, check)
    # sparkrun's llama.cpp RPC head runs the command built from the defaults, never the recipe's
    # command (LlamaCppRuntime._build_rpc_head_command); solo, it runs the rendered command.
    rpc_cluster = engine == "llama-cpp" and min_nodes > 1
    words = _command_words(engine, runtime, data, values, min_version, check, notes, rpc_cluster)
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
            if target in STYLE_KEPT or engine == "llama-cpp":
                args.append((group, None))  # command_style "sparkrun": plan replaces the value in place
        elif flag in PER_RANK:
            notes.not_carried.append(Note(" ".join(group), "sparkfleet appends the per-rank flags itself"))
        elif flag == "--revision" and len(group) >= 2 and engine != "llama-cpp":
            # The adapter writes --revision from the recipe's revision field.
            revision = revision or group[1]
        else:
            args.append((group, None))
    if fields.get("host") not in (None, "0.0.0.0"):
        notes.not_carried.append(Note("--host " + fields["host"], "sparkfleet serves on the node's bind address"))
    for name in ("tp", "pp", "port"):
        if name in fields and not fields[name].isdigit():
            flag = "--port" if name == "port" else name
            raise check.fail("command", f"{flag} value {fields[name]!r} is not a number")
    model = fields.get("model", model_name)
    model_file: str | None = None
    hub_fetch = False  # llama.cpp downloads -hf repo[:QUANT] itself at start, as sparkrun's dry run has it
    if engine == "llama-cpp":
        if "hf" in fields:
            model, hub_fetch = fields["hf"], True
            notes.not_carried.append(Note("model", HUB_FETCH_WARNING.format(spec=model)))
            if revision:
                notes.not_carried.append(Note("model_revision", f"= {revision}: llama.cpp's -hf takes no revision"))
                revision = None
        elif model.startswith("/") and model.endswith(".gguf"):
            model, model_file = str(PurePosixPath(model).parent), PurePosixPath(model).name
        elif not model.startswith("/"):
            # -m repo:QUANT: sparkrun's launch downloads the GGUF and passes -m <its path>.
            repo, _, quant = model.rpartition(":") if ":" in model else (model, "", "")
            model = repo
            model_file = fields.get("file") or placeholder(_gguf_pick(repo, quant or "?"))
        if model_file and model_file.startswith("<SET ME"):
            notes.placeholders.append(Note("model_file", "sparkrun resolves repo:QUANT at download time"))
        if not model.startswith("/") and not revision and not hub_fetch:
            notes.placeholders.append(Note("revision", "sparkrun downloads the latest; pin the snapshot you have"))
    if model.startswith("/") and engine != "llama-cpp" and not model.startswith(SPARKRUN_HF_MOUNT + "/"):
        notes.not_carried.append(Note("model_path", f"= {model}: sparkrun mounts nothing for it (it must be in "
                                      "the image); sparkfleet mounts the node's folder at that path"))  # fmt: skip
    tp = int(fields.get("tp") or defaults.get("tensor_parallel") or 1)
    pp = int(fields.get("pp") or defaults.get("pipeline_parallel") or 1)
    nodes = required_nodes(tp, pp, min_nodes) if engine != "llama-cpp" else min_nodes
    if defaults.get("data_parallel") and int(defaults["data_parallel"]) > 1:
        notes.not_carried.append(Note("defaults.data_parallel", "sparkfleet runs one replica per deployment: "
                                      "deploy one per replica"))  # fmt: skip

    # sparkrun always runs a container: the recipe's, else its runtime's default image.
    image = check.string(data, "container") or DEFAULT_IMAGES[runtime]
    docker = True
    hf_root = SPARKRUN_HF_MOUNT if docker else "{{hf}}"
    model_path = (
        model
        if model.startswith("/")
        else f"{hf_root}/hub/{_hub_dir(model)}/snapshots/{revision}"
        if revision
        else placeholder(f"snapshot path of {model} (sparkrun resolves it on each node)")
    )
    launch = {
        "model_path": model_path,
        "model_revision": revision or placeholder(f"revision of {model} (sparkrun reads the node's cache)"),
        "num_nodes": str(nodes),
        "node_rank": "{{rank}}",
        "node_host": "{{node}}",
        "cluster_id": "{{name}}",
        "runtime_cache_dir": placeholder("a host directory for compile caches (sparkrun's runtime cache)"),
    }
    new_rules = min_version is not None and min_version >= TEMPLATES_VERSION
    cache_dir: str | None = None
    if new_rules and docker and engine in RUNTIME_CACHE_PATHS and (engine != "llama-cpp" or min_version >= V042):
        # sparkrun keys it by the recipe's model as written (a GGUF repo:QUANT included).
        key_model = str(data["model"]) if engine == "llama-cpp" else model
        cache_dir, cache_env = runtime_cache(engine, key_model, revision, min_version)
        launch["runtime_cache_dir"] = RUNTIME_CACHE_MOUNT
    env = _env(data, runtime, nodes, launch, values, min_version, check, notes)
    if cache_dir is not None:
        # Under the recipe's own env, as sparkrun layers it (recipe env wins).
        env = {**{k: (v, "sparkrun 0.4 runtime cache") for k, v in cache_env.items()}, **env}
    if min_version is not None and min_version >= V042 and docker:
        if engine in ("vllm", "sglang"):
            env = {**{k: (v, "sparkrun 0.4.2 DGX Spark platform default") for k, v in DGX_SPARK_ENV.items()}, **env}
        # RuntimePlugin.get_extra_env, merged over the recipe's env as HF_HOME is.
        env["HF_HUB_CACHE"] = (f"{SPARKRUN_HF_MOUNT}/hub", "sparkrun 0.4.2 sets it beside HF_HOME")
    for key, (text, _) in env.items():
        if text.startswith("<SET ME") or "<SET ME" in text:
            notes.placeholders.append(Note(f"env.{key}", "a {launch.*} value sparkrun finds at launch"))
    mounts = _mounts(executor, check)
    for key, value in executor.items():
        if key not in EXECUTOR_CARRIED:
            detail = f"= {typed(value)}: sparkfleet's docker runtime sets its own flags"
            notes.not_carried.append(Note(f"executor_config.{key}", detail))
    for key, value in data.items():
        if key in NOT_CARRIED:
            shown = f"= {typed(value)}: " if key in ("build_args", "mods", "max_nodes", "builder") else ""
            notes.not_carried.append(Note(key, shown + NOT_CARRIED[key]))
        elif key not in KNOWN:
            notes.not_understood.append(Note(key, f"= {typed(value)}: unknown sparkrun key "
                                             "(sparkrun sweeps these into runtime_config)"))  # fmt: skip

    doc = TomlDoc()
    doc.comment(f"Imported from {source} by `sparkfleet import {label}`")
    rules = "sparkrun " + ("0.4 line" if new_rules else "0.2.40/0.3")
    chosen = f"--sparkrun-version {sparkrun_version}" if sparkrun_version else (
        f"min_sparkrun_version: {data.get('min_sparkrun_version') or 'none'}")  # fmt: skip
    doc.comment(f"following {rules}'s rules ({chosen}).")
    if engine == "llama-cpp":
        doc.comment("sparkfleet appends --rpc with the workers (rpc-server on the rendezvous port) as sparkrun did;")
        doc.comment("the command's model, host and port flags stay in args as written and plan sets their values")
        doc.comment('(command_style = "sparkrun").')
        if rpc_cluster and command:
            doc.comment("On more than one node sparkrun's head runs the command built from defaults, not the")
            doc.comment("recipe's command (its _build_rpc_head_command): so do these args.")
    else:
        doc.comment("sparkfleet appends the per-rank flags (node count and rank, rendezvous address) as sparkrun")
        doc.comment("did; the rendezvous port is sparkrun's init port. The command's own parallel-size, host and")
        doc.comment('port flags stay in args as written; plan sets their values (command_style = "sparkrun").')
    if data.get("description"):
        doc.comment(f"description = {typed(data['description'])}")
    for key, value in metadata.items():
        doc.comment(f"metadata.{key} = {typed(value)}")
    doc.blank()
    doc.set("engine", engine)
    doc.set("name", Path(source).stem)
    doc.set("docker_image", image, "container" if data.get("container") else "sparkrun's default image for "
            f"{runtime} (the recipe names none)")  # fmt: skip
    doc.set("model", model)
    if model_file:
        doc.set("model_file", model_file)
    if revision:
        doc.set("revision", revision, "model_revision (passed to the engine as --revision)")
    elif engine == "llama-cpp" and not model.startswith("/") and not hub_fetch:
        # llama.cpp opens the GGUF by path inside the pinned snapshot of the node's HF cache.
        doc.set("revision", placeholder(f"snapshot revision of {model} in the HF cache"))
    if fields.get("port"):
        doc.set("port", int(fields["port"]))
    rdv = {"vllm-ray": SPARKRUN_RAY_PORT, "llama-cpp": SPARKRUN_RPC_PORT}.get(runtime, SPARKRUN_INIT_PORT)
    doc.set("rendezvous_port", rdv)
    doc.set("required_nodes", nodes, "max(min_nodes, tensor_parallel x pipeline_parallel) as sparkrun counts")
    if engine != "llama-cpp":
        doc.set("tensor_parallel_size", tp)
        if pp > 1:
            doc.set("pipeline_parallel_size", pp)
    if engine == "vllm":
        doc.set("distributed_backend", "ray" if runtime == "vllm-ray" else "mp")
    doc.set("command_style", "sparkrun", "args keep the command's size/model/host/port flags; plan sets their values")
    if executor.get("shm_size"):
        doc.set("shm_size", str(executor["shm_size"]), "executor_config.shm_size")
    if docker:
        doc.set("hf_mount", SPARKRUN_HF_MOUNT, "where sparkrun mounts the node's HF cache (HF_HOME)")
    if tuple(entrypoint) != ENTRYPOINTS[engine]:
        doc.set("entrypoint", entrypoint)
    doc.blank()
    doc.words("args", args)
    lost = [f"{n.key}: {n.detail}" for n in (*notes.not_carried, *notes.not_understood) if _matters(n.key)]
    if lost:
        doc.blank()
        doc.words("not_carried", [([item], None) for item in lost],
                  "what sparkrun would do that this recipe does not: validate/plan warn, --strict refuses")  # fmt: skip
    if env:
        doc.blank()
        doc.table("env")
        for key, (value, note) in env.items():
            doc.set(key, value, note)
    if cache_dir is not None:
        mounts.append((cache_dir, RUNTIME_CACHE_MOUNT, False))
    for host, container, read_only in mounts:
        doc.blank()
        doc.array_table("extra_mounts")
        doc.set("host", host, "executor_config.volumes")
        doc.set("container", container)
        doc.set("read_only", read_only)
    comment_block(doc, "Placeholders to fill in", notes.placeholders)
    comment_block(doc, f"{label} keys not carried over", notes.not_carried)
    comment_block(doc, "NOT UNDERSTOOD (review them)", notes.not_understood)
    return ImportResult(
        recipe_toml=doc.text(),
        placeholders=tuple(notes.placeholders),
        not_carried=tuple(notes.not_carried),
        not_understood=tuple(notes.not_understood),
    )
