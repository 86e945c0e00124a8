"""--api-key takes where the key is (bench/auth.py), and a keyed server's refusal is named."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sparkfleet.bench.auth import api_key_for, read_key_ref
from sparkfleet.errors import UsageError


def test_env_file_and_stdin_references(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    assert read_key_ref("env:MY_KEY") == "sk-from-env"
    (tmp_path / "k").write_text("sk-from-file\nsecond line ignored\n")
    assert read_key_ref(f"file:{tmp_path / 'k'}") == "sk-from-file"
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-from-stdin\n"))
    assert read_key_ref("-") == "sk-from-stdin"


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("sk-live-abcdef0123456789", "--api-key takes where the key is, not the key"),
        ("env:NOT_SET_ANYWHERE", "--api-key env:NOT_SET_ANYWHERE: the variable NOT_SET_ANYWHERE is not set"),
        ("file:/nonexistent/key", "--api-key file:/nonexistent/key: no such file, or it is empty"),
    ],
)
def test_a_bad_reference_is_one_message_that_never_holds_a_key(ref: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        read_key_ref(ref)
    assert message in str(err.value) and "sk-live" not in str(err.value)


def test_openai_api_key_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert api_key_for(None) == "sk-openai"
    monkeypatch.setenv("OTHER", "sk-other")
    assert api_key_for("env:OTHER") == "sk-other"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert api_key_for(None) is None
