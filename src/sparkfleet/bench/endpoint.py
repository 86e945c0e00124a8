"""Resolve what to benchmark: a deployment name or a URL, to an Endpoint with model and engine.

The model id and context length come from ``GET /v1/models``; the engine is recognised from the
model card's ``owned_by`` and the engine-specific routes (``/version``, ``/props``,
``/get_server_info``), because each engine needs its own knobs for exact-length decode and
cache-free prefill.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkfleet.bench.auth import HINT
from sparkfleet.bench.chat_api import has_own_template
from sparkfleet.config.secrets import ENGINE_KEY_ENV, auth_headers
from sparkfleet.errors import BenchError
from sparkfleet.plan.flags import flag_value, has_flag
from sparkfleet.state.deployments import Deployments
from sparkfleet.state.store import Store

_HOST_PORT = re.compile(r"^[\w.\-]+:\d+(/.*)?$")
ENGINES = ("vllm", "sglang", "llama-cpp", "llama-cpp-python", "unknown")


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server to benchmark, and what is known about what serves it."""

    base_url: str
    model: str
    engine: str = "unknown"
    engine_version: str | None = None
    deployment: str | None = None
    max_model_len: int | None = None
    # Deployment facts for the stored record: recipe, nodes, parallelism, flags.
    meta: Mapping[str, Any] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False, compare=False)  # never stored, never shown
    # False: the server frames chat in a template the model does not carry (bench.chat_api).
    chat_template: bool | None = None

    def headers(self) -> dict[str, str]:
        """What every request to the server carries (the key, when there is one)."""
        return auth_headers(self.api_key)


def looks_like_url(target: str) -> bool:
    """True for ``http(s)://…`` and bare ``host:port``."""
    if target.startswith(("http://", "https://")):
        return True
    return _HOST_PORT.match(target) is not None


def normalise_url(target: str) -> str:
    """``host:port`` → ``http://host:port``; a trailing ``/v1`` or ``/`` is dropped."""
    url = target if target.startswith(("http://", "https://")) else f"http://{target}"
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# Flags whose values say how a deployment is parallelised (vLLM and SGLang spellings).
PARALLEL_FLAGS = {
    "--tensor-parallel-size": "tp", "-tp": "tp", "--tp": "tp", "--tp-size": "tp",
    "--pipeline-parallel-size": "pp", "-pp": "pp", "--pp": "pp", "--pp-size": "pp",
    "--data-parallel-size": "dp", "-dp": "dp", "--dp": "dp", "--dp-size": "dp",
    "--ep-size": "ep", "--expert-parallel-size": "ep", "--nnodes": "nodes",
}  # fmt: skip


