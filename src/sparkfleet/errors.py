"""The one error tree of sparkfleet.

Every error a user can cause or fix is a ``SparkfleetError``; the CLI prints its message as one
red line and exits with code 2. Anything else is a bug and gets a traceback in the log file.

    SparkfleetError
     ├── UsageError         a command-line option or argument is invalid
     ├── NotFoundError      no deployment, experiment or configuration of that name
     ├── RecipeError        a recipe file is malformed or refers to something impossible
     ├── ClusterError       a cluster inventory file is malformed, or too small for a recipe
     ├── PlanError          recipe and cluster together cannot be planned
     ├── NodeError          something on one node failed (carries the node name)
     │    ├── TransportError   the node could not be reached or a command could not run
     │    │    ├── TransportTimeout  a command did not finish within its timeout
     │    │    └── CommandError   a command ran and failed (carries the Result)
     │    ├── RankRuntimeError  a rank could not be started, inspected or stopped
     │    └── StagingError     staging could not run or would not fit on the node
     ├── FabricError        a pair of nodes failed the fabric test a recipe's [verify] fabric_min_gbps asks of up
     ├── ReadinessError     a deployment did not become ready (rank exited, timeout, forbidden line)
     │    └── RankExited       a rank stopped during start-up (its message is redone after the rollback)
     ├── StopIncomplete     ranks could not be stopped on some nodes (carries node -> why)
     │    └── RollbackIncomplete  up failed, and its rollback could not reach some nodes
     ├── LeftoverError      down stopped the ranks, but something of the instance is left (carries the DownReport)
     ├── StateError         the local state store or a deployment lock
     ├── BenchError         a benchmark could not run (endpoint down, bad answers)
     ├── EvalError          a quality or needle evaluation could not run
     └── GatewayError       the gateway's configuration, a route or a key is invalid

A Ctrl-C (or SIGTERM) during ``up`` stays a ``KeyboardInterrupt``: it propagates once the rollback
has stopped every started rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkfleet.apply.down import DownReport
    from sparkfleet.nodes.transport.base import Result


class SparkfleetError(Exception):
    """A failure the user can understand and act on; its message is shown as-is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(SparkfleetError):
    """A command-line option or argument is invalid; the message names it."""


class NotFoundError(SparkfleetError):
    """No deployment, experiment or configuration of the name given."""


class RecipeError(SparkfleetError):
    """A recipe is malformed; the message names the file and the key path."""


class ClusterError(SparkfleetError):
    """A cluster inventory is malformed or does not fit the recipe."""


class PlanError(SparkfleetError):
    """A recipe and a cluster cannot be planned together."""


class NodeError(SparkfleetError):
    """Something failed on one node."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node
        self.detail = message


class TransportError(NodeError):
    """A node could not be reached, or a command could not be run there."""


class TransportTimeout(TransportError):
    """A command on a node did not finish within its timeout (it was killed)."""

    def __init__(self, node: str, command: str, timeout: float, where: str | None = None) -> None:
        super().__init__(node, f"{command} timed out after {timeout:.0f}s" + (f" on {where}" if where else ""))
        self.command = command
        self.timeout = timeout
        self.where = where or node


class CommandError(TransportError):
    """A command ran on a node and exited non-zero; carries its Result."""

    def __init__(self, result: Result, what: str | None = None) -> None:
        tail = result.tail()
        label = what or result.display()
        msg = f"{label} exited {result.exit_code}" + (f":\n{tail}" if tail else "")
        super().__init__(result.node, msg)
        self.result = result


class RankRuntimeError(NodeError):
    """A rank could not be started, inspected or stopped."""


class StagingError(NodeError):
    """Staging could not run, or would not fit, on a node."""


class FabricError(SparkfleetError):
    """A pair of nodes failed the fabric test that the recipe's `[verify] fabric_min_gbps` asks of `up`."""


class ReadinessError(SparkfleetError):
    """A deployment did not become ready."""


class RankExited(ReadinessError):
    """A rank stopped during start-up; the message shows its last log lines.

    The log can still grow after the rank's main process is gone: the engine's helper processes
    live on until the rollback stops them (vLLM's resource tracker warns of leaked semaphores
    once its parent was killed). ``redo`` builds the message again from the log as it is then;
    ``up`` calls it once every rank is stopped, so the lines shown are the log's last ones.
    """

    def __init__(self, message: str, redo: Callable[[], str]) -> None:
        super().__init__(message)
        self._redo = redo

    def refresh(self) -> None:
        """The message from the log as it is now; kept as it was when the log cannot be read."""
        try:
            message = self._redo()
        except (SparkfleetError, OSError):
            return
        self.message, self.args = message, (message,)


class StopIncomplete(SparkfleetError):
    """Ranks could not be stopped on some nodes; ``failed`` maps each node to why."""

    def __init__(self, message: str, failed: dict[str, str]) -> None:
        super().__init__(message + "; ".join(f"{node}: {why}" for node, why in failed.items()))
        self.failed = failed


class RollbackIncomplete(StopIncomplete):
    """``up`` failed (``why``), and its rollback could not reach some nodes (``failed``)."""

    def __init__(self, why: str, failed: dict[str, str]) -> None:
        super().__init__(f"{why}\nrollback could not reach: ", failed)
        self.why = why


class LeftoverError(SparkfleetError):
    """``down`` stopped the ranks, but something of the instance is left; carries the report
    (``report.leftovers``, the nodes it could not check, and the memory per node)."""

    def __init__(self, report: DownReport) -> None:
        super().__init__(report.problem() or f"{report.name}: left over")
        self.report = report


class StateError(SparkfleetError):
    """The local state store, or a deployment lock, refused the operation."""


class BenchError(SparkfleetError):
    """A benchmark could not run."""


class EvalError(SparkfleetError):
    """A quality or needle evaluation could not run."""


class GatewayError(SparkfleetError):
    """The gateway's configuration, a route or a key is invalid."""
