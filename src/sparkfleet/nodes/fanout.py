"""``fan_out(nodes, fn)``: the one way sparkfleet works on several nodes in parallel. Its
``GroupResult`` (fabric's name) keeps every node's outcome in node order, with the error
policies callers need (``raise_first``, ``raise_all``, ``failures``), so none keeps a pool.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkfleet.errors import NodeError, SparkfleetError

T = TypeVar("T")
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver them as they were meant.

    Around the pool's submits: a worker thread interrupted inside Thread.start() is unknown to
    the pool, so it would run on, unseen by the wait that follows an interrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are only ever handled in the main thread
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: arrived.append(signum)) for sig in _INTERRUPTS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What one node's call returned, or the error it raised."""

    node: str
    value: T | None
    error: BaseException | None

    @property
    def ok(self) -> bool:
        return self.error is None


class GroupResult(Mapping[str, Outcome[T]]):
    """Every node's outcome of one fan-out, in the order the nodes were given; all errors kept."""

    def __init__(self, outcomes: Iterable[Outcome[T]] = ()) -> None:
        self._outcomes: dict[str, Outcome[T]] = {o.node: o for o in outcomes}

    def __getitem__(self, node: str) -> Outcome[T]:
        return self._outcomes[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outcomes)

    def __len__(self) -> int:
        return len(self._outcomes)

    def __repr__(self) -> str:
        return f"GroupResult(ok={sorted(self.succeeded)}, failed={sorted(self.failures)})"

    @property
    def failures(self) -> dict[str, BaseException]:
        """The error of every node that failed, in node order."""
        return {n: o.error for n, o in self._outcomes.items() if o.error is not None}

    @property
    def succeeded(self) -> dict[str, T]:
        """The value of every node that succeeded, in node order."""
        return {n: o.value for n, o in self._outcomes.items() if o.error is None}  # type: ignore[misc]

    def raise_first(self) -> dict[str, T]:
        """The values, or the first failed node's error (user-facing ones as they are; anything
        else as a NodeError naming the node, caused by the original)."""
        for node, error in self.failures.items():
            if isinstance(error, SparkfleetError):
                raise error
            raise NodeError(node, str(error)) from error
        return self.succeeded

    def raise_all(self, error: Callable[[str, str], SparkfleetError] = NodeError) -> dict[str, T]:
        """The values, or one error(node, detail) naming every node that failed: the first
        node's, then one line per other node. Every original error is kept as its cause (an
        ExceptionGroup when several failed). A bug (not a user-facing error) is raised as it is."""
        failures = self.failures
        if not failures:
            return self.succeeded
        # A node's failure is shown as a message; anything else is a bug, shown with its traceback.
        bug = next((e for e in failures.values() if not isinstance(e, SparkfleetError | OSError)), None)
        if bug is not None:
            raise bug
        key, first = next(iter(failures.items()))
        node, detail = (first.node, first.detail) if isinstance(first, NodeError) else (key, str(first))
        # One line per other node (a node's own error names its node).
        others = [str(e) if isinstance(e, NodeError) else f"{n}: {e}" for n, e in list(failures.items())[1:]]
        text = "\n".join([detail, *others])
        errors = [e for e in failures.values() if isinstance(e, Exception)]
        cause: BaseException = first if len(failures) == 1 else ExceptionGroup("every failed node's error", errors)
        raise error(node, text) from cause


def fan_out(nodes: Iterable[str], fn: Callable[[str], T], *, workers: int = 16) -> GroupResult[T]:
    """Call fn(node) for every node in parallel; every node's outcome (value or error)."""
    names = list(dict.fromkeys(nodes))

    def call(name: str) -> Outcome[T]:
        try:
            return Outcome(name, fn(name), None)
        except Exception as exc:
            return Outcome(name, None, exc)

    if not names:
        return GroupResult()
    # Even one node's call runs in a worker: an interrupt then never cuts a command half-way.
    with ThreadPoolExecutor(max_workers=min(workers, len(names))) as pool:
        try:
            with _interrupts_deferred():
                futures = [pool.submit(call, name) for name in names]
            return GroupResult(f.result() for f in futures)
        except KeyboardInterrupt:
            # Ctrl-C reaches only this thread. Calls already running finish first (each is
            # bounded by its timeout), so a rank whose start was in flight exists before the
            # caller's rollback looks for it; calls not yet begun never start.
            while True:
                try:
                    pool.shutdown(wait=True, cancel_futures=True)
                    break
                except KeyboardInterrupt:
                    continue
            raise
