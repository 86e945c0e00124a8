"""Running one function on every node at once, keeping every node's outcome."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkfleet.errors import SparkfleetError

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


def fan_out(nodes: Iterable[str], fn: Callable[[str], T], *, workers: int = 16) -> dict[str, Outcome[T]]:
    """Call fn(node) for every node in parallel; a per-node map of results or errors."""
    names = list(nodes)

    def call(name: str) -> Outcome[T]:
        try:
            return Outcome(name, fn(name), None)
        except Exception as exc:
            return Outcome(name, None, exc)

    if not names:
        return {}
    # Even one node's call runs in a worker: an interrupt then never cuts a command half-way.
    with ThreadPoolExecutor(max_workers=min(workers, len(names))) as pool:
        try:
            with _interrupts_deferred():
                futures = [pool.submit(call, name) for name in names]
            return {n: f.result() for n, f in zip(names, futures, strict=True)}
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


def raise_first(outcomes: dict[str, Outcome[T]]) -> dict[str, T]:
    """The values, or the first node's error (user-facing ones as they are)."""
    for outcome in outcomes.values():
        if outcome.error is not None:
            if isinstance(outcome.error, SparkfleetError):
                raise outcome.error
            raise SparkfleetError(f"{outcome.node}: {outcome.error}") from outcome.error
    return {name: o.value for name, o in outcomes.items()}  # type: ignore[misc]
