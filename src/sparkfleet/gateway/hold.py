"""Requests that wait for a model with no ready replica (a restart, a rollback, a switch done one
after the other) instead of failing: a queue per model, bounded in length and in wait, released in
arrival order once a replica is ready.

A waiter is a future in its model's deque. ``release(model)`` resolves them front to back, and the
event loop runs their tasks in that order, so the first to arrive is the first to pick a replica.
A client that goes away cancels its request's task, which takes its future out of the deque; a
request past the wait limit does the same, and the caller answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass


class QueueFull(Exception):
    """The model's queue holds its limit already."""


@dataclass(frozen=True)
class Waited:
    """One request that was held: when it stopped waiting, for how long, and how it ended
    (``released``, ``timeout``, ``full``, ``gone``, ``dropped``: its route went away)."""

    end: float  # time.time()
    model: str
    seconds: float
    outcome: str


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[None]
    start: float  # monotonic


class RouteGone(Exception):
    """The model was taken off the gateway while requests waited for it."""


class HoldQueue:
    def __init__(self, history: int = 100_000) -> None:
        self.waiting: dict[str, deque[_Waiter]] = {}
        self.history: deque[Waited] = deque(maxlen=history)
        self.changed = asyncio.Event()  # set when a request starts waiting: the router looks sooner

    def held(self, model: str | None = None) -> int:
        if model is not None:
            return len(self.waiting.get(model, ()))
        return sum(len(q) for q in self.waiting.values())

    async def wait(self, model: str, max_queue: int, max_wait: float) -> float:
        """Wait until ``release(model)``; the seconds waited. QueueFull at once when the queue is
        at ``max_queue``; TimeoutError after ``max_wait`` seconds; RouteGone from ``drop``."""
        queue = self.waiting.setdefault(model, deque())
        start = time.monotonic()
        if len(queue) >= max_queue:
            self.history.append(Waited(time.time(), model, 0.0, "full"))
            raise QueueFull
        waiter = _Waiter(asyncio.get_running_loop().create_future(), start)
        queue.append(waiter)
        self.changed.set()
        try:
            async with asyncio.timeout(max_wait):
                await waiter.future
        except BaseException as exc:
            # A timeout or the client gone (either cancels the future); release and drop counted theirs.
            if waiter.future.cancelled() or not waiter.future.done():
                waiter.future.cancel()
                outcome = "timeout" if isinstance(exc, TimeoutError) else "gone"
                self.history.append(Waited(time.time(), model, time.monotonic() - start, outcome))
            raise
        finally:
            if waiter in queue:
                queue.remove(waiter)
            if not queue and self.waiting.get(model) is queue:
                del self.waiting[model]
        return time.monotonic() - start

    def release(self, model: str) -> int:
        """Let every request waiting for model go, first come first served; how many."""
        return self._end(model, "released")

    def drop(self, model: str) -> int:
        """The model is gone from the gateway: its waiting requests end (503)."""
        return self._end(model, "dropped")

    def _end(self, model: str, outcome: str) -> int:
        # Counted here, when decided: whoever asks right after (the admin release) sees them.
        queue = self.waiting.pop(model, None)
        now, wall, n = time.monotonic(), time.time(), 0
        for waiter in queue or ():
            if waiter.future.done():
                continue
            if outcome == "released":
                waiter.future.set_result(None)
            else:
                waiter.future.set_exception(RouteGone())
            self.history.append(Waited(wall, model, now - waiter.start, outcome))
            n += 1
        return n

    def summary(self, since: float, models: set[str] | None = None) -> dict[str, float | int]:
        """What was held since a time (time.time()): how many requests were held and released,
        turned away (queue full, wait limit, route gone), and the longest wait."""
        rows = [w for w in self.history if w.end >= since and (models is None or w.model in models)]
        held = [w for w in rows if w.outcome != "full"]
        return {
            "held": len(held),
            "released": sum(1 for w in rows if w.outcome == "released"),
            "rejected": sum(1 for w in rows if w.outcome in ("full", "timeout", "dropped")),
            "gone": sum(1 for w in rows if w.outcome == "gone"),
            "longest": max((w.seconds for w in held), default=0.0),
            "waiting": sum(self.held(m) for m in models) if models is not None else self.held(),
        }
