"""The shell-profile reader: what `set -a; source .env` would assign, or a listed reason."""

from __future__ import annotations

from sparkfleet.importers.shell_profile import parse_profile


def test_quotes_comments_and_expansion() -> None:
    text = """
# comment
HEAD_IP=10.0.0.1
export USER_NAME=zurih
A="two words"   # trailing comment
B='$HOME literal'
C=$HOME/.ssh/key
D=/home/$USER_NAME/dir
E="${USER_NAME}-x ${MISSING:-fallback}"
F="--flag {\\"num\\":1}"
G=unquoted\\ space
A=last
"""
    p = parse_profile(text, "f", home="/home/h")
    v = p.values()
    assert v["HEAD_IP"] == "10.0.0.1" and v["USER_NAME"] == "zurih"
    assert v["A"] == "last"
    assert v["B"] == "$HOME literal"
    assert v["C"] == "/home/h/.ssh/key"
    assert v["D"] == "/home/zurih/dir"
    assert v["E"] == "zurih-x fallback"
    assert v["F"] == '--flag {"num":1}'
    assert v["G"] == "unquoted space"
    assert p.skipped == () and p.unresolved == ()


def test_default_home_is_the_per_node_template() -> None:
    assert parse_profile("X=$HOME/a", "f").values()["X"] == "{{home}}/a"


def test_unsupported_lines_are_reported_with_line_numbers() -> None:
    text = 'OK=1\nset -a\nX=$(hostname)\nY=a b\nZ="open\nstill"\nW=$NOPE/x\n'
    p = parse_profile(text, "f")
    assert p.values() == {"OK": "1", "Z": "open\nstill", "W": "/x"}
    reasons = {s.line: s.reason for s in p.skipped}
    assert set(reasons) == {2, 3, 4}
    assert "command substitution" in reasons[3] and "more than one word" in reasons[4]
    assert p.unresolved == ("NOPE",)
