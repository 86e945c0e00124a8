"""Entry point: builds the typer app from the command modules and maps errors to exit codes.

Command modules import only typer and rich at import time; heavy libraries are imported inside
the commands so `sparkfleet plan` starts fast.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
from typing import NoReturn

import typer
from rich.markup import escape

from sparkfleet.cli.app import group
from sparkfleet.errors import SparkfleetError, UsageError

# Each module's COMMANDS maps a command name to its function or its typer group; keyed here by
# those names, so a run imports only the module it needs.
COMMAND_MODULES = {
    "sparkfleet.cli.recipes": ("validate", "plan"),
    "sparkfleet.cli.lifecycle": ("up", "down", "rollback", "status", "logs"),
    "sparkfleet.cli.watch": ("watch",),
    "sparkfleet.cli.stage": ("stage",),
    "sparkfleet.cli.init": ("init",),
    "sparkfleet.cli.doctor": ("doctor",),
    "sparkfleet.cli.image": ("image",),
    "sparkfleet.cli.bench": ("bench",),
    "sparkfleet.cli.ab": ("ab",),
    "sparkfleet.cli.evals": ("eval",),
    "sparkfleet.cli.imports": ("import",),
    "sparkfleet.cli.export": ("export",),
    "sparkfleet.cli.dashboard": ("dashboard",),
    "sparkfleet.cli.gateway": ("gateway",),
    "sparkfleet.cli.switch": ("switch",),
}
# What `sparkfleet --help` says of each command, in its order. The listing is built from these
# lines alone: importing the 13 command modules and letting typer read 37 signatures would take
# longer than the whole answer may.
SUMMARIES = {
    "validate": "Check a recipe and every variant it defines.",
    "plan": "Show what `up` will do on every node.",
    "up": "Start a deployment; done only when it really serves.",
    "down": "Stop every rank of a deployment this controller started.",
    "rollback": "Bring back the last configuration that passed its gate.",
    "switch": "Replace a deployment behind the gateway, losing no request.",
    "status": "Per rank: node, state, uptime, health.",
    "logs": "Every rank's log, each line prefixed by rank and node.",
    "watch": "Poll a deployment, record its series and events, restart it.",
    "stage": "Run the recipe's staging on every node in parallel.",
    "init": "Discover the nodes' fabric and write a cluster file.",
    "doctor": "Check every node: SSH, docker, GPUs, RDMA, fabric, disk, ...",
    "ab": "A/B two variants of a recipe, round by round, with a verdict.",
    "dashboard": "Serve the dashboard: deployments, bench, quality, doctor.",
    "image": "Build the recipe's image and give every node the same ID.",
    "bench": "Decode, prefill and open-loop (serve) benchmarks.",
    "eval": "Quality gate, paired comparison and needle checks.",
    "import": "Turn a launcher profile or sparkrun recipe into a recipe.",
    "export": "Write a recipe as a Kubernetes manifest or an sbatch script.",
    "gateway": "An OpenAI front door: keys, output cap, loop abort, routing.",
}

EXIT_USER_ERROR = 2


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """The command tree: only the module that owns argv's command; with argv but no command,
    the listing alone; without argv (a caller that wants the tree), every module."""
    app = group(
        "Launch, stage, verify, benchmark and evaluate multi-node LLM deployments.",
        name="sparkfleet",
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _group() -> None:
        # Keeps the app a group when only one single-command module is loaded (doctor,
        # stage): typer would otherwise run that lone command as the root and read
        # "doctor" as its first argument.
        return None

    command = next((a for a in argv or [] if not a.startswith("-")), None)
    if command is None and argv is not None:
        # Nothing to run, only the listing to show (--help, or no arguments at all).
        for name, summary in SUMMARIES.items():
            app.command(name, help=summary, add_help_option=False)(lambda: None)  # listed, never run
        return app
    owners = [m for m, names in COMMAND_MODULES.items() if command in names]
    for module in owners or COMMAND_MODULES:
        for name, command in importlib.import_module(module).COMMANDS.items():
            if isinstance(command, typer.Typer):
                app.add_typer(command, name=name)
            else:
                app.command(name)(command)
    return app


def _usage_error(exc: typer.TyperException, argv: list[str]) -> NoReturn:
    """A command-line mistake: one line on stderr and exit 2 (help on stdout, exit 0, when asked
    for nothing at all)."""
    from sparkfleet.cli.console import console, err_console
    from sparkfleet.cli.renamed import explain

    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":
        # click >= 8.2 reports a bare group as an error carrying its help text; it is a request
        # for help, answered the way --help is.
        console.file.write(exc.format_message() + "\n")
        sys.exit(0)
    # click's own rendering is a usage block plus a hint on several lines; a mistake gets one.
    message = " ".join(exc.format_message().split())
    line = explain(argv, message)  # an old spelling whose meaning changed (--json FILE)
    if line is None:
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (try '{ctx.command_path} --help')" if ctx is not None else ""
        line = where + message + hint
    err_console.print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)
    sys.exit(EXIT_USER_ERROR)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: user errors become one red line and exit 2; bugs go to the crash log."""
    from sparkfleet.cli.console import err_console, warn
    from sparkfleet.cli.renamed import rewrite

    logging.basicConfig(level=os.environ.get("SPARKFLEET_LOG", "WARNING"))
    args = sys.argv[1:] if argv is None else argv
    try:
        # Old spellings of renamed options (cli/renamed.py): replaced, one line on stderr each.
        args, notes, refusal = rewrite(args)
        if refusal is not None:
            raise UsageError(refusal)
        for note in notes:
            warn(note)
        # Without standalone mode click returns a command's exit code (e.g. 130 after Ctrl-C).
        code = build_app(args)(args=args, standalone_mode=False)
    except SparkfleetError as exc:
        from sparkfleet.config.secrets import redact  # a last net: token-shaped words in any message

        err_console.print(f"[bold red]error:[/] {escape(redact(exc.message))}", soft_wrap=True)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt as exc:
        # up says what its rollback did (``KeyboardInterrupt("NAME: every started rank was stopped")``).
        err_console.print("[bold red]interrupted[/]" + escape(f": {exc}" if str(exc) else ""))
        sys.exit(130)
    except SystemExit:
        raise
    except typer.Abort:
        err_console.print("[bold red]aborted[/]")
        sys.exit(130)
    except typer.TyperException as exc:
        # typer >= 0.29 parses with its own copy of click (click itself may not be installed), whose
        # usage errors all derive from TyperException; standalone_mode=False hands them to us.
        _usage_error(exc, args)
    except Exception as exc:
        from sparkfleet.nodes.private import open_private_append, private_dir
        from sparkfleet.state.store import state_dir

        log = state_dir() / "crash.log"
        try:  # the traceback may quote secrets: a 0600 file in the private state dir
            private_dir(log.parent, parents=True)
            with os.fdopen(open_private_append(log), "a") as fh:
                fh.write(traceback.format_exc() + "\n")
            where = f"traceback in {log}"
        except (OSError, SparkfleetError) as why:
            where = f"no traceback kept: {why}"
        err_console.print(f"[bold red]internal error:[/] {exc!r} ({where})")
        sys.exit(1)
    if isinstance(code, int) and code != 0:
        sys.exit(code)


if __name__ == "__main__":
    main()
