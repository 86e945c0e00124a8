"""`sparkfleet gateway serve` driven by the official openai client, in front of known-timing
stand-in engines (tests/replay_server.py: real HTTP, scripted tokens, a live count of the answers
it is streaming, so an upstream cancellation is seen as that count dropping)."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import Running, cli, gateway
from tests.replay_server import ReplayServer, Script, prompt_text

LOOP = (" a", " b")  # a stand-in answer that repeats itself with period 2


def script_for(body: dict[str, Any]) -> Script:
    """How the stand-ins answer, chosen by a word in the prompt."""
    text = prompt_text(body)
    fast = Script(base_ttft=0.002, itl=0.001, role_chunk=False)
    if "LOOPLINES" in text:
        return Script(base_ttft=0.002, itl=0.002, pattern=("same line\n",), role_chunk=False)
    if "LOOP" in text:
        return Script(base_ttft=0.002, itl=0.002, pattern=LOOP, role_chunk=False)
    if "BULK" in text:  # as fast as the server can write
        return Script(base_ttft=0.0, itl=0.0, role_chunk=False)
    if "SLOW" in text:
        return Script(base_ttft=0.002, itl=0.05, role_chunk=False)
    return fast


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Setup:
    a: ReplayServer
    b: ReplayServer
    gw: Running
    state: Path
    dead_port: int  # a replica of route "flaky" that is down until a test starts it
    later_port: int  # the replica of route "later", down until a test starts it
    keys: dict[str, str] = field(repr=False)  # name -> value (kept out of pytest's failure reports)

    def client(self, key: str = "alice") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gw.url, api_key=self.keys.get(key, key), max_retries=0, timeout=30)

    def log(self) -> list[dict[str, Any]]:
        time.sleep(0.7)  # the log is written in batches every 0.5 s
        out = cli(self.state, "gateway", "log", "--json", "--limit", "1000")
        assert out.returncode == 0, out.stderr
        return list(json.loads(out.stdout))


def create_key(state: Path, *args: str) -> str:
    out = cli(state, "gateway", "key", "create", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


CONFIG = """
max_body_bytes = 65536
health_interval = 0.3
client_timeout = 1
retry_after = 7

[routes.replay]
targets = ["{a}", "{b}"]
upstream_model = "replay-model"
max_new_tokens = 100000

[routes.replay.aliases.replay-thinking]
chat_template_kwargs = {{ enable_thinking = true }}

[routes.capped]
targets = ["{a}"]
upstream_model = "replay-model"
max_new_tokens = 64

[routes.other]
targets = ["{a}"]
upstream_model = "replay-model"
loop_abort = false

[routes.bulk]
targets = ["{a}"]
upstream_model = "replay-model"
max_new_tokens = 0
loop_abort = false

[routes.flaky]
targets = ["http://127.0.0.1:{dead}", "{a}"]
upstream_model = "replay-model"

[routes.down]
targets = ["http://127.0.0.1:{never}"]
upstream_model = "replay-model"
hold_wait = 0

[routes.held]
targets = ["http://127.0.0.1:{never}"]
upstream_model = "replay-model"
hold_queue = 2
hold_wait = 1.5

