"""A rank that dies during start-up is reported with its last log lines and, when an engine
re-raised the real failure as a generic one, the first exception of its log (the cause)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.apply.readiness import first_exception, rank_exited
from sparkfleet.errors import TransportError
from sparkfleet.nodes.runtime.base import RankState
from tests.fake_node import fake_fleet

# The shape of vLLM 0.32's log when its Ray executor refuses the CPU platform (captured here).
VLLM_LOG = "\n".join([
    "(APIServer pid=9600) INFO 12-01 12:08:12 [api_server.py:1] vLLM API server version 0.32.0",
    "(EngineCore pid=28760) ERROR 12-01 12:08:42 [core.py:1510] EngineCore failed to start.",
    "(EngineCore pid=28760) ERROR 12-01 12:08:42 [core.py:1510] Traceback (most recent call last):",
    "(EngineCore pid=28760) ERROR 12-01 12:08:42 [core.py:1510]     raise ValueError(",
    "(EngineCore pid=28760) ERROR 12-01 12:08:42 [core.py:1510] ValueError: current platform cpu does not "
    "support ray.",
    *[f"    frame {i}" for i in range(30)],
    "    RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
])  # fmt: skip


def test_the_first_exception_is_the_cause() -> None:
    assert first_exception(VLLM_LOG) == "ValueError: current platform cpu does not support ray."
    assert first_exception("INFO all well\nstill fine") is None


def test_the_exit_error_names_the_cause_beside_the_tail(tmp_path: Path) -> None:
    rank = fake_fleet(tmp_path, port=30000).plan.rank(0)
    message = str(rank_exited(rank, RankState(0, "node0", "exited", exit_code=1), VLLM_LOG))
    assert message.startswith("rank 0 on node0 exited with code 1 during start-up; last log lines:")
    assert "Engine core initialization failed" in message  # the tail, as before
    assert message.rstrip().endswith("first error in its log:\n    ValueError: current platform cpu does not "
                                     "support ray.")  # fmt: skip


def test_a_cause_already_in_the_tail_is_not_repeated(tmp_path: Path) -> None:
    rank = fake_fleet(tmp_path, port=30000).plan.rank(0)
    message = str(rank_exited(rank, RankState(0, "node0", "exited", exit_code=1), "loading\nOSError: no such file x"))
    assert message.count("OSError: no such file x") == 1 and "first error" not in message


def test_after_the_rollback_the_message_shows_the_log_as_it_ended(tmp_path: Path) -> None:
    # vLLM's resource tracker outlives a killed rank and adds its warning to the log after the
    # rank was seen dead; up redoes the message once every rank is stopped (CI caught the
    # first message showing lines that were no longer the log's last).
    rank = fake_fleet(tmp_path, port=30000).plan.rank(1)
    seen = "INFO loading\nINFO reserved_cpus=[]"
    final = seen + "\nUserWarning: resource_tracker: There appear to be 1 leaked semaphore objects\n"
    error = rank_exited(rank, RankState(1, "node1", "exited", exit_code=-9), seen, lambda: final)
    assert str(error).rstrip().endswith("reserved_cpus=[]")
    error.refresh()
    assert str(error).rstrip().endswith("leaked semaphore objects")
    assert str(error).startswith("rank 1 on node1 exited with code -9 during start-up; last log lines:")


def test_a_log_that_cannot_be_read_again_keeps_the_first_message(tmp_path: Path) -> None:
    rank = fake_fleet(tmp_path, port=30000).plan.rank(0)

    def unreachable() -> str:
        raise TransportError("node0", "ssh: connect to host node0 port 22: Connection refused")

    for reread in (unreachable, lambda: ""):
        error = rank_exited(rank, RankState(0, "node0", "exited", exit_code=1), "INFO last words", reread)
        error.refresh()
        assert str(error).rstrip().endswith("INFO last words")
