"""Changes behind the gateway lose no request (issue 34), on a 2-node loopback fleet (real sshd per
node) with stand-in ranks whose head takes seconds to serve: the official openai client sends a
steady stream through `sparkfleet gateway serve` while `rollback` replaces the deployment, and
while watch restarts it after its rank 0 is SIGKILLed. Every request gets its whole answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from tests.fleet.loopback import LoopbackFleet
from tests.gateway_process import cli, gateway
from tests.integration.conftest import leftover_processes, standin_recipe
from tests.integration.test_lifecycle_fleet import free_port
from tests.integration.test_watch_fleet import _engine_pid, _wait_event, _wait_polled, watching

pytestmark = pytest.mark.integration

HEAD_DELAY_S = 4.0  # the stand-in head's start-up: a change leaves the model with no replica this long
RATE = 4.0  # requests per second, each in its own thread, whatever the others wait
TOKENS = 8
WHOLE = "".join(f" t{i}" for i in range(TOKENS))
VARIANTS = '\n[variants.fast]\nargs_set = ["--standin-itl", "0.002"]\n'


@dataclass
class Outcome:
    sent: float
    seconds: float
    answer: str | None = None
    error: str | None = None


@dataclass
class Stream:
    """A steady stream of requests through the gateway, streamed and not, in turn."""

    url: str
    model: str
    streamed: bool = True  # every other request streamed; False: all assembled by the gateway
    prompt: str = "x"
    tokens: int = TOKENS
    rate: float = RATE
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def _one(self, n: int) -> None:
        client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)
        sent = time.monotonic()
        out = Outcome(sent, 0.0)
        try:
            if self.streamed and n % 2:
                chunks = client.completions.create(model=self.model, prompt=self.prompt, max_tokens=self.tokens,
                                                   temperature=0, stream=True)  # fmt: skip
                out.answer = "".join(c.choices[0].text or "" for c in chunks if c.choices)
            else:
                done = client.completions.create(model=self.model, prompt=self.prompt, max_tokens=self.tokens,
                                                 temperature=0)  # fmt: skip
                out.answer = done.choices[0].text
        except openai.OpenAIError as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        out.seconds = time.monotonic() - sent
        self.outcomes.append(out)

    def _run(self) -> None:
        n, start = 0, time.monotonic()
        while not self.stop.wait(max(0.0, start + n / self.rate - time.monotonic())):
            thread = threading.Thread(target=self._one, args=(n,))
            thread.start()
            self.threads.append(thread)
            n += 1

    @contextmanager
    def running(self) -> Iterator[Stream]:
        sender = threading.Thread(target=self._run)
        sender.start()
        try:
            yield self
        finally:
            self.stop.set()
            sender.join()
            for thread in self.threads:
                thread.join(150)

    def check(self, whole: str | None = WHOLE) -> float:
        """Every request answered whole (``whole``; None: any answer that is not empty); the
        longest time one took (its wait included)."""
        assert len(self.outcomes) == len(self.threads) and self.outcomes
        failed = [o for o in self.outcomes if o.error or not o.answer or (whole is not None and o.answer != whole)]
        assert not failed, f"{len(failed)} of {len(self.outcomes)} failed: {failed[:3]}"
        return max(o.seconds for o in self.outcomes)


def _held_rows(state: Path) -> list[dict]:
    time.sleep(0.7)  # the request log is written in batches
    out = cli(state, "gateway", "log", "--json", "--limit", "5000")
    assert out.returncode == 0, out.stderr
    return [r for r in json.loads(out.stdout) if r["held"]]


def _recipe(tmp_path: Path, name: str, extra: str = "") -> Path:
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port(), env={"STANDIN_HEAD_DELAY": str(HEAD_DELAY_S)})
    with (recipe / "recipe.toml").open("a") as fh:
        fh.write(VARIANTS + extra)
    return recipe


def test_rollback_behind_the_gateway_loses_no_request(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name, state = "test-zerodrop-rollback", Path(os.environ["SPARKFLEET_STATE_DIR"])
    recipe = _recipe(tmp_path, name)
    cluster = str(fleet2.cluster_file)
    assert cli(state, "up", str(recipe), "--cluster", cluster, timeout=120).returncode == 0
    assert cli(state, "down", name).returncode == 0
    up = cli(state, "up", str(recipe), "--cluster", cluster, "--variant", "fast", timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        with gateway(state) as gw:
            stream = Stream(gw.url, "org/standin")
            with stream.running():
                time.sleep(2.0)
                start = time.monotonic()
                back = cli(state, "rollback", name, timeout=120)
                took = time.monotonic() - start
                time.sleep(2.0)
            assert back.returncode == 0, back.stderr
            longest = stream.check()
            held = _held_rows(state)
        print(
            f"rollback {took:.1f}s under {RATE:g} req/s: {len(stream.outcomes)} requests, all whole; "
            f"{len(held)} held, longest wait {max(r['held'] for r in held):.1f}s, longest request {longest:.1f}s"
        )
        assert "rolled back" in back.stdout and "variant base" in back.stdout
        # The requests that came while no replica was ready waited and were answered.
        assert len(held) >= 2 * RATE
        assert [(r["status"], r["error"]) for r in held if r["status"] != 200] == []
        assert HEAD_DELAY_S - 1 < max(r["held"] for r in held) < took + 1
        said = " ".join(back.stdout.split())
        assert f"behind the gateway: {len(held)} request(s) held" in said, back.stdout
        status = json.loads(cli(state, "status", name, "--json").stdout)[0]
        kinds = [c["kind"] for c in status["changes"]]
        assert kinds[-3:] == ["drained", "held", "released"], status["changes"]
        assert "new requests held" in status["changes"][-3]["message"]
    finally:
        cli(state, "down", name)
    assert leftover_processes(name) == []


def test_a_restart_after_a_killed_rank_holds_requests_and_answers_them(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name, state = "test-zerodrop-restart", Path(os.environ["SPARKFLEET_STATE_DIR"])
    recipe = _recipe(tmp_path, name, '[serve]\nrestart = "on-failure"\nmax_restarts = 2\nbackoff = 1\n')
    assert cli(state, "up", str(recipe), "--cluster", str(fleet2.cluster_file), timeout=120).returncode == 0
    out = tmp_path / "watch.out"
    try:
        with gateway(state) as gw, watching(name, out):
            _wait_polled(out)
            # Not streamed: an answer cut by the kill had sent the client nothing yet, so the
            # gateway may ask again (a streamed answer already under way cannot be replayed).
            stream = Stream(gw.url, "org/standin", streamed=False)
            with stream.running():
                time.sleep(1.5)
                os.kill(_engine_pid(name, 0), signal.SIGKILL)
                _wait_event(name, "restarted", 90)
                time.sleep(2.0)
            longest = stream.check()
            held = _held_rows(state)
        print(f"restart under {RATE:g} req/s: {len(stream.outcomes)} requests, all whole; {len(held)} held, "
              f"longest wait {max(r['held'] for r in held):.1f}s")  # fmt: skip
        assert len(held) >= 2 * RATE and all(r["status"] == 200 for r in held)
        assert max(r["held"] for r in held) > HEAD_DELAY_S - 1 and longest < 60
        kinds = [e["kind"] for e in json.loads(cli(state, "status", name, "--json").stdout)[0]["changes"]]
        assert kinds[-3:] == ["drained", "held", "released"], kinds
    finally:
        cli(state, "down", name)
    assert leftover_processes(name) == []


def test_up_replace_where_both_cannot_run_goes_one_after_the_other_and_loses_no_request(tmp_path: Path) -> None:
    """On this machine: NEW wants OLD's port, so it cannot come up beside it; `up --replace` drains
    OLD (new requests held), stops it, brings NEW up, and the held requests go to NEW."""
    state = Path(os.environ["SPARKFLEET_STATE_DIR"])
    old, new = "test-zerodrop-old", "test-zerodrop-new"
    recipe = standin_recipe(tmp_path / "r", nodes=1, port=free_port(), env={"STANDIN_HEAD_DELAY": str(HEAD_DELAY_S)})
    assert cli(state, "up", str(recipe), "--name", old, timeout=120).returncode == 0
    try:
        with gateway(state) as gw:
            stream = Stream(gw.url, "org/standin")
            with stream.running():
                time.sleep(1.5)
                moved = cli(state, "up", str(recipe), "--name", new, "--replace", old, timeout=120)
                time.sleep(1.5)
            assert moved.returncode == 0, moved.stderr
            stream.check()
            held = _held_rows(state)
        print(f"up --replace under {RATE:g} req/s: {len(stream.outcomes)} requests, all whole; {len(held)} held, "
              f"longest wait {max(r['held'] for r in held):.1f}s")  # fmt: skip
        said = " ".join((moved.stdout + moved.stderr).split())
        assert f"port {recipe_port(recipe)} on" in said and "one after the other" in said, said
        assert f"{len(held)} request(s) held" in said and len(held) >= 2 * RATE
        statuses = {d["name"]: d["status"] for d in json.loads(cli(state, "status", "--json").stdout)}
        assert statuses == {old: "stopped", new: "ready"}
        kinds = [c["kind"] for c in json.loads(cli(state, "status", old, "--json").stdout)[0]["changes"]]
        assert kinds[-4:] == ["drained", "held", "released", "switched"], kinds
    finally:
        cli(state, "down", new)
        cli(state, "down", old)
    assert leftover_processes(old) == [] and leftover_processes(new) == []


def recipe_port(recipe: Path) -> int:
    line = next(x for x in (recipe / "recipe.toml").read_text().splitlines() if x.startswith("port = "))
    return int(line.split("=")[1])


def test_an_ab_night_behind_the_gateway_loses_no_request(tmp_path: Path) -> None:
    """`ab` takes one variant down and brings the next up under the same name, round after round:
    the requests that come meanwhile wait and go to the next variant."""
    state = Path(os.environ["SPARKFLEET_STATE_DIR"])
    name = "test-zerodrop-ab"
    recipe = standin_recipe(tmp_path / "ab", nodes=1, port=free_port(), env={"STANDIN_HEAD_DELAY": "2"})
    with (recipe / "recipe.toml").open("a") as fh:
        fh.write(VARIANTS)
    argv = ["ab", str(recipe), "--variants", "base,fast", "--name", name, "--rounds", "2", "--output-len", "16",
            "--repeats", "2"]  # fmt: skip
    with gateway(state) as gw:
        with (tmp_path / "ab.out").open("w") as out:
            env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state)}
            proc = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", *argv], stdout=out,
                                    stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            _wait_event(name, "ready", 120)
            stream = Stream(gw.url, "org/standin")
            with stream.running():
                _wait_event(name, "ready", 180, after=2)  # two changes of variant while the stream runs
                time.sleep(1.0)
            assert proc.wait(300) == 0, (tmp_path / "ab.out").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stream.check()
        held = _held_rows(state)
    print(f"ab under {RATE:g} req/s: {len(stream.outcomes)} requests, all whole; {len(held)} held, "
          f"longest wait {max(r['held'] for r in held):.1f}s")  # fmt: skip
    assert len(held) >= RATE
    kinds = [e["kind"] for e in json.loads(cli(state, "status", name, "--json").stdout)[0]["changes"]]
    assert "held" in kinds and "released" in kinds, kinds
    assert leftover_processes(name) == []