[routes.later]
targets = ["http://127.0.0.1:{later}"]
upstream_model = "replay-model"
hold_wait = 20
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    state = tmp_path_factory.mktemp("gateway-state")
    keys = {
        "alice": create_key(state, "alice"),
        "bob": create_key(state, "bob", "--models", "other"),
        "slowpoke": create_key(state, "slowpoke", "--rpm", "2"),
    }
    dead, later = free_port(), free_port()
    with ReplayServer(script_for).running() as a, ReplayServer(script_for).running() as b:
        config = state / "gateway.toml"
        config.write_text(CONFIG.format(a=a.url, b=b.url, dead=dead, never=free_port(), later=later))
        with gateway(state, "--config", str(config)) as gw:
            yield Setup(a, b, gw, state, dead, later, keys)


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def wait_for(cond: Callable[[], bool], timeout: float) -> float:
    """Seconds until cond() held; fails after timeout."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


# -- answers pass through whole ------------------------------------------------------------------


def test_streamed_chat_and_completion_arrive_whole(setup: Setup) -> None:
    c = setup.client()
    stream = c.chat.completions.create(model="replay", messages=chat("hi"), max_tokens=12, stream=True,
                                       stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "".join(f" t{i}" for i in range(12))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["length"]
    # No include_usage asked: the gateway asked for it (for its log) and the client gets none.
    plain = list(c.completions.create(model="replay", prompt="hi", max_tokens=5, stream=True))
    assert "".join(ch.choices[0].text for ch in plain if ch.choices) == " t0 t1 t2 t3 t4"
    assert all(ch.usage is None for ch in plain)


def test_non_streamed_request_is_assembled_from_the_stream(setup: Setup) -> None:
    c = setup.client()
    answer = c.chat.completions.create(model="replay", messages=chat("hi"), max_tokens=7)
    assert answer.choices[0].message.content == "".join(f" t{i}" for i in range(7))
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 7
    assert setup.a.bodies[-1]["stream"] is True or setup.b.bodies[-1]["stream"] is True


def test_alias_adds_its_fields_and_asks_for_the_real_model(setup: Setup) -> None:
    c = setup.client()
    n = len(setup.a.bodies) + len(setup.b.bodies)
    c.chat.completions.create(model="replay-thinking", messages=chat("hi"), max_tokens=2)
    bodies = setup.a.bodies + setup.b.bodies
    assert len(bodies) == n + 1
    sent = max(setup.a.bodies[-1:] + setup.b.bodies[-1:], key=lambda b: "chat_template_kwargs" in b)
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    assert sent["model"] == "replay-model"
    # A client's own table is merged with the alias's.
    c.chat.completions.create(model="replay-thinking", messages=chat("hi"), max_tokens=2,
                              extra_body={"chat_template_kwargs": {"effort": 3}})  # fmt: skip
    sent = max(setup.a.bodies[-1:] + setup.b.bodies[-1:], key=lambda b: "effort" in b.get("chat_template_kwargs", {}))
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "effort": 3}


def test_embeddings_pass_through(setup: Setup) -> None:
    answer = setup.client().embeddings.create(model="replay", input=["abcd", "abcdefgh"])
    assert [e.embedding for e in answer.data] == [[4.0, 1.0], [8.0, 1.0]]
    assert answer.usage.prompt_tokens == 3


# -- keys --------------------------------------------------------------------------------------


def test_models_lists_only_the_keys_models(setup: Setup) -> None:
    assert {m.id for m in setup.client("alice").models.list()} == {
        "replay", "replay-thinking", "capped", "other", "bulk", "flaky", "down", "held", "later"}  # fmt: skip
    assert [m.id for m in setup.client("bob").models.list()] == ["other"]


def test_missing_wrong_and_out_of_scope_keys_are_refused(setup: Setup) -> None:
    with pytest.raises(openai.AuthenticationError) as wrong:
        setup.client("sf-00000000-not-a-real-key").chat.completions.create(model="replay", messages=chat("x"))
    assert wrong.value.status_code == 401
    assert "not-a-real-key" not in str(wrong.value)
    r = httpx.post(setup.gw.url + "/chat/completions", json={"model": "replay", "messages": chat("x")})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.NotFoundError) as outside:
        setup.client("bob").chat.completions.create(model="replay", messages=chat("x"), max_tokens=2)
    assert "available: other" in str(outside.value)


def test_revoke_and_create_take_effect_on_the_next_request(setup: Setup) -> None:
    carol = setup.keys["carol"] = create_key(setup.state, "carol", "--models", "replay")
    c = setup.client(carol)
    assert c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2).choices
    out = cli(setup.state, "gateway", "key", "revoke", "carol")
    assert out.returncode == 0, out.stderr
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2)


def test_expired_key_is_refused(setup: Setup) -> None:
    brief = setup.keys["brief"] = create_key(setup.state, "brief", "--expires", "2s")
    c = setup.client(brief)
    assert c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2).choices
    time.sleep(2.1)
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2)


def test_over_the_rpm_limit_gets_429_with_retry_after(setup: Setup) -> None:
    c = setup.client("slowpoke")
    for _ in range(2):
        c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2)
    with pytest.raises(openai.RateLimitError) as limited:
        c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2)
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
    assert limited.value.body["type"] == "rate_limit_error"  # type: ignore[index]


# -- the output cap ------------------------------------------------------------------------------


def test_output_cap_fills_and_clamps_and_says_so(setup: Setup) -> None:
    c = setup.client()
    raw = c.chat.completions.with_raw_response.create(model="capped", messages=chat("x"), max_tokens=1000)
    assert raw.headers["x-sparkfleet-output-cap"] == "clamped max_tokens=1000->64"
    assert raw.parse().usage.completion_tokens == 64  # type: ignore[union-attr]
    assert setup.a.bodies[-1]["max_tokens"] == 64
    raw = c.chat.completions.with_raw_response.create(model="capped", messages=chat("x"),
                                                      max_completion_tokens=500)  # fmt: skip
    assert raw.headers["x-sparkfleet-output-cap"] == "clamped max_completion_tokens=500->64"
    raw = c.completions.with_raw_response.create(model="capped", prompt="x")
    assert raw.headers["x-sparkfleet-output-cap"] == "filled max_tokens=64"
    assert setup.a.bodies[-1]["max_tokens"] == 64
    raw = c.chat.completions.with_raw_response.create(model="capped", messages=chat("x"), max_tokens=10)
    assert "x-sparkfleet-output-cap" not in raw.headers
    assert raw.parse().usage.completion_tokens == 10  # type: ignore[union-attr]


# -- the loop abort ------------------------------------------------------------------------------


def test_loop_abort_ends_the_stream_with_stop_and_a_marker_and_frees_the_engine(setup: Setup) -> None:
    c = setup.client()
    stream = c.chat.completions.create(model="replay", messages=chat("LOOP"), max_tokens=50_000, stream=True)
    chunks = []
    for chunk in stream:  # up to the stop, not on to [DONE]: the client keeps its connection open
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].finish_reason:
            break
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "[sparkfleet gateway: answer stopped, it was repeating itself (4 copies of a 32-token stretch)]" in text
    assert text.startswith(" a b a b")
    assert text.count(" a b") == 64  # 128 tokens: four copies of 32, then the stop
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The stand-in would stream for 100 s; it stops as soon as the gateway closes its connection.
    wait_for(lambda: setup.a.open_streams + setup.b.open_streams == 0, 1.0)
    assert not list(stream)  # then [DONE], and the answer ends
    stream.close()


def test_loop_abort_on_identical_lines_and_on_a_non_streamed_request(setup: Setup) -> None:
    c = setup.client()
    answer = c.completions.create(model="replay", prompt="LOOPLINES", max_tokens=50_000)
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].text.startswith("same line\n" * 8)
    assert "(8 identical lines in a row)]" in answer.choices[0].text
    wait_for(lambda: setup.a.open_streams + setup.b.open_streams == 0, 1.0)


def test_loop_abort_off_lets_the_loop_run(setup: Setup) -> None:
    stream = setup.client().chat.completions.create(model="other", messages=chat("LOOP"), max_tokens=300,
                                                    stream=True)  # fmt: skip
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == " a b" * 150


# -- routing ----------------------------------------------------------------------------------


def test_client_going_away_cancels_the_upstream_request(setup: Setup) -> None:
    stream = setup.client().chat.completions.create(model="replay", messages=chat("SLOW"), max_tokens=2000,
                                                    stream=True)  # fmt: skip
    for i, _ in enumerate(stream):
        if i == 3:
            break
    assert setup.a.open_streams + setup.b.open_streams == 1
    stream.close()
    wait_for(lambda: setup.a.open_streams + setup.b.open_streams == 0, 1.0)


def test_a_client_that_stops_reading_is_dropped_and_its_engine_request_cancelled(setup: Setup) -> None:
    host, port = setup.gw.root.removeprefix("http://").split(":")
    body = json.dumps({"model": "bulk", "messages": chat("BULK"), "max_tokens": 2_000_000, "stream": True})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {setup.keys['alice']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        stalled.sendall(head.encode() + body.encode())  # and never reads the answer
        wait_for(lambda: setup.a.open_streams == 1, 5.0)
        # The gateway stops reading the engine once the client's buffers are full, drops the
        # client after client_timeout (1 s) of that, and the engine's stream ends.
        wait_for(lambda: setup.a.open_streams == 0, 15.0)
        assert setup.client().chat.completions.create(model="replay", messages=chat("x"), max_tokens=2).choices
    rows = [r for r in setup.log() if r["model"] == "bulk"]
    assert rows[-1]["status"] == 499 and rows[-1]["error"] == "the client read nothing for 1 s"


def test_least_outstanding_requests_spreads_over_replicas(setup: Setup) -> None:
    a0, b0 = len(setup.a.bodies), len(setup.b.bodies)
    c = setup.client()

    def one() -> None:
        list(c.chat.completions.create(model="replay", messages=chat("SLOW"), max_tokens=10, stream=True))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert (len(setup.a.bodies) - a0, len(setup.b.bodies) - b0) == (4, 4)


def test_a_replica_that_is_down_is_skipped_then_taken_back_once_it_answers(setup: Setup) -> None:
    c = setup.client()
    for _ in range(3):
        assert c.chat.completions.create(model="flaky", messages=chat("x"), max_tokens=2).choices
    with ReplayServer(script_for).running(setup.dead_port) as revived:
        time.sleep(0.7)  # the gateway probes the replicas it took out every 0.3 s
        for _ in range(6):
            c.chat.completions.create(model="flaky", messages=chat("x"), max_tokens=2)
        assert revived.bodies, "the replica was not taken back"
    rows = [r for r in setup.log() if r["model"] == "flaky"]
    assert {r["status"] for r in rows} == {200}  # the down replica cost no request an error


def test_engine_errors_are_retried_on_another_replica(setup: Setup) -> None:
    a_before, b_before = len(setup.a.bodies), len(setup.b.bodies)
    setup.b.script = lambda body: Script(status=500)
    try:
        for _ in range(4):
            answer = setup.client().chat.completions.create(model="replay", messages=chat("x"), max_tokens=3)
            assert answer.choices[0].message.content == " t0 t1 t2"
    finally:
        setup.b.script = script_for
    assert len(setup.a.bodies) - a_before == 4
    assert len(setup.b.bodies) > b_before  # the failing replica was tried, and each of its 500s retried


def test_no_replica_up_is_503_with_retry_after(setup: Setup) -> None:
    with pytest.raises(openai.InternalServerError) as down:
        setup.client().chat.completions.create(model="down", messages=chat("x"), max_tokens=2)
    assert down.value.status_code == 503
    assert down.value.response.headers["retry-after"] == "7"


# -- hold: requests wait for a replica, within limits (issue 34) -------------------------------


def _held(setup: Setup, model: str) -> float:
    """Requests waiting for model now, as /metrics says."""
    text = httpx.get(setup.gw.root + "/metrics", headers={"authorization": f"Bearer {setup.keys['alice']}"}).text
    found = re.search(rf'^sparkfleet_gateway_held{{model="{model}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # the test reads it
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_past_the_queue_or_wait_limit_is_503_with_retry_after_and_health_answers(setup: Setup) -> None:
    c = setup.client()
    ask = lambda: c.chat.completions.create(model="held", messages=chat("x"), max_tokens=2)  # noqa: E731
    waiting = [_in_thread(ask) for _ in range(2)]
    wait_for(lambda: _held(setup, "held") == 2, 5.0)
    # The queue holds its limit (hold_queue = 2): the next one is refused at once.
    start = time.monotonic()
    with pytest.raises(openai.InternalServerError) as full:
        ask()
    assert time.monotonic() - start < 1.0
    assert full.value.status_code == 503 and full.value.response.headers["retry-after"] == "7"
    assert "hold_queue" in full.value.message
    # The gateway answers the rest while requests wait.
    assert httpx.get(setup.gw.root + "/health").json() == {"status": "ok"}
    assert c.chat.completions.create(model="replay", messages=chat("x"), max_tokens=2).choices
    # Past hold_wait = 1.5 s the held ones get 503 too, with Retry-After.
    for thread, out in waiting:
        thread.join(10)
        assert isinstance(out[0], openai.InternalServerError), out
        assert out[0].status_code == 503 and out[0].response.headers["retry-after"] == "7"
        assert "hold_wait" in out[0].message
    assert _held(setup, "held") == 0
    rows = [r for r in setup.log() if r["model"] == "held"]
    assert sorted(r["status"] for r in rows) == [503, 503, 503]
    assert sorted(round(r["held"] or 0, 1) for r in rows)[1:] == [1.5, 1.5]


def test_held_requests_go_through_in_arrival_order_once_a_replica_is_up(setup: Setup) -> None:
    c = setup.client()

    def ask(prompt: str) -> Any:
        return c.chat.completions.create(model="later", messages=chat(prompt), max_tokens=2)

    threads = []
    for i in range(3):
        threads.append(_in_thread(functools.partial(ask, f"n{i}")))
        wait_for(functools.partial(lambda n: _held(setup, "later") == n, i + 1), 5.0)
    # One client gives up while it waits: it leaves the queue.
    quitter = setup.client().with_options(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        quitter.chat.completions.create(model="later", messages=chat("quitter"), max_tokens=2)
    wait_for(lambda: _held(setup, "later") == 3, 5.0)
    with ReplayServer(script_for).running(setup.later_port) as revived:
        for thread, out in threads:
            thread.join(15)
            assert out and out[0].choices[0].message.content == " t0 t1", out
        order = [prompt_text(b) for b in revived.bodies]
    assert order == ["n0", "n1", "n2"]  # arrival order; the client that gave up never reached the engine
    rows = {r["request_id"]: r for r in setup.log() if r["model"] == "later"}
    assert sorted(r["status"] for r in rows.values()) == [200, 200, 200, 499]
    assert all(r["held"] > 0.3 for r in rows.values() if r["status"] == 200)


def test_the_admin_endpoint_answers_on_its_loopback_port_with_its_token_only(setup: Setup) -> None:
    [file] = list((setup.state / "gateways").glob("*.json"))
    assert file.stat().st_mode & 0o777 == 0o600
    admin = json.loads(file.read_text())
    assert admin["url"].startswith("http://127.0.0.1:") and admin["url"] != setup.gw.root
    state = httpx.get(admin["url"] + "/admin/state", headers={"authorization": f"Bearer {admin['token']}"})
    assert state.status_code == 200 and "replay" in state.json()["routes"]
    assert httpx.get(admin["url"] + "/admin/state", headers={"authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(admin["url"] + "/admin/state").status_code == 401
    # Not on the port clients use, whatever they send.
    wrong = httpx.get(setup.gw.root + "/admin/state", headers={"authorization": f"Bearer {admin['token']}"})
    assert wrong.status_code == 404


# -- bad input --------------------------------------------------------------------------------


def test_bad_input_gets_clear_openai_shaped_errors_and_the_gateway_keeps_serving(setup: Setup) -> None:
    auth = {"authorization": f"Bearer {setup.keys['alice']}"}
    url = setup.gw.url
    r = httpx.post(url + "/chat/completions", content=b'{"model": "replay", ', headers=auth)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/chat/completions", content=b"x" * 70_000, headers=auth)
    assert r.status_code == 413
    r = httpx.post(url + "/chat/completions", json={"model": "gpt-17", "messages": []}, headers=auth)
    assert r.status_code == 404 and "gpt-17" in r.json()["error"]["message"]
    assert "available: bulk, capped, down, flaky, held, later, other, replay, replay-thinking" in (
        r.json()["error"]["message"])  # fmt: skip
    r = httpx.get(url + "/engines", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert httpx.get(setup.gw.root + "/health").json() == {"status": "ok"}
    assert setup.client().chat.completions.create(model="replay", messages=chat("x"), max_tokens=2).choices


# -- request log and metrics ------------------------------------------------------------------


def test_request_log_has_a_row_per_request_without_bodies(setup: Setup) -> None:
    raw = setup.client().chat.completions.with_raw_response.create(model="capped", messages=chat("SECRET-PROMPT"),
                                                                   max_tokens=100)  # fmt: skip
    rid = raw.headers["x-request-id"]
    setup.client().completions.create(model="replay", prompt="LOOPLINES", max_tokens=1000)
    with pytest.raises(openai.AuthenticationError):
        setup.client("sf-0-wrong").chat.completions.create(model="replay", messages=chat("x"))
    rows = {r["request_id"]: r for r in setup.log()}
    row = rows[rid]
    assert (row["key_name"], row["model"], row["deployment"], row["status"]) == ("alice", "capped", setup.a.url, 200)
    assert (row["completion_tokens"], row["finish_reason"], row["clamped"], row["loop_aborted"]) == (64, "length", 1, 0)
    assert 0 < row["ttft"] <= row["e2e"]
    assert row["request_body"] is None and row["response_text"] is None
    assert any(r["loop_aborted"] == 1 and r["finish_reason"] == "stop" for r in rows.values())
    assert any(r["status"] == 401 for r in rows.values())
    assert "SECRET-PROMPT" not in (setup.state / "gateway.db").read_bytes().decode("latin-1")
    table = cli(setup.state, "gateway", "log", "--since", "1h")
    assert rid in table.stdout


def test_metrics_count_requests_by_model_status_and_key_name(setup: Setup) -> None:
    text = httpx.get(setup.gw.root + "/metrics", headers={"authorization": f"Bearer {setup.keys['alice']}"}).text
    assert 'sparkfleet_gateway_requests_total{key="alice",model="replay",status="200"}' in text
    assert 'sparkfleet_gateway_loop_aborts_total{model="replay"}' in text
    assert 'sparkfleet_gateway_output_cap_total{model="capped"}' in text
    assert "sparkfleet_gateway_ttft_seconds_bucket" in text


def test_no_key_value_anywhere(setup: Setup) -> None:
    """Every output, log, table, file and scrape the gateway and its CLI produce, searched for every
    key's value (and its secret part alone)."""
    texts = {"gateway output": setup.gw.output.read_text()}
    for args in (("gateway", "key", "list"), ("gateway", "key", "list", "--json"), ("gateway", "log", "--json"),
                 ("gateway", "log"), ("status",)):  # fmt: skip
        out = cli(setup.state, *args)
        texts[" ".join(args)] = out.stdout + out.stderr
    for path in setup.state.rglob("*"):
        if path.is_file():
            texts[str(path)] = path.read_bytes().decode("latin-1")
    auth = {"authorization": f"Bearer {setup.keys['alice']}"}
    texts["metrics"] = httpx.get(setup.gw.root + "/metrics", headers=auth).text
    texts["models"] = httpx.get(setup.gw.url + "/models", headers=auth).text
    # Revoked and expired keys (from the tests above): refused, and the refusal must not echo them.
    for name in [n for n in ("carol", "brief") if n in setup.keys]:
        texts[f"401 {name}"] = httpx.get(setup.gw.url + "/models",
                                         headers={"authorization": f"Bearer {setup.keys[name]}"}).text  # fmt: skip
        assert "authentication_error" in texts[f"401 {name}"]
    assert sum(len(t) for t in texts.values()) > 10_000  # the search saw real content
    for name, value in setup.keys.items():
        secret = value.split("-", 2)[2]
        for where, text in texts.items():
            assert value not in text and secret not in text, f"key {name} appears in {where}"


