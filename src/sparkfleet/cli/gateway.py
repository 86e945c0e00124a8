"""``sparkfleet gateway serve | key create/list/revoke | log``: the OpenAI front door (docs/gateway.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from sparkfleet.cli.app import group
from sparkfleet.cli.console import console, err_console, table
from sparkfleet.cli.extras import require_extra
from sparkfleet.cli.options import JsonOpt

gateway_app = group("An OpenAI-compatible front door: keys, output cap, loop abort, routing.")
key_app = group("Create, list and revoke the gateway's API keys.")
gateway_app.add_typer(key_app, name="key")
COMMANDS = {"gateway": gateway_app}

_NEEDS = ("uvicorn", "prometheus_client", "aiohttp")


@gateway_app.command("serve")
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", help="gateway.toml (examples/gateway/ shows every key).")
    ] = None,
    route: Annotated[
        list[str] | None, typer.Option("--route", help="MODEL=TARGET: a deployment name or a URL (repeatable).")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (default 8400; 0: any free port).")] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option("--max-new-tokens", help="Output cap for every route (0: none; default 32768).")
    ] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve without API keys, also off loopback.")] = False,
    no_loop_abort: Annotated[
        bool,
        typer.Option(
            "--no-loop-abort", help="Never stop a repeating answer (e.g. a benchmark of a model that repeats)."
        ),
    ] = False,
) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /health, /metrics."""
    require_extra("gateway", _NEEDS, "the gateway")
    from sparkfleet.gateway.config import load, with_overrides
    from sparkfleet.gateway.server import serve as run
    from sparkfleet.state.store import state_dir

    settings = with_overrides(load(config), route or [], host, port, max_new_tokens, no_auth, no_loop_abort)
    state_db = state_dir() / "state.db"

    def announce(url: str) -> None:
        routes = ", ".join(r.model for r in settings.routes) or "every ready deployment in the state store"
        auth = "API keys" if settings.auth else "no keys (--no-auth)"
        console.print(f"gateway on [bold]{url}[/] ({auth}; routes: {routes}); Ctrl-C stops it", soft_wrap=True)

    from sparkfleet.cli.dashboard import bind, is_loopback

    run(settings, state_db, is_loopback(settings.host), bind, announce)


@key_app.command("create")
def key_create(
    name: Annotated[str, typer.Argument(help="A name for the key (shown in logs and metrics; the key never is).")],
    models: Annotated[
        str | None, typer.Option("--models", help="Comma-separated models it may use (default: all).")
    ] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", help="Tokens (prompt + completion) per minute.")] = None,
    expires: Annotated[
        str | None, typer.Option("--expires", help="A duration (30d, 12h) or a date (2027-01-31).")
    ] = None,
) -> None:
    """Create a key and print it once: only its hash is kept."""
    from sparkfleet.gateway.keys import KeyStore, parse_expiry

    chosen = tuple(m.strip() for m in models.split(",") if m.strip()) if models else None
    until = parse_expiry(expires, time.time()) if expires else None
    key, value = KeyStore().create(name, chosen, rpm, tpm, until)
    err_console.print(f"key {key.name!r} ({key.id}) created; it is shown once, here:")
    # The value alone on stdout, so `KEY=$(sparkfleet gateway key create NAME)` works.
    typer.echo(value)


@key_app.command("list")
def key_list(as_json: JsonOpt = False) -> None:
    """Every key: name, id, models, limits, expiry, state (never the key itself)."""
    from sparkfleet.gateway.keys import KeyStore

    now = time.time()
    rows: list[dict[str, Any]] = [
        {"name": k.name, "id": k.id, "models": list(k.models) if k.models else None, "rpm": k.rpm, "tpm": k.tpm,
         "expires": k.expires, "created": k.created, "state": k.state(now)}
        for k in KeyStore().all()
    ]  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    keys = table(None, "name", "id", "models", "rpm", "tpm", "expires", "state")
    for r in rows:
        keys.add_row(r["name"], r["id"], ",".join(r["models"] or ["*"]), str(r["rpm"] or "-"), str(r["tpm"] or "-"),
                      _when(r["expires"]), r["state"])  # fmt: skip
    console.print(keys)


@key_app.command("revoke")
def key_revoke(name: Annotated[str, typer.Argument(help="The key's name (or id).")]) -> None:
    """Revoke a key; a running gateway refuses it from its next request on."""
    from sparkfleet.gateway.keys import KeyStore

    for k in KeyStore().revoke(name):
        console.print(f"revoked key {k.name!r} ({k.id})")


@gateway_app.command("log")
def request_log(
    since: Annotated[str | None, typer.Option("--since", help="How far back: 10m, 2h, 1d (default: all).")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows (the newest).")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """The gateway's request log: one row per request, no prompt or answer unless log_bodies."""
    from sparkfleet.gateway import db
    from sparkfleet.gateway.keys import parse_since

    start = parse_since(since, time.time()) if since else None
    rows = db.read_log(db.connect(), start, limit)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    log = table(None, "time", "request", "key", "model", "deployment", "status", "tokens", "ttft", "e2e", "held",
                "finish", "cap", "loop")  # fmt: skip
    for r in rows:
        tokens = f"{r['prompt_tokens'] or 0}+{r['completion_tokens'] or 0}"
        log.add_row(_when(r["time"]), r["request_id"], r["key_name"] or "-", r["model"] or "-",
                      r["deployment"] or "-", str(r["status"]), tokens, _secs(r["ttft"]), _secs(r["e2e"]),
                      _secs(r.get("held")) if r.get("held") else "", r["finish_reason"] or "-",
                      "yes" if r["clamped"] else "", "ABORT" if r["loop_aborted"] else "")  # fmt: skip
    console.print(log)


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp else "-"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"
