"""The gateway's settings: a TOML file (``examples/gateway/gateway.toml`` shows every key), and the
command line's ``--route``, ``--host``, ``--port``, ``--max-new-tokens`` on top. Pure: ``load()``
reads one file and returns frozen values; nothing here opens a socket or the state store."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparkfleet.errors import GatewayError

DEFAULT_PORT = 8400
# The seed profile's figures (.env.tp4.example: DSV41_MAX_NEW_TOKENS, DSV41_LOOP_*).
DEFAULT_MAX_NEW_TOKENS = 32768


@dataclass(frozen=True)
class LoopAbort:
    """When a streamed answer counts as a loop; 0 turns a rule off (all 0: no watching at all).

    ``ngram`` × ``repeats``: the answer ends with ``repeats`` back-to-back copies of a stretch of
    at least ``ngram`` tokens; ``token_repeats``: that many identical tokens in a row;
    ``line_repeats``: that many identical non-blank lines in a row. A "token" is one streamed
    delta, which is one token on every engine sparkfleet runs unless it batches its stream."""

    ngram: int = 32
    repeats: int = 4
    token_repeats: int = 64
    line_repeats: int = 8

    @property
    def enabled(self) -> bool:
        return bool((self.ngram and self.repeats) or self.token_repeats or self.line_repeats)


@dataclass(frozen=True)
class Route:
    """A model name clients ask for, and where its requests go.

    ``targets``: deployment names (from the state store) or plain URLs; empty means every ready
    deployment whose served model is ``upstream_model`` (or ``model``). ``fields`` are added to
    each request that does not set them itself (an alias turning thinking on, a default
    ``reasoning_effort``)."""

    model: str
    targets: tuple[str, ...] = ()
    upstream_model: str | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # 0: no cap
    loop: LoopAbort = LoopAbort()
    fields: tuple[tuple[str, Any], ...] = ()
    # While the model has no ready replica: at most this many requests wait, each at most this many
    # seconds (None: the gateway's hold_queue / hold_wait; hold_wait 0: no waiting, 503 at once).
    hold_queue: int | None = None
    hold_wait: float | None = None


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    auth: bool = True  # False: --no-auth, every request is let in as key "-"
    max_body_bytes: int = 8 * 1024 * 1024
    log_bodies: bool = False
    log_keep_days: float = 30.0
    log_keep_rows: int = 1_000_000
    connect_timeout: float = 5.0
    read_timeout: float = 600.0  # longest silence from an engine mid-answer (prefill of a long prompt)
    client_timeout: float = 60.0  # longest a streaming client may take no bytes before it is dropped
    health_interval: float = 2.0  # how often the state store is re-read and failed replicas probed
    retry_after: int = 5  # seconds, for 503 while no replica is up
    # A model with no ready replica (a restart, a rollback, a switch): requests wait, this many at
    # most, each this long at most (the seed line's engine takes 160-170 s to be ready again).
    hold_queue: int = 256
    hold_wait: float = 300.0
    drain_grace: float = 30.0  # how long a drain lets in-flight requests finish before cancelling them
    tls_cert: str | None = None
    tls_key: str | None = None
    routes: tuple[Route, ...] = ()
    # What a model that no [routes] entry names gets when routes come from the state store alone.
    default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    default_loop: LoopAbort = field(default_factory=LoopAbort)

    def hold_limits(self, route: Route) -> tuple[int, float]:
        """How many requests may wait for route's model, and how long each."""
        queue = self.hold_queue if route.hold_queue is None else route.hold_queue
        return queue, float(self.hold_wait if route.hold_wait is None else route.hold_wait)

    def default_route(self, model: str) -> Route:
        return Route(model=model, max_new_tokens=self.default_max_new_tokens, loop=self.default_loop)


_TOP = {f for f in GatewayConfig.__dataclass_fields__ if f not in ("routes", "default_max_new_tokens", "default_loop")}
_TOP |= {"max_new_tokens", "loop_abort", "routes"}
_ROUTE = {"targets", "upstream_model", "max_new_tokens", "loop_abort", "fields", "aliases", "hold_queue", "hold_wait"}
_LOOP = set(LoopAbort.__dataclass_fields__)
_TYPES: dict[str, type | tuple[type, ...]] = {
    "host": str, "port": int, "auth": bool, "max_body_bytes": int, "log_bodies": bool,
    "log_keep_days": (int, float), "log_keep_rows": int, "connect_timeout": (int, float),
    "read_timeout": (int, float), "client_timeout": (int, float), "health_interval": (int, float),
    "retry_after": int, "hold_queue": int, "hold_wait": (int, float), "drain_grace": (int, float),
    "tls_cert": str, "tls_key": str, "max_new_tokens": int,
}  # fmt: skip


def _check(where: str, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    # bool is an int to Python; a port of `true` is still a mistake.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise GatewayError(f"{where}: {key} = {value!r} is not a {getattr(kind, '__name__', 'number')}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise GatewayError(f"{where}: {key} = {value!r} must not be negative")
    return value


def _unknown(where: str, data: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise GatewayError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(allowed))})")


