"""The recipe: what to serve, with which engine, image, flags, env, mounts and staging.

A recipe is a ``recipe.toml`` file, or a folder holding one. Loading is pure apart from reading
that file: every mistake becomes a RecipeError naming the file and the key path.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkfleet.config import names
from sparkfleet.config.sizes import Size, parse_size
from sparkfleet.config.templates import KNOWN, unknown_templates
from sparkfleet.config.validation import describe, key_path, shown_error
from sparkfleet.config.variants import BASE, Variant, apply_variant, variant_names
from sparkfleet.errors import RecipeError
from sparkfleet.plan.engines import LaunchSpec, engine_for
from sparkfleet.plan.staging import StagingEntry
from sparkfleet.plan.staging.composed import ComposedModel

RECIPE_FILE = "recipe.toml"
MAX_FILE_CHARS = 4 * 1024 * 1024  # a recipe or cluster file: kilobytes in practice
Engine = Literal["sglang", "vllm", "llama-cpp"]


def _unquote(item: str) -> str:
    return unquote_arg(item)


# An args item: a word, or a shell-quoted string that becomes one word (see unquote_arg).
ArgWord = Annotated[str, AfterValidator(_unquote)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class Mount(_Strict):
    """A host path bind-mounted into the container."""

    host: str
    container: str
    read_only: bool = False


class Verify(_Strict):
    """``[verify]``: what must (and must not) appear in the boot logs, and the smoke test."""

    expect: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ("Traceback (most recent call last)",)
    smoke_prompt: str = "Question: What is 19+23?\nAnswer:"
    smoke_expect: str = "42"
    smoke_max_tokens: int = Field(default=16, ge=1)
    timeout: float = Field(default=1800.0, gt=0)
    # `up` first measures every pair of nodes (doctor --fabric) and refuses below this, either way.
    fabric_min_gbps: float | None = Field(default=None, gt=0)

    @field_validator("expect", "forbid")
    @classmethod
    def _regexes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return value


class Memory(_Strict):
    """``[memory]``: figures the memory plan cannot read from the model or the node."""

    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    weights_per_rank: Size | None = None
    weights_exclude: tuple[str, ...] = ()
    cuda_graph: Size | None = None
    prefill_bytes_per_token2: float | None = Field(default=None, ge=0)
    head_overhead: Size | None = None
    device_memory: Size | None = None


class LoopAbortSpec(_Strict):
    """``[serve] loop_abort``: when the gateway stops a repeating answer (0 turns a rule off)."""

    ngram: int = Field(default=32, ge=0)
    repeats: int = Field(default=4, ge=0)
    token_repeats: int = Field(default=64, ge=0)
    line_repeats: int = Field(default=8, ge=0)


class Serve(_Strict):
    """``[serve]``: what ``sparkfleet watch`` does while the deployment serves (docs/watch.md), and
    the route ``sparkfleet gateway serve`` gives it (docs/gateway.md): output cap, loop abort,
    request defaults and aliases."""

    restart: Literal["no", "on-failure"] = "no"
    max_restarts: int = Field(default=3, ge=0)
    backoff: float = Field(default=10.0, ge=0)  # seconds before the first restart, doubled per retry
    mem_floor: Size | None = None  # a node's MemAvailable under this is an event
    max_new_tokens: int | None = Field(default=None, ge=0)  # None: the gateway's default
    loop_abort: bool | LoopAbortSpec | None = None  # None: the gateway's default; false: off
    request_defaults: dict[str, Any] = Field(default_factory=dict)  # fields added when a request lacks them
    aliases: dict[str, dict[str, Any]] = Field(default_factory=dict)  # another model name, more fields

    def gateway_route(self) -> str | None:
        """The route settings as the stored Plan keeps them (JSON; None when the recipe sets none)."""
        route: dict[str, Any] = {}
        if self.max_new_tokens is not None:
            route["max_new_tokens"] = self.max_new_tokens
        if self.loop_abort is not None:
            route["loop_abort"] = self.loop_abort if isinstance(self.loop_abort, bool) else self.loop_abort.model_dump()
        if self.request_defaults:
            route["fields"] = self.request_defaults
        if self.aliases:
            route["aliases"] = self.aliases
        return json.dumps(route, sort_keys=True) if route else None


class Recipe(_Strict):
    """A deployment recipe (see DESIGN.md "Recipe")."""

    engine: Engine
    name: str | None = None
    model: str
    parent_model: str | None = None
    revision: str | None = None
    model_file: str | None = None
    served_model_name: str | None = None
    docker_image: str | None = None
    docker_image_dir: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    rendezvous_port: int | None = Field(default=None, ge=1, le=65535)
    required_nodes: int = Field(default=1, ge=1, le=4096)
    tensor_parallel_size: int = Field(default=1, ge=1, le=65536)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=4096)
    distributed_backend: Literal["mp", "ray"] = "mp"
    # "sparkrun" (set by `sparkfleet import sparkrun`): args keep the recipe's own parallel-size,
    # host and port flags (llama.cpp: its model flag, host and port) and plan replaces their
    # values; a llama.cpp model with no model_file is fetched by llama-server itself (-hf
    # repo:QUANT). See docs/import-export.md.
    command_style: Literal["sparkfleet", "sparkrun"] = "sparkfleet"
    shm_size: str | None = None
    # Where a container sees the node's Hugging Face cache (HF_HOME); None: the engine's usual
    # /root/.cache/huggingface. sparkrun mounts it at /cache/huggingface, so imports say so.
    hf_mount: str | None = None
    entrypoint: tuple[str, ...] | None = None
    args: tuple[ArgWord, ...] = Field(default=(), max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    extra_mounts: tuple[Mount, ...] = ()
    staging: tuple[StagingEntry, ...] = ()
    composed_model: ComposedModel | None = None
    verify: Verify = Field(default_factory=Verify)
    memory: Memory = Field(default_factory=Memory)
    serve: Serve = Field(default_factory=Serve)
    variants: dict[str, Variant] = Field(default_factory=dict)
    # What `sparkfleet import` could not carry over from the original ("key: why"): validate and
    # plan warn about each, and --strict refuses.
    not_carried: tuple[str, ...] = ()
    source: str = Field(default="", exclude=True)
    variant: str = Field(default=BASE, exclude=True)  # which overlay this recipe is (config/variants.py)

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value

    @field_validator("hf_mount")
    @classmethod
    def _hf_mount(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or value.rstrip("/") == ""):
            raise ValueError("must be an absolute container path other than /")
        return value.rstrip("/") if value is not None else None

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("must name a program (or be left out)")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return names.env(value)

    @field_validator("args", "entrypoint")
    @classmethod
    def _words(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for word in value or ():
            if len(word) > names.MAX_VALUE or "\0" in word:
                raise ValueError(f"an argument of {len(word)} characters (or with a NUL) cannot be passed")
        return value

    def launch_spec(self, args: tuple[str, ...] | None = None) -> LaunchSpec:
        """What the engine adapter reads of this recipe; args as given (rendered for a rank when
        planning), else the recipe's own."""
        return LaunchSpec(
            args=self.args if args is None else args,
            model=self.model,
            served_model_name=self.served_model_name,
            model_file=self.model_file,
            revision=self.revision,
            composed=self.composed_model is not None,
            required_nodes=self.required_nodes,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            distributed_backend=self.distributed_backend,
            command_style=self.command_style,
        )


