"""sparkrun's own rules, as data and small pure functions: which ``defaults`` keys become which
engine flags, how ``{key}`` templates render, what ``{config.*}``/``{launch.*}`` mean in ``env``,
and how many nodes a recipe asks for.

Read from sparkrun's source (Apache-2.0, spark-arena/sparkrun):

* release 0.2.40, commit 0041b8f8fc13 (``main``): ``runtimes/sglang.py`` ``_SGLANG_FLAG_MAP`` /
  ``_SGLANG_BOOL_FLAGS``, ``runtimes/_vllm_common.py`` ``VLLM_FLAG_MAP`` / ``VLLM_BOOL_FLAGS``,
  ``runtimes/base.py`` ``build_flags_from_map`` and ``_augment_served_model_name``,
  ``runtimes/*.py`` ``_build_base_command`` (``tensor_parallel`` written first, by hand);
* the development line that introduced ``min_sparkrun_version`` (0.4.0): ``core/env_templates.py``
  (``{config.NAME}``/``{launch.NAME}`` in ``env``, single pass, ``{{`` escapes), ``utils/text.py``
  ``render_template`` (braces that are not a ``{key}`` placeholder are literal; ``{{``/``}}``
  collapse to one brace when the template uses them), and the larger flag maps of
  ``runtimes/sglang.py`` / ``runtimes/_vllm_common.py`` there.

``build_flags_from_map`` walks the *flag map*: a key only in the boolean set (vLLM's
``enable_auto_tool_choice`` in 0.2.40) is never emitted, and a key in neither is dropped. Both
are mirrored here on purpose: the import must start the server sparkrun would start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The first sparkrun version whose rules differ from 0.2.40's (env templates, larger maps).
TEMPLATES_VERSION = (0, 4, 0)

_SGLANG_0_2 = {
    "port": "--port", "host": "--host", "tensor_parallel": "--tp-size", "pipeline_parallel": "--pp-size",
    "gpu_memory_utilization": "--mem-fraction-static", "max_model_len": "--context-length",
    "max_num_seqs": "--max-running-requests", "served_model_name": "--served-model-name", "dtype": "--dtype",
    "quantization": "--quantization", "trust_remote_code": "--trust-remote-code",
    "chunked_prefill": "--chunked-prefill-size", "kv_cache_dtype": "--kv-cache-dtype",
    "tokenizer_path": "--tokenizer-path", "speculative_draft_model_path": "--speculative-draft-model-path",
    "api_key": "--api-key",
}  # fmt: skip
_SGLANG_0_4 = {
    **_SGLANG_0_2,
    "data_parallel": "--dp-size", "enable_dp_attention": "--enable-dp-attention",
    "attention_backend": "--attention-backend", "load_format": "--load-format",
    "reasoning_parser": "--reasoning-parser", "tool_call_parser": "--tool-call-parser",
    "mm_feature_transport": "--mm-feature-transport", "speculative_algorithm": "--speculative-algorithm",
    "speculative_draft_model_revision": "--speculative-draft-model-revision",
    "speculative_num_steps": "--speculative-num-steps", "speculative_eagle_topk": "--speculative-eagle-topk",
    "speculative_num_draft_tokens": "--speculative-num-draft-tokens",
    "speculative_dspark_block_size": "--speculative-dspark-block-size", "cuda_graph_bs": "--cuda-graph-bs",
    "cuda_graph_max_bs": "--cuda-graph-max-bs", "cuda_graph_max_bs_decode": "--cuda-graph-max-bs-decode",
    "torch_compile_max_bs": "--torch-compile-max-bs", "num_continuous_decode_steps": "--num-continuous-decode-steps",
    "fp8_gemm_backend": "--fp8-gemm-backend", "fp4_gemm_backend": "--fp4-gemm-backend",
    "moe_runner_backend": "--moe-runner-backend", "mamba_ssm_dtype": "--mamba-ssm-dtype",
    "mamba_full_memory_ratio": "--mamba-full-memory-ratio", "enable_torch_compile": "--enable-torch-compile",
    "disable_radix_cache": "--disable-radix-cache", "disable_prefill_cuda_graph": "--disable-prefill-cuda-graph",
}  # fmt: skip
_VLLM_0_2 = {
    "port": "--port", "host": "--host", "tensor_parallel": "-tp", "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs", "served_model_name": "--served-model-name", "dtype": "--dtype",
    "quantization": "--quantization", "enforce_eager": "--enforce-eager",
    "enable_prefix_caching": "--enable-prefix-caching", "trust_remote_code": "--trust-remote-code",
    "distributed_executor_backend": "--distributed-executor-backend", "pipeline_parallel": "-pp",
    "data_parallel": "--data-parallel-size", "kv_cache_dtype": "--kv-cache-dtype",
    "otlp_traces_endpoint": "--otlp-traces-endpoint", "api_key": "--api-key",
}  # fmt: skip
_VLLM_0_4 = {
    **_VLLM_0_2,
    "attention_backend": "--attention-backend", "load_format": "--load-format",
    "reasoning_parser": "--reasoning-parser", "tool_call_parser": "--tool-call-parser",
    "chat_template": "--chat-template", "speculative_config": "--speculative-config",
    "tokenizer_mode": "--tokenizer-mode", "mm_encoder_tp_mode": "--mm-encoder-tp-mode", "block_size": "--block-size",
    "seed": "--seed", "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "enable_chunked_prefill": "--enable-chunked-prefill", "async_scheduling": "--async-scheduling",
}  # fmt: skip
_SGLANG_BOOLS_0_2 = frozenset({"trust_remote_code", "enable_torch_compile", "disable_radix_cache"})
_SGLANG_BOOLS_0_4 = _SGLANG_BOOLS_0_2 | {"enable_dp_attention", "disable_prefill_cuda_graph"}
_VLLM_BOOLS_0_2 = frozenset({"enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice"})
_VLLM_BOOLS_0_4 = _VLLM_BOOLS_0_2 | {"enable_chunked_prefill", "async_scheduling"}


@dataclass(frozen=True)
class FlagRules:
    """One sparkrun version's command-less rules for one engine."""

    flags: Mapping[str, str]
    bools: frozenset[str]
    # Keys the runtime writes itself (tensor_parallel first) or leaves to the cluster launch.
    skip: frozenset[str]
    version: str