def _loop(where: str, data: Any, base: LoopAbort) -> LoopAbort:
    if isinstance(data, bool):  # loop_abort = false turns every rule off, true keeps the defaults
        return base if data else LoopAbort(0, 0, 0, 0)
    if not isinstance(data, dict):
        raise GatewayError(f"{where}: loop_abort must be a table or true/false")
    _unknown(f"{where} loop_abort", data, _LOOP)
    return replace(base, **{k: _check(f"{where} loop_abort", k, v, int) for k, v in data.items()})


def parse(data: dict[str, Any], source: str) -> GatewayConfig:
    """A config from a parsed TOML document; errors name ``source`` and the key."""
    _unknown(source, data, _TOP)
    top = {k: _check(source, k, v, _TYPES[k]) for k, v in data.items() if k in _TYPES}
    cap = top.pop("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    loop = _loop(source, data["loop_abort"], LoopAbort()) if "loop_abort" in data else LoopAbort()
    routes: list[Route] = []
    table = data.get("routes", {})
    if not isinstance(table, dict):
        raise GatewayError(f'{source}: routes must be a table of [routes."MODEL"] entries')
    for model, spec in table.items():
        routes += route_table(model, spec, f"{source} [routes.{model!r}]", cap, loop)
    return GatewayConfig(**top, routes=tuple(routes), default_max_new_tokens=cap, default_loop=loop)


def merge_fields(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``, a table in both merged key by key (an alias that turns thinking on
    keeps the route's reasoning_effort in the same chat_template_kwargs)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def route_table(model: str, spec: Any, where: str, cap: int, loop: LoopAbort) -> list[Route]:
    """A ``[routes."MODEL"]`` table (or a recipe's ``[serve]`` route settings) as the route and
    its aliases; ``cap`` and ``loop`` are what it does not set."""
    if not isinstance(spec, dict):
        raise GatewayError(f"{where}: expected a table")
    _unknown(where, spec, _ROUTE)
    targets = spec.get("targets", [])
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
        raise GatewayError(f"{where}: targets must be a list of deployment names or URLs")
    fields = spec.get("fields", {})
    if not isinstance(fields, dict):
        raise GatewayError(f"{where}: fields must be a table of request fields")
    route = Route(
        model=model,
        targets=tuple(targets),
        upstream_model=_check(where, "upstream_model", spec["upstream_model"], str) if "upstream_model" in spec
        else None,
        max_new_tokens=_check(where, "max_new_tokens", spec.get("max_new_tokens", cap), int),
        loop=_loop(where, spec["loop_abort"], loop) if "loop_abort" in spec else loop,
        fields=tuple(sorted(fields.items())),
        hold_queue=_check(where, "hold_queue", spec["hold_queue"], int) if "hold_queue" in spec else None,
        hold_wait=float(_check(where, "hold_wait", spec["hold_wait"], (int, float))) if "hold_wait" in spec
        else None,
    )  # fmt: skip
    aliases = spec.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, dict) for v in aliases.values()):
        raise GatewayError(f'{where}: aliases must be tables of request fields, e.g. [routes.M.aliases."M-x"]')
    # An alias is the same route under another name, its fields over the route's.
    return [route] + [
        replace(route, model=alias, upstream_model=route.upstream_model or model,
                fields=tuple(sorted(merge_fields(fields, extra).items())))
        for alias, extra in aliases.items()
    ]  # fmt: skip


def load(path: Path | None) -> GatewayConfig:
    """The config in ``path`` (None: the defaults)."""
    if path is None:
        return GatewayConfig()
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise GatewayError(f"{path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise GatewayError(f"{path}: not valid TOML ({exc})") from None
    return parse(data, str(path))


def with_overrides(
    config: GatewayConfig, routes: list[str], host: str | None, port: int | None, max_new_tokens: int | None,
    no_auth: bool, no_loop_abort: bool = False,
) -> GatewayConfig:  # fmt: skip
    """The command line's settings over the file's: ``--route MODEL=TARGET`` adds TARGET to MODEL's
    route (creating it with the defaults), the others replace the file's values."""
    by_model = {r.model: r for r in config.routes}
    for item in routes:
        model, sep, target = item.partition("=")
        if not sep or not model or not target:
            raise GatewayError(f"--route {item!r}: expected MODEL=TARGET (a deployment name or a URL)")
        route = by_model.get(model) or config.default_route(model)
        by_model[model] = replace(route, targets=(*route.targets, target))
    if max_new_tokens is not None:
        if max_new_tokens < 0:
            raise GatewayError(f"--max-new-tokens {max_new_tokens}: must be 0 (no cap) or more")
        by_model = {m: replace(r, max_new_tokens=max_new_tokens) for m, r in by_model.items()}
        config = replace(config, default_max_new_tokens=max_new_tokens)
    if no_loop_abort:
        off = LoopAbort(0, 0, 0, 0)
        by_model = {m: replace(r, loop=off) for m, r in by_model.items()}
        config = replace(config, default_loop=off)
    return replace(
        config,
        routes=tuple(by_model.values()),
        host=config.host if host is None else host,
        port=config.port if port is None else port,
        auth=config.auth and not no_auth,
    )