def unquote_arg(item: str) -> str:
    """An ``args`` item as the engine must receive it.

    Items written as shell-quoted strings (seed 002: a JSON flag wrapped in single quotes, on
    its own line in a multi-line TOML string) reach the engine exactly as a shell would pass
    them: one word, quotes removed. Other items are already words and pass unchanged.
    """
    stripped = item.strip()
    if not stripped or stripped[0] not in "'\"":
        return item
    try:
        words = shlex.split(stripped)
    except ValueError as exc:
        raise ValueError(f"<{stripped}> is not a complete shell-quoted word: {exc}") from None
    if len(words) != 1:
        raise ValueError(f"<{stripped}> holds {len(words)} shell words; write one word per item")
    return words[0]


def recipe_file(path: Path) -> Path:
    """The recipe.toml behind a path that names the file or its folder."""
    path = Path(path)
    if path.is_dir():
        candidate = path / RECIPE_FILE
        if not candidate.is_file():
            raise RecipeError(f"{path}: no {RECIPE_FILE} in this folder")
        return candidate
    if not path.exists():
        raise RecipeError(f"{path}: no such recipe file or folder")
    return path


def deployment_name(path: Path) -> str:
    """The default deployment name: the recipe's folder name, or the file's stem (lowercased,
    characters a deployment name cannot hold as '-')."""
    path = Path(path)
    if path.is_dir():
        stem = path.resolve().name
    else:
        stem = path.resolve().parent.name if path.name == RECIPE_FILE else path.stem
    return names.derived_deployment(stem)