_LLAMA_CPP = {
    "port": "--port", "host": "--host", "ctx_size": "--ctx-size", "n_gpu_layers": "--n-gpu-layers",
    "parallel": "--parallel", "threads": "--threads", "chat_template": "--chat-template",
    "reasoning_format": "--reasoning-format", "split_mode": "--split-mode", "served_model_name": "--alias",
    "api_key": "--api-key", "flash_attn": "--flash-attn", "cont_batching": "--cont-batching",
    "no_webui": "--no-webui", "jinja": "--jinja",
}  # fmt: skip
# llama_cpp.py injects split_mode=layer when the recipe sets none.
LLAMA_CPP_DEFAULTS = {"split_mode": "layer"}


def flag_rules(engine: str, ray: bool, min_version: tuple[int, ...] | None) -> FlagRules:
    """The flag map sparkrun applies for this engine at the recipe's minimum version."""
    new = min_version is not None and min_version >= TEMPLATES_VERSION
    version = "0.4.0 (development line)" if new else "0.2.40 (0041b8f)"
    if engine == "llama-cpp":
        bools = frozenset({"flash_attn", "cont_batching", "no_webui", "jinja"})
        return FlagRules(_LLAMA_CPP, bools, frozenset(), version)
    if engine == "sglang":
        # 0.4: --dp-size is emitted by the launch, not the map (legal only inside one launch).
        skip = {"tensor_parallel", "data_parallel"} if new else {"tensor_parallel"}
        return FlagRules(_SGLANG_0_4 if new else _SGLANG_0_2, _SGLANG_BOOLS_0_4 if new else _SGLANG_BOOLS_0_2,
                         frozenset(skip), version)  # fmt: skip
    # vllm-distributed always skips the backend key; vllm-ray skips it in cluster mode and adds
    # "ray" itself. Either way sparkfleet's distributed_backend field carries it.
    del ray
    return FlagRules(_VLLM_0_4 if new else _VLLM_0_2, _VLLM_BOOLS_0_4 if new else _VLLM_BOOLS_0_2,
                     frozenset({"tensor_parallel", "distributed_executor_backend"}), version)  # fmt: skip