# -- serving without a config, and refusing to serve --------------------------------------------


def test_routes_come_from_the_state_store_and_follow_its_changes(tmp_path: Path) -> None:
    from sparkfleet.state.deployments import SCHEMA
    from sparkfleet.state.store import Store

    store = Store(tmp_path / "state.db")
    store.ensure(SCHEMA)
    with ReplayServer(script_for).running() as engine, store.connect() as conn:
        conn.execute(
            "INSERT INTO deployments (name, engine, recipe, cluster, endpoint, served_model, status, created,"
            " updated, ranks_json) VALUES ('dep1', 'vllm', 'r', 'local', ?, 'replay-model', 'ready', 0, 0, '[]')",
            (engine.url,),
        )
    with ReplayServer(script_for).running() as engine:
        with store.connect() as conn:
            conn.execute("UPDATE deployments SET endpoint = ?", (engine.url,))
        with gateway(tmp_path) as gw:
            c = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
            assert [m.id for m in c.models.list()] == ["replay-model"]
            answer = c.chat.completions.create(model="replay-model", messages=chat("x"), max_tokens=3)
            assert answer.choices[0].message.content == " t0 t1 t2"
            with store.connect() as conn:
                conn.execute("UPDATE deployments SET status = 'stopped'")
            wait_for(lambda: not list(c.models.list()), 5.0)
            with pytest.raises(openai.NotFoundError):
                c.chat.completions.create(model="replay-model", messages=chat("x"), max_tokens=3)


