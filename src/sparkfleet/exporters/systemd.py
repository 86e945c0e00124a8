"""``export systemd NAME``: a unit that runs ``sparkfleet watch NAME`` (and so its restart
policy) as a service, started at boot and restarted when the watcher itself dies; ``export
systemd gateway``: the same for ``sparkfleet gateway serve``.

What the unit pins, and why:
- the state dir of the user who exported it (``Environment=SPARKFLEET_STATE_DIR``), so the
  service sees the same deployment record and stored Plan;
- the interpreter that runs this sparkfleet (``ExecStart`` is absolute: systemd has no venv);
- ``KillMode=process``: stopping the service stops the watcher only. On a ``local`` cluster a
  restart started the ranks from inside the unit's cgroup, and the default (control-group)
  would kill the deployment with its watcher;
- ``RestartPreventExitStatus=1 2``: a watcher that gave up (1) or was given a deployment that
  does not exist (2) stays stopped; a crash or a reboot brings it back.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class UnitOptions:
    """How the unit runs: as which user (system unit) or as a user unit, and how often it polls."""

    state_dir: str
    interval: float = 10.0
    user: str | None = None  # system units: run as this user (its ~/.ssh reaches the nodes)
    user_unit: bool = False  # systemctl --user: no User=, wanted by default.target
    python: str = sys.executable


def unit_name(deployment: str) -> str:
    """The unit's file name (systemd allows [A-Za-z0-9:_.-] in names; other characters escaped)."""
    safe = "".join(c if c.isalnum() or c in ":_.-" else f"\\x{ord(c):02x}" for c in deployment)
    return f"sparkfleet-watch-{safe}.service"


def _quote(value: str) -> str:
    """A value for Environment=/ExecStart=: systemd reads C-style double quotes, and % is its
    specifier character."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"' if any(c.isspace() for c in value) or escaped != value else value


def _unit(opts: UnitOptions, header: list[str], description: str, argv: list[str], service: list[str]) -> str:
    """A unit file: header comments, then [Unit], [Service] running argv with the state dir, and
    [Install]; ``service`` adds the lines that differ (kill mode, restart policy)."""
    lines = [*header, "[Unit]", f"Description={description}", "Wants=network-online.target",
             "After=network-online.target", "", "[Service]", "Type=simple"]  # fmt: skip
    if opts.user and not opts.user_unit:
        lines.append(f"User={opts.user}")
    lines += [
        f"Environment={_quote('SPARKFLEET_STATE_DIR=' + opts.state_dir)}",
        "Environment=PYTHONUNBUFFERED=1",
        "ExecStart=" + " ".join(_quote(w) for w in argv),
        *service,
        "",
        "[Install]",
        f"WantedBy={'default.target' if opts.user_unit else 'multi-user.target'}",
    ]
    return "\n".join(lines) + "\n"


def systemd_unit(deployment: str, opts: UnitOptions) -> str:
    """The unit file's text."""
    argv = [opts.python, "-m", "sparkfleet.cli.main", "watch", deployment, "--interval", f"{opts.interval:g}",
            "--quiet"]  # fmt: skip
    header = [
        f"# Written by `sparkfleet export systemd {shlex.quote(deployment)}`: runs `sparkfleet watch` for the",
        "# deployment (its [serve] restart policy included) across reboots of this controller.",
        f"#   install: copy to {'~/.config/systemd/user/' if opts.user_unit else '/etc/systemd/system/'}"
        f"{unit_name(deployment)}, then",
        f"#   systemctl {'--user ' if opts.user_unit else ''}daemon-reload && "
        f"systemctl {'--user ' if opts.user_unit else ''}enable --now {unit_name(deployment)}",
    ]
    service = ["KillMode=process", "Restart=on-failure", "RestartSec=30", "RestartPreventExitStatus=1 2"]
    return _unit(opts, header, f"sparkfleet watch {deployment.replace('%', '%%')}", argv, service)


GATEWAY_UNIT = "sparkfleet-gateway.service"


def gateway_unit(opts: UnitOptions, config: str | None) -> str:
    """The unit of ``sparkfleet gateway serve`` (``config``: an absolute gateway.toml, or None for the
    defaults). Its state dir is the exporter's: the keys, the request log and the deployments it
    routes to. A mistake in the config (exit 2) keeps it stopped; a crash or a reboot brings it back."""
    argv = [opts.python, "-m", "sparkfleet.cli.main", "gateway", "serve", *(["--config", config] if config else [])]
    where = "~/.config/systemd/user/" if opts.user_unit else "/etc/systemd/system/"
    ctl = "systemctl --user" if opts.user_unit else "systemctl"
    header = [
        "# Written by `sparkfleet export systemd gateway`: runs the gateway (docs/gateway.md) across reboots.",
        f"#   install: copy to {where}{GATEWAY_UNIT}, then {ctl} daemon-reload && {ctl} enable --now {GATEWAY_UNIT}",
    ]
    # systemd's SIGTERM: uvicorn finishes the answers in flight, the request log is flushed, and
    # the process ends by that signal, which systemd counts as a clean stop.
    return _unit(opts, header, "sparkfleet gateway", argv, ["Restart=on-failure", "RestartSec=5",
                                                             "RestartPreventExitStatus=2"])  # fmt: skip
