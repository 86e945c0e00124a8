"""Renderings of a Plan: the stable JSON contract, and the human view."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sparkfleet.config.secrets import MASK
from sparkfleet.config.sizes import format_size
from sparkfleet.plan.memory import plan_memory_lines
from sparkfleet.plan.model import Plan, RankPlan
from sparkfleet.plan.secret_args import mask_words


def _env_json(rank: RankPlan) -> dict[str, str]:
    return {v.key: (MASK if v.secret else v.value) for v in rank.env}


def masked_argv(words: tuple[str, ...] | None, rank: RankPlan) -> list[str] | None:
    """Argv with any secret value replaced (secrets never go in argv, but recipes can err)."""
    if words is None:
        return None
    secrets = {v.value for v in rank.env if v.secret and len(v.value) >= 4}
    return list(mask_words(words, secrets | set(rank.secret_words)))


def plan_json(plan: Plan) -> dict[str, Any]:
    """The ``plan --json`` contract (stable: other tools and golden tests read it); an imported
    recipe's ``not_carried`` list is added only when it has entries."""
    out: dict[str, Any] = {
        "name": plan.name,
        "title": plan.title,
        "engine": plan.engine,
        "recipe": plan.recipe_source,
        "variant": plan.variant,
        "cluster": plan.cluster_name,
        "endpoint": plan.endpoint,
        "served_model": plan.served_model,
        "launch_order": list(plan.launch_order),
        "ranks": [
            {
                "rank": r.rank,
                "node": r.node.name,
                "host": r.node.host,
                "fabric_ip": r.node.fabric_ip,
                "runtime": r.runtime,
                "image": r.image,
                "argv": masked_argv(r.argv, r),
                "env": _env_json(r),
                "env_sources": {v.key: v.source for v in r.env},
                "mounts": [{"host": m.host, "container": m.container, "read_only": m.read_only} for m in r.mounts],
                "container_name": r.container_name if r.runtime == "docker" else None,
                "container_argv": masked_argv(r.container_argv, r),
                "log": r.log_path if r.runtime == "process" else None,
                "readiness": {
                    "serves_http": r.readiness.serves_http,
                    "health_path": r.readiness.health_path,
                    "ready_log": r.readiness.ready_log,
                    "tcp_port": r.readiness.tcp_port,
                },
                "ports": list(r.ports),
            }
            for r in plan.ranks
        ],
        "staging": [s.json() for s in plan.staging],
        "verify": {
            "expect": list(plan.verify.expect),
            "forbid": list(plan.verify.forbid),
            "smoke_prompt": plan.verify.smoke_prompt,
            "smoke_expect": plan.verify.smoke_expect,
        },
    }
    if plan.not_carried:
        out["not_carried"] = list(plan.not_carried)
    return out


def print_plan(plan: Plan, console: Console) -> None:
    """The human view: a per-node table, then each rank's exact command and env."""
    title = f"{plan.name} — {plan.engine}" + (f" — {plan.title}" if plan.title else "") + f" — variant {plan.variant}"
    table = Table(title=title, title_justify="left")
    for col in ("rank", "node", "host", "fabric ip", "runtime", "image", "ports"):
        table.add_column(col)
    for r in plan.ranks:
        table.add_row(
            str(r.rank), r.node.name, r.node.host, r.node.fabric_ip, r.runtime, r.image or "-",
            ",".join(map(str, r.ports)),
        )  # fmt: skip
    console.print(table)
    console.print(f"endpoint: [bold]{plan.endpoint}[/]  (model {plan.served_model})")
    console.print("launch order: " + " → ".join(f"rank {r}" for r in plan.launch_order))
    if plan.staging:
        st = Table(title="staging", title_justify="left")
        for col in ("id", "kind", "rank", "node", "src", "dst", "min free"):
            st.add_column(col)
        for s in plan.staging:
            st.add_row(
                s.id, s.kind, str(s.rank), s.node, s.src or "-", s.dst,
                format_size(s.min_free) if s.min_free else "-",
            )  # fmt: skip
        console.print(st)
    for r in plan.ranks:
        words = masked_argv(r.container_argv or r.argv, r) or []
        parts: list[Any] = [Text(f"\nrank {r.rank} on {r.node.name}:", style="bold")]
        parts.append(Text(shlex.join(words)))
        for v in r.env:
            shown = MASK if v.secret else v.value
            parts.append(Text(f"  {v.key}={shown}", style="dim") + Text(f"  ({v.source})", style="cyan"))
        for m in r.mounts:
            parts.append(Text(f"  mount {m.host} → {m.container}{' (ro)' if m.read_only else ''}", style="dim"))
        console.print(Group(*parts))
    memory = plan_memory_lines(plan)
    if memory:
        console.print(Group(Text("\nmemory per rank:", style="bold"), *(Text(line) for line in memory)))