def test_a_recipes_serve_section_gives_its_deployment_route_cap_and_aliases(tmp_path: Path) -> None:
    from tests.integration.conftest import leftover_processes, standin_recipe

    recipe = standin_recipe(tmp_path / "standin", nodes=1, port=free_port())
    with (recipe / "recipe.toml").open("a") as fh:
        fh.write('[serve]\nmax_new_tokens = 7\nloop_abort = false\nrequest_defaults = { temperature = 0.5 }\n'
                 '[serve.aliases."org/standin-fast"]\ntop_k = 1\n')  # fmt: skip
    name = f"test-gw-serve-{os.getpid()}"
    state = tmp_path / "state"
    up = cli(state, "up", str(recipe), "--name", name, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        with gateway(state) as gw:
            c = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0)
            assert sorted(m.id for m in c.models.list()) == ["org/standin", "org/standin-fast"]
            raw = c.completions.with_raw_response.create(model="org/standin-fast", prompt="x", stream=True)
            assert raw.headers["x-sparkfleet-output-cap"] == "filled max_tokens=7"
            assert "".join(ch.choices[0].text for ch in raw.parse() if ch.choices) == "".join(
                f" t{i}" for i in range(7)
            )
    finally:
        assert cli(state, "down", name).returncode == 0
        assert not leftover_processes(name)


