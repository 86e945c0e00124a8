"""meminfo, df, clock, user and the bundle runner: captured outputs and real commands."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.doctor.probes import bundle, clock, disk, meminfo, user
from sparkfleet.nodes.transport.local import LocalTransport
from tests.unit._captures import h200_section, vm


def test_meminfo_of_the_h200_and_this_vm() -> None:
    h = meminfo.parse(h200_section("meminfo"))
    assert (h.total, h.available) == (131981020 * 1024, 131470044 * 1024)
    v = meminfo.parse(vm("meminfo.txt"))
    assert 0 < v.available <= v.total


def test_df_capture_of_the_h200() -> None:
    d = disk.parse(h200_section("df"))
    assert (d.source, d.fstype, d.size, d.avail, d.mount) == (
        "/dev/vda",
        "ext4",
        270553174016,
        68701597696,
        "/",
    )


def test_df_on_a_path_that_does_not_exist_yet_reports_its_parent_filesystem(tmp_path: Path) -> None:
    result = LocalTransport().run(disk.command(str(tmp_path / "not" / "yet" / "engram")))
    d = disk.parse(result.stdout)
    assert d.size > 0 and d.avail > 0
    assert Path(d.mount).exists()


def test_clock_skew_is_zero_inside_the_round_trip_and_signed_outside() -> None:
    assert clock.skew(100.5, 100.0, 101.0).seconds == 0.0
    assert clock.skew(97.0, 100.0, 101.0).seconds == -3.0
    assert clock.skew(105.0, 100.0, 101.0).seconds == 4.0
    assert clock.parse("1795944055.955154041\n") == 1795944055.955154041


def test_bundle_keeps_each_probes_streams_and_exit_code_apart() -> None:
    result, outs = bundle.run_bundle(
        LocalTransport("n1"),
        {
            "user": user.COMMAND,
            "clock": clock.COMMAND,
            "mem": meminfo.COMMAND,
            "gone": ["no-such-command-sparkfleet"],
            "fails": ["sh", "-c", "printf 'half'; echo oops >&2; exit 3"],
        },
    )
    assert result.ok
    assert user.parse(outs["user"].stdout) and clock.parse(outs["clock"].stdout) > 1e9
    assert meminfo.parse(outs["mem"].stdout).total > 0
    assert outs["gone"].missing and "not found" in outs["gone"].stderr
    assert (outs["fails"].exit_code, outs["fails"].stdout, outs["fails"].stderr) == (3, "half", "oops\n")


def test_truncated_bundle_output_keeps_the_probes_that_came_whole() -> None:
    script = bundle.bundle_script({"a": ["echo", "one"], "b": ["echo", "two"]})
    full = LocalTransport().run(["sh", "-c", script]).stdout
    cut = full[: full.index("@@SF-ERR b")]
    assert set(bundle.parse_bundle(full)) == {"a", "b"}
    assert bundle.parse_bundle(cut) == {"a": bundle.ProbeOutput("a", 0, "one\n", "")}