def parse_bool(value: Any) -> bool:
    """scitrera_app_framework's ext_parse_bool, as build_flags_from_map uses it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    return str(value).strip().lower() in ("true", "yes", "y", "1", "on", "t")


def flag_words(defaults: Mapping[str, Any], rules: FlagRules) -> tuple[list[str], list[str]]:
    """(flags sparkrun writes for these defaults, keys it drops), in sparkrun's order: the map's."""
    words: list[str] = []
    for key, flag in rules.flags.items():
        if key in rules.skip or defaults.get(key) is None:
            continue
        value = defaults[key]
        if key in rules.bools:
            if parse_bool(value):
                words.append(flag)
        else:
            words += [flag, str(value)]
    dropped = [k for k in defaults if k not in rules.flags and k != "model"]
    return words, dropped


def parse_version(text: Any, where: str) -> tuple[int, ...]:
    """A ``min_sparkrun_version`` as numbers; sparkrun refuses anything but a plain version."""
    if not isinstance(text, str) or not re.fullmatch(r"\s*\d+(\.\d+)*([._-]?[A-Za-z0-9]+)*\s*", text):
        raise ValueError(f'{where}: must be a version string such as "0.4.0" (not a range), got {text!r}')
    return tuple(int(p) for p in re.findall(r"\d+", text.split("-")[0])[:3])


# --- {key} templates (utils/text.py render_template) -------------------------------------------

_L, _R = "\x00", "\x01"
_SPAN = re.compile(r"\{[^{}]*\}")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def _mask(text: str, escapes: bool) -> str:
    """Hide every brace that is not part of a ``{key}`` span (so JSON stays literal)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "{":
            if text.startswith("{{", i):
                out.append(_L if escapes else _L * 2)
                i += 2
                continue
            m = _SPAN.match(text, i)
            if m:
                out.append(m.group())
                i = m.end()
                continue
            out.append(_L)
        elif ch == "}":
            if text.startswith("}}", i):
                out.append(_R if escapes else _R * 2)
                i += 2
                continue
            out.append(_R)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def render_template(template: str, values: Mapping[str, Any]) -> tuple[str, list[str]]:
    """sparkrun's command rendering: ``{key}`` from values, iterated (at most 10 passes);
    unknown placeholders stay; with any ``{{`` in the template, ``{{``/``}}`` are one literal brace.
    Returns the text and the placeholders left unresolved."""
    text = _mask(template, escapes="{{" in template)
    for _ in range(10):
        new = _PLACEHOLDER.sub(lambda m: _value(values, m.group(1), m.group(0)), text)
        if new == text:
            break
        text = new
    # Only identifier-like spans are placeholders a user meant; a JSON object is literal text.
    left = sorted({m for m in _PLACEHOLDER.findall(text) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", m)})
    return text.replace(_L, "{").replace(_R, "}"), left


_VPD_ARG = re.compile(r"\{(.*?)\}")


def render_vpd(template: str, values: Mapping[str, Any], collapse_escapes: bool = False) -> tuple[str, list[str]]:
    """sparkrun 0.2/0.3's command rendering (``Recipe.render_command``): vpd's ``arg_substitute``
    until nothing changes — each ``{`` up to the next ``}`` is a key once its outer braces are
    stripped, replaced when the defaults have it and left as written otherwise (so a ``{key}``
    inside a JSON object is not reached, and ``{{`` stays doubled); a ``recipe_version: "1"``
    recipe then has ``{{``/``}}`` collapsed. Returns the text and the identifier-like
    placeholders left unresolved."""

    def one(m: re.Match[str]) -> str:
        value = values.get(m.group().strip("}{"))
        return m.group() if value is None else str(value)

    text, last = template, None
    for _ in range(50):
        if text == last:
            break
        last, text = text, _VPD_ARG.sub(one, text)
    if collapse_escapes:
        text = text.replace("{{", "{").replace("}}", "}")
    text = re.sub(r"\\ +\n", "\\\n", text)
    left = sorted({m for m in _PLACEHOLDER.findall(text) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", m)})
    return text, left


def _value(values: Mapping[str, Any], key: str, original: str) -> str:
    value = values.get(key)
    return original if value is None else str(value)


# --- env templates (core/env_templates.py) -----------------------------------------------------

LAUNCH_FIELDS = frozenset({"model_path", "model_revision", "num_nodes", "node_rank", "node_host", "cluster_id",
                           "runtime_cache_dir"})  # fmt: skip
_OPEN = re.compile(r"(?<![$\{])(?P<braces>\{+)(?:config|launch)\.")
_FIELD = re.compile(r"(config|launch)\.([A-Za-z_][A-Za-z0-9_]*)")


def env_parts(value: str) -> list[tuple[str, str | None]]:
    """(literal, ``config.X``/``launch.X`` or None) pieces of an env value; an escaped token
    (``{{launch.x}}``) is literal with one brace pair. A malformed token is a ValueError."""
    parts: list[tuple[str, str | None]] = []
    cursor = 0
    for m in _OPEN.finditer(value):
        if m.start() < cursor:
            continue
        start, width = m.start(), len(m["braces"])
        end = value.find("}", m.end())
        if end < 0 or "{" in value[m.end() : end]:
            if width > 1:
                continue
            raise ValueError(f"unclosed template {value[start:]!r}")
        stop = end
        while stop < len(value) and value[stop] == "}":
            stop += 1
        closing = min(width, stop - end)
        stop = end + closing
        parts.append((value[cursor:start], None))
        name = value[start + width : end]
        if width > 1:
            parts.append((value[start + 1 : stop - 1] if closing == width else value[start + 1 : stop], None))
        else:
            field = _FIELD.fullmatch(name)
            if field is None:
                raise ValueError(f"{{{name}}}: env accepts only {{config.NAME}} or {{launch.NAME}} without formatting")
            if field[1] == "launch" and field[2] not in LAUNCH_FIELDS:
                known = ", ".join(sorted(LAUNCH_FIELDS))
                raise ValueError(f"{{{name}}}: unknown launch field (sparkrun knows {known})")
            parts.append(("", name))
        cursor = stop
    parts.append((value[cursor:], None))
    return parts


def required_nodes(tp: int, pp: int, min_nodes: int) -> int:
    """sparkrun's node count on one-GPU Sparks: ``compute_required_nodes`` trims the hosts to
    tp × pp (× dp, which sparkfleet does not carry) and validation refuses fewer than
    ``min_nodes``; so ``tensor_parallel: 2`` alone is two nodes, not one node with TP 2."""
    return max(tp * pp, min_nodes)
