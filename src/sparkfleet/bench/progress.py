"""How benchmark runners report progress; the CLI draws it with rich, tests collect it."""

from __future__ import annotations

from typing import Protocol

from sparkfleet.bench.client import RequestRecord


class Progress(Protocol):
    """A step (a warm-up or a measured run) starts, its requests finish, it ends."""

    def start(self, label: str, total: int) -> None: ...

    def advance(self, record: RequestRecord) -> None: ...

    def finish(self, message: str | None) -> None: ...


class NullProgress:
    """Reports nothing."""

    def start(self, label: str, total: int) -> None:
        return None

    def advance(self, record: RequestRecord) -> None:
        return None

    def finish(self, message: str | None) -> None:
        return None