def read_toml(path: Path, error: type[RecipeError] | Any = RecipeError) -> dict[str, Any]:
    """Parse a TOML file; a syntax error names the file and the line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: is not a UTF-8 text file") from None
    if len(text) > MAX_FILE_CHARS:
        raise error(f"{path}: {len(text)} characters is over the {MAX_FILE_CHARS} a recipe or cluster file may hold")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{path}: nested more than {names.MAX_DEPTH} tables/arrays deep") from None
    try:
        names.depth(data)
    except ValueError as exc:
        raise error(f"{path}: {exc}") from None
    return data


def _check_templates(data: Any, path: str = "") -> None:
    if isinstance(data, str):
        bad = unknown_templates(data)
        if bad:
            known = ", ".join("{{" + k + "}}" for k in KNOWN)
            raise ValueError(f"{path}: unknown template {{{{{bad[0]}}}}} (known: {known})")
    elif isinstance(data, dict):
        for key, value in data.items():
            _check_templates(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _check_templates(value, f"{path}[{i}]")


def parse_recipe(data: dict[str, Any], source: str, variant: str = BASE,
                 set_by: dict[str, str] | None = None) -> Recipe:  # fmt: skip
    """Validate recipe data already read from TOML; errors name ``source`` and the key path.

    For a variant's data, ``set_by`` maps each field a variant replaced to that variant, so an
    error in it names ``variants.NAME.key``; any other error says which variant was resolved."""
    where = source if variant == BASE else f"{source} (variant {variant!r})"
    try:
        _check_templates(data)
    except ValueError as exc:
        raise RecipeError(f"{source}: {exc}") from None
    if isinstance(data.get("variants"), dict) and BASE in data["variants"]:
        raise RecipeError(f"{source}: variants.{BASE}: {BASE!r} is the recipe without any overlay; "
                          "give the variant another name")  # fmt: skip
    try:
        recipe = Recipe.model_validate({**data, "source": source, "variant": variant})
    except ValidationError as exc:
        first = tuple(shown_error(exc)["loc"])
        owner = (set_by or {}).get(str(first[0])) if first else None
        if owner is not None:
            detail = describe(exc, Recipe).removeprefix(key_path(first) + ": ")
            raise RecipeError(f"{source}: variants.{owner}.{key_path(first)}: {detail}") from None
        raise RecipeError(f"{where}: {describe(exc, Recipe)}") from None
    problem = engine_for(recipe.engine).check_recipe(recipe.launch_spec())
    if problem:
        raise RecipeError(f"{where}: {problem}")
    return recipe


def apply_sets(data: dict[str, Any], sets: tuple[str, ...], source: str) -> dict[str, Any]:
    """Apply ``--set key.path=value`` overrides; values are read as TOML when they parse."""
    data = {**data}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"--set {item!r}: expected key=value (e.g. port=31000)")
        try:
            value: Any = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        parts = key.strip().split(".")
        target = data
        for part in parts[:-1]:
            child = target.get(part)
            child = {**child} if isinstance(child, dict) else {}
            target[part] = child
            target = child
        target[parts[-1]] = value
    return data


def load_recipe(path: Path | str, sets: tuple[str, ...] = (), variant: str = BASE) -> Recipe:
    """Load and validate a recipe file or folder as variant ``variant`` (``base``: the recipe as
    written), with optional ``--set`` overrides applied on top."""
    file = recipe_file(Path(path))
    source = str(file)
    data = read_toml(file)
    parse_recipe(data, source)  # the recipe as written, variants tables included, is valid first
    set_by: dict[str, str] = {}
    if variant != BASE:
        data, set_by = apply_variant(data, variant, source)
    if sets:
        data = apply_sets(data, sets, source)
    return parse_recipe(data, source, variant, set_by)


def recipe_variants(path: Path | str) -> list[str]:
    """``base`` and the variants a recipe defines, in file order."""
    return variant_names(read_toml(recipe_file(Path(path))))