def test_off_loopback_without_keys_is_refused_unless_no_auth(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "gateway", "serve", "--host", "0.0.0.0", "--port", "0"]
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path)}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**_env(), **env})
    assert out.returncode == 2
    assert "off loopback the gateway needs API keys" in out.stderr
    with gateway(tmp_path, "--host", "0.0.0.0", "--no-auth") as gw:
        assert "no keys (--no-auth)" in gw.output.read_text()


def test_a_mistake_in_the_config_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[routes.m]\ntargets = ["x"]\nmax_new_token = 5\n')
    out = cli(tmp_path, "gateway", "serve", "--config", str(config))
    assert out.returncode == 2
    assert f"{config} [routes.'m']: unknown key 'max_new_token'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_tls_and_logged_bodies(tmp_path: Path) -> None:
    cert, key = tmp_path / "gw.crt", tmp_path / "gw.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    with ReplayServer(script_for).running() as engine:
        config = tmp_path / "gw.toml"
        config.write_text(f'tls_cert = "{cert}"\ntls_key = "{key}"\nlog_bodies = true\n'
                          f'[routes.m]\ntargets = ["{engine.url}"]\nupstream_model = "replay-model"\n')  # fmt: skip
        with gateway(tmp_path, "--config", str(config)) as gw:
            assert gw.url.startswith("https://")
            c = openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0,
                              http_client=httpx.Client(verify=ssl.create_default_context(cafile=cert)))  # fmt: skip
            answer = c.chat.completions.create(model="m", messages=chat("remember this"), max_tokens=3)
            assert answer.choices[0].message.content == " t0 t1 t2"
            time.sleep(0.7)
            rows = json.loads(cli(tmp_path, "gateway", "log", "--json").stdout)
            # Ctrl-C with the client's connection still pooled: it stops at once (a TLS close waited
            # for the client's close_notify, 30 s, before the gateway cut idle connections).
            started = time.monotonic()
            gw.proc.send_signal(signal.SIGINT)
            gw.proc.wait(30)
            assert time.monotonic() - started < 5
            c.close()
    assert rows[-1]["request_body"]["messages"] == chat("remember this")
    assert rows[-1]["response_text"] == " t0 t1 t2"