def parallelism(argv: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``{"tp": "4", "nodes": "4", …}`` from an engine command line."""
    out: dict[str, str] = {}
    for key in dict.fromkeys(PARALLEL_FLAGS.values()):
        value = flag_value(argv, *(flag for flag, k in PARALLEL_FLAGS.items() if k == key))
        if value is not None:
            out[key] = value
    if "ep" not in out and has_flag(argv, "--enable-expert-parallel"):
        out["ep"] = "on"
    return out


_SECRET_FLAG = re.compile(r"(key|token|password|secret)", re.IGNORECASE)


def masked_flags(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The command line with the value of any credential-like flag (``--api-key``) replaced."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag, eq, _ = word.partition("=")
        if flag.startswith("-") and _SECRET_FLAG.search(flag):
            out.append(f"{flag}=***" if eq else word)
            hide_next = not eq
        else:
            out.append(word)
    return out


def deployment_endpoint(name: str, store: Store | None = None) -> tuple[str, str, dict[str, Any]]:
    """The URL, served model and metadata of a deployment recorded by ``sparkfleet up``."""
    store = store or Store()
    record = Deployments(store).require(name, "`sparkfleet status` lists them; or give a URL")
    if record.status != "ready":
        raise BenchError(f"deployment {name!r} is {record.status}, not ready; bench it once `sparkfleet up` is done")
    head = next((r for r in record.ranks if r.rank == 0), None)
    meta: dict[str, Any] = {
        "recipe": record.recipe,
        "cluster": record.cluster,
        "nodes": [r.node.name for r in sorted(record.ranks, key=lambda r: r.rank)],
        "parallelism": parallelism(head.argv) if head else {},
        # The head's command line: flags only, never env (secrets are not stored with ranks).
        "flags": masked_flags(head.argv) if head else [],
        "image": head.image if head else None,
    }
    return normalise_url(record.endpoint), record.served_model, meta


def deployment_key(name: str, store: Store | None = None) -> str | None:
    """The API key a deployment's rank 0 was started with (its engine's variable, read back from
    the rank's private env file on its node), or None: when its stored plan sets no such
    variable, nothing is asked of the node; when the node cannot be read, the server's refusal
    says what to pass."""
    from sparkfleet.apply.observe import rank_secrets
    from sparkfleet.errors import SparkfleetError
    from sparkfleet.nodes.transport import transport_for

    records = Deployments(store or Store())
    stored = records.stored_plan(name)
    head_plan = next((r for r in stored.ranks if r.rank == 0), None) if stored else None
    if head_plan is None or not any(e.key in ENGINE_KEY_ENV for e in head_plan.env):
        return None
    record = records.get(name)
    head = next((r for r in record.ranks if r.rank == 0), None) if record else None
    if head is None:
        return None
    try:
        transport = transport_for(head.node)
        try:
            secrets = rank_secrets(head, transport)
        finally:
            transport.close()
    except SparkfleetError:
        return None
    return next((secrets[k] for k in ENGINE_KEY_ENV if secrets.get(k)), None)


def resolve_endpoint(
    name_or_url: str,
    model: str | None = None,
    *,
    store: Store | None = None,
    timeout: float = 10.0,
    max_model_len: int | None = None,
    api_key: str | None = None,
) -> Endpoint:
    """Resolve NAME|URL and probe the server; BenchError when it does not answer like an LLM server.
    api_key: the caller's (bench.auth.api_key_for); without it, a deployment's own."""
    meta: dict[str, Any] = {}
    deployment: str | None = None
    if looks_like_url(name_or_url):
        base_url = normalise_url(name_or_url)
    else:
        base_url, served, meta = deployment_endpoint(name_or_url, store)
        deployment = name_or_url
        model = model or served
        api_key = api_key or deployment_key(name_or_url, store)
    with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client:
        cards = _models(client, base_url, api_key is not None)
        card = _pick(cards, model, base_url)
        engine, version = detect_engine(client, base_url, card)
        ctx = max_model_len or _context_length(client, base_url, card, engine)
        own = has_own_template(_get_json(client, f"{base_url}/props")) if engine == "llama-cpp" else None
    return Endpoint(
        base_url=base_url,
        model=str(card.get("id") or model),
        engine=engine,
        engine_version=version,
        deployment=deployment,
        max_model_len=ctx,
        meta=meta,
        api_key=api_key,
        chat_template=own,
    )


def _get_json(client: httpx.Client, url: str) -> Any | None:
    try:
        response = client.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _models(client: httpx.Client, base_url: str, keyed: bool = False) -> list[dict[str, Any]]:
    url = f"{base_url}/v1/models"
    try:
        response = client.get(url)
    except httpx.ConnectError as exc:
        raise BenchError(f"endpoint {base_url} is not answering ({exc}); is the server up?") from exc
    except httpx.TimeoutException as exc:
        raise BenchError(f"endpoint {base_url} did not answer GET /v1/models in time") from exc
    except httpx.HTTPError as exc:
        raise BenchError(f"endpoint {base_url}: GET /v1/models failed: {exc}") from exc
    if response.status_code in (401, 403):
        if keyed:
            raise BenchError(f"endpoint {base_url} refused the API key given (HTTP {response.status_code})")
        raise BenchError(f"endpoint {base_url} wants an API key (HTTP {response.status_code}): {HINT}")
    if response.status_code != 200:
        raise BenchError(f"endpoint {base_url}: GET /v1/models returned HTTP {response.status_code}")
    try:
        cards = response.json().get("data") or []
    except (ValueError, AttributeError) as exc:
        raise BenchError(f"endpoint {base_url}: GET /v1/models did not return an OpenAI model list") from exc
    if not cards:
        raise BenchError(f"endpoint {base_url} serves no model (GET /v1/models is empty)")
    return [c for c in cards if isinstance(c, dict)]


def _pick(cards: list[dict[str, Any]], model: str | None, base_url: str) -> dict[str, Any]:
    if model is None:
        return cards[0]
    for card in cards:
        if card.get("id") == model:
            return card
    names = ", ".join(str(c.get("id")) for c in cards)
    raise BenchError(f"endpoint {base_url} does not serve model {model!r} (it serves: {names})")


def detect_engine(client: httpx.Client, base_url: str, card: Mapping[str, Any]) -> tuple[str, str | None]:
    """(engine, version) from the model card and engine-specific routes."""
    owner = str(card.get("owned_by") or "").lower()
    version = _get_json(client, f"{base_url}/version")
    version_str = str(version.get("version")) if isinstance(version, dict) and "version" in version else None
    if owner == "vllm":
        return "vllm", version_str
    if owner == "sglang":
        info = _get_json(client, f"{base_url}/get_server_info")
        return "sglang", version_str or (str(info.get("version")) if isinstance(info, dict) else None)
    if owner == "llamacpp":
        props = _get_json(client, f"{base_url}/props")
        build = props.get("build_info") if isinstance(props, dict) else None
        return "llama-cpp", str(build) if build else None
    if owner == "me":  # llama-cpp-python's server writes this literal
        return "llama-cpp-python", None
    return "unknown", version_str


def _context_length(client: httpx.Client, base_url: str, card: Mapping[str, Any], engine: str) -> int | None:
    for key in ("max_model_len", "context_length", "max_context_length"):
        value = card.get(key)
        if isinstance(value, int) and value > 0:
            return value
    meta = card.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("n_ctx_train"), int):
        props = _get_json(client, f"{base_url}/props") if engine == "llama-cpp" else None
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
            return int(settings["n_ctx"])
    return None
