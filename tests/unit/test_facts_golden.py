"""Every doctor fact parsed from captured real bundles, against reviewed golden values (pyinfra's
fact tests: one runner over fixtures). A fact added to FACTS without a golden value fails here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from sparkfleet.doctor.probes.bundle import parse_bundle
from sparkfleet.doctor.probes.fact import Asked
from sparkfleet.doctor.probes.facts import FACTS, FactsRequest, parse_facts, probe_commands
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "tests" / "golden" / "facts"

# capture -> (bundle file, the request it was captured with, when it was sent and answered)
CAPTURES: dict[str, tuple[str, FactsRequest, float, float]] = {
    "h200": (
        "h200-device/bundle-h200.txt",
        FactsRequest(disk_paths=("/tmp/x/y",), reach_targets=(("127.0.0.1", 22),)),
        # The node's clock read 1795947864.66: 2.16 s behind a controller that sent at 1795947866.82.
        1795947866.82,
        1795947867.2,
    ),
    "vm": (
        "vm-x86-bundle/bundle-vm.txt",
        FactsRequest(
            image="sparkfleet-test:latest",
            disk_paths=("/tmp/x/y", "/"),
            hf_cache="/tmp/sf-capture-hf",
            model_repo="org/tiny",
            reach_targets=(("127.0.0.1", 22), ("127.0.0.1", 9)),
            checkpoint_headers=True,
        ),
        1796310802.9,  # the node's clock (1796310803.07) read inside the round trip: no skew
        1796310803.2,
    ),
}
CASES = [(capture, fact.name) for capture, (_, req, *_) in CAPTURES.items() for fact in FACTS if fact.commands(req)]


def _plain(value: Any) -> Any:
    """value as JSON would hold it: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _parsed(capture: str, name: str) -> Any:
    bundle, req, sent, received = CAPTURES[capture]
    outs = parse_bundle((FIXTURES / bundle).read_text())
    fact = next(f for f in FACTS if f.name == name)
    assert set(fact.commands(req)) <= set(outs), f"{bundle} was not captured with {name}'s commands"
    asked = Asked(req, sent, received)
    return {"value": _plain(fact.parse(outs, asked)), "notes": asked.notes}


@pytest.mark.parametrize(("capture", "name"), CASES)
def test_fact_parses_its_capture_as_reviewed(capture: str, name: str, update_golden: bool) -> None:
    golden = GOLDEN / capture / f"{name}.json"
    got = _parsed(capture, name)
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    if not golden.exists():
        pytest.fail(f"{golden.relative_to(ROOT)} is missing: review the value, then rerun with --update-golden")
    assert json.loads(golden.read_text()) == got, f"{name} parsed from the {capture} capture changed"


def test_every_fact_is_read_from_some_capture() -> None:
    read = {name for capture, name in CASES if _parsed(capture, name)["value"] not in (None, [])}
    assert read == {f.name for f in FACTS}


def test_every_fact_fills_its_own_node_facts_field_and_sections_do_not_collide() -> None:
    from sparkfleet.doctor.probes.facts import NodeFacts

    fields = {f.name for f in dataclasses.fields(NodeFacts)}
    assert {f.name for f in FACTS} <= fields
    req = CAPTURES["vm"][1]
    sections = [s for f in FACTS for s in f.commands(req)]
    assert len(sections) == len(set(sections)) == len(probe_commands(req))


def test_a_section_that_is_missing_or_unreadable_is_noted_and_the_rest_is_kept() -> None:
    bundle, req, sent, received = CAPTURES["h200"]
    outs = parse_bundle((FIXTURES / bundle).read_text())
    del outs["meminfo"]
    outs["clock"] = dataclasses.replace(outs["clock"], stdout="not a time\n")
    facts = parse_facts("h200", outs, req, sent, received)
    assert facts.meminfo is None and facts.skew is None
    assert facts.gpu is not None and facts.user == "root"
    assert "meminfo: no output" in facts.errors
    assert any(e.startswith("clock: unexpected output") for e in facts.errors)


def test_goldens_are_only_for_registered_facts() -> None:
    names = {f.name for f in FACTS}
    stale = [p for p in GOLDEN.glob("*/*.json") if p.stem not in names or p.parent.name not in CAPTURES]
    assert not stale, f"golden files of no fact: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_captures_exist() -> None:
    for bundle, *_ in CAPTURES.values():
        assert Path(FIXTURES / bundle).is_file()