def test_export_systemd_gateway_writes_a_unit_that_verifies_and_serves(tmp_path: Path) -> None:
    import shlex

    config = tmp_path / "gw.toml"
    config.write_text("port = 0\n")
    unit = tmp_path / "sparkfleet-gateway.service"
    out = cli(tmp_path, "export", "systemd", "gateway", "--config", str(config), "--out", str(unit))
    assert out.returncode == 0, out.stderr
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    text = unit.read_text()
    env = dict(shlex.split(line.removeprefix("Environment="))[0].split("=", 1)
               for line in text.splitlines() if line.startswith("Environment="))  # fmt: skip
    assert env["SPARKFLEET_STATE_DIR"] == str(tmp_path.resolve())
    argv = shlex.split(next(line for line in text.splitlines() if line.startswith("ExecStart="))[len("ExecStart=") :])
    assert argv[3:] == ["gateway", "serve", "--config", str(config.resolve())]
    assert "RestartPreventExitStatus=2" in text
    log = tmp_path / "unit.out"
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin", **env})
    try:
        wait_for(lambda: "gateway on" in log.read_text() or proc.poll() is not None, 30.0)
        url = re.search(r"gateway on (\S+)/v1", log.read_text())
        assert url, log.read_text()
        assert httpx.get(url.group(1) + "/health").json() == {"status": "ok"}
    finally:
        proc.send_signal(signal.SIGTERM)  # systemctl stop
        assert proc.wait(15) == -signal.SIGTERM
    bad = cli(tmp_path, "export", "systemd", "gateway", "--config", str(tmp_path / "missing.toml"))
    assert bad.returncode == 2 and "missing.toml" in bad.stderr


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_gateway_db_is_private(setup: Setup) -> None:
    assert (setup.state / "gateway.db").stat().st_mode & 0o777 == 0o600
    conn = sqlite3.connect(setup.state / "gateway.db")
    stored = conn.execute("SELECT hash FROM keys").fetchall()
    assert all(len(h) == 32 for (h,) in stored)  # SHA-256 digests, not the keys
