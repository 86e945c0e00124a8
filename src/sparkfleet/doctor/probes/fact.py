"""A fact: one thing doctor asks a node, as data (the commands) and a pure parser of what they
printed (pyinfra's facts). Each probe module in this folder declares its ``Fact``; ``FACTS`` in
``facts.py`` lists them, and asking and parsing are one loop over that list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sparkfleet.doctor.probes.bundle import ProbeOutput

T = TypeVar("T")


@dataclass(frozen=True)
class FactsRequest:
    """What to probe on one node beyond the fixed set."""

    image: str | None = None
    disk_paths: tuple[str, ...] = ()
    hf_cache: str | None = None
    model_repo: str | None = None
    reach_targets: tuple[tuple[str, int], ...] = ()
    checkpoint_headers: bool = False


@dataclass(frozen=True)
class Asked:
    """What a parser may use besides the outputs: the request, when the bundle was sent and
    answered (this machine's clock), and where to note a part it could not read (a fact made of
    several commands, such as one disk of several, keeps the parts that did read)."""

    req: FactsRequest
    sent: float = 0.0
    received: float = 0.0
    notes: list[str] = field(default_factory=list)


class NoOutput(KeyError):
    """A section the bundle did not bring back."""


def section(outs: Mapping[str, ProbeOutput], name: str) -> ProbeOutput:
    """The output of the command run as ``name``."""
    if name not in outs:
        raise NoOutput(name)
    return outs[name]


def note_unread(asked: Asked, outs: Mapping[str, ProbeOutput], name: str, exc: Exception) -> None:
    """Note in asked that section ``name`` did not read: missing, or not what its parser knows."""
    if isinstance(exc, NoOutput):
        asked.notes.append(f"{name}: no output")
        return
    out = outs.get(name)
    shown = (out.stderr or out.stdout).strip()[:200] if out else ""
    asked.notes.append(f"{name}: unexpected output ({exc}): {shown}")


def read(outs: Mapping[str, ProbeOutput], name: str, parse: Callable[[ProbeOutput], T], asked: Asked) -> T | None:
    """parse(section ``name``), or None with a note in asked."""
    try:
        return parse(section(outs, name))
    except (ValueError, KeyError, IndexError) as exc:
        note_unread(asked, outs, name, exc)
        return None


@dataclass(frozen=True)
class Fact:
    """``name`` is the NodeFacts field the fact fills. ``commands`` gives the bundle sections to
    run for a request (none: the request does not ask for this fact, which keeps ``default``);
    ``parse`` turns their outputs into the value and raises ValueError, KeyError or IndexError
    on output it does not understand."""

    name: str
    commands: Callable[[FactsRequest], Mapping[str, list[str]]]
    parse: Callable[[Mapping[str, ProbeOutput], Asked], Any]
    default: Any = None


def fixed(name: str, argv: list[str], parse: Callable[[ProbeOutput], Any], *, run_as: str | None = None) -> Fact:
    """A fact asked of every node with one command (its bundle section ``run_as``, else the
    fact's name), read from that command's output alone."""
    key = run_as or name
    return Fact(name, lambda _req: {key: argv}, lambda outs, _asked: parse(section(outs, key)))
