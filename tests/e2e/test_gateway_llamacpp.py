"""The gateway in front of real llama.cpp engines: llama.cpp's own llama-server (examples/
gemma-llamacpp, with --metrics) and llama-cpp-python's server (examples/gemma-llamacpp-python),
each under its own name and port, the route read from the state store it was brought up with.

The loop is a real one: Gemma 3 270M base, greedy, continuing six copies of one line, repeats that
line for as long as it is let (max_tokens 3000: minutes of decoding on this machine). The gateway
stops it after eight identical lines, and the engine stops generating within a second of the
abort: llama-server's running-request gauge (``llamacpp:requests_processing``) is back to 0, and
the engine's CPU time, which grows by most of a core while it decodes, stops growing. Without the
gateway closing the upstream request the engine would decode the remaining ~2,900 tokens.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import CACHE, HUB, ROOT, RUN, Served, _require, _up, free_ports
from tests.e2e.test_engine_failures import rank_top_process
from tests.gateway_process import Running, gateway

pytestmark = [pytest.mark.e2e]

LINE = "The cat sat on the mat.\n"


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """examples/gemma-llamacpp (llama.cpp's llama-server, --metrics), under this module's own name."""
    _require(CACHE / "llama.cpp" / "bin" / "llama-server", "llama.cpp's llama-server")
    _require(HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")
    port, rpc = free_ports(2)
    yield from _up(f"test-e2e-gw-llama-{RUN}", ROOT / "examples" / "gemma-llamacpp",
                   tmp_path_factory.mktemp("gw-native-state"), None, "gemma3-270m",
                   [f"port={port}", f"rendezvous_port={rpc}"])  # fmt: skip


@pytest.fixture(scope="module", params=["llama-server", "llama-cpp-python"])
def engine(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue("native" if request.param == "llama-server" else "llama_server")


@pytest.fixture(scope="module")
def front(engine: Served) -> Iterator[Running]:
    with gateway(engine.state_dir) as gw:
        yield gw


def running_requests(endpoint: str) -> float | None:
    """llama-server's running-request gauge (None: the engine exports none)."""
    try:
        text = httpx.get(endpoint + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^llamacpp:requests_processing (\S+)", text, re.M)
    return float(m.group(1)) if m else None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """The engine's CPU time every 50 ms, from a thread: (monotonic time, CPU seconds)."""

    def __init__(self, pid: int, endpoint: str) -> None:
        self.pid = pid
        self.endpoint = endpoint
        self.samples: list[tuple[float, float]] = []
        self.running: list[tuple[float, float | None]] = []  # the engine's gauge, when it has one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), cpu_seconds(self.pid)))
            self.running.append((time.monotonic(), running_requests(self.endpoint)))
            time.sleep(0.05)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def used(self, start: float, end: float) -> float:
        """CPU seconds the engine used between two moments (nearest samples)."""
        at = [(abs(t - start), c) for t, c in self.samples]
        to = [(abs(t - end), c) for t, c in self.samples]
        return min(to)[1] - min(at)[1]


def test_route_from_the_state_store_answers_as_the_engine_does(engine: Served, front: Running) -> None:
    prompt = "The capital of France is Paris. The capital of Germany is"
    direct = openai.OpenAI(base_url=engine.endpoint + "/v1", api_key="unused", max_retries=0)
    through = openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0)
    assert [m.id for m in through.models.list()] == ["gemma3-270m"]
    want = direct.completions.create(model="gemma3-270m", prompt=prompt, max_tokens=8, temperature=0)
    got = through.completions.create(model="gemma3-270m", prompt=prompt, max_tokens=8, temperature=0)
    assert "Berlin" in got.choices[0].text
    assert got.choices[0].text == want.choices[0].text


def test_a_real_loop_is_stopped_and_the_engine_stops_generating(engine: Served, front: Running) -> None:
    pid = rank_top_process(engine.name, 0)
    assert pid is not None
    has_gauge = running_requests(engine.endpoint) is not None
    assert has_gauge == engine.name.startswith("test-e2e-gw-llama"), "only llama-server exports the gauge"
    client = openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=300)
    with CpuSampler(pid, engine.endpoint) as cpu:
        started = time.monotonic()
        stream = client.completions.create(model="gemma3-270m", prompt=LINE * 6, max_tokens=3000, temperature=0,
                                           stream=True)  # fmt: skip
        text, finish = "", None
        for chunk in stream:  # up to the stop; the connection stays open, so only the gateway can free the engine
            if chunk.choices:
                text += chunk.choices[0].text or ""
                finish = chunk.choices[0].finish_reason
                if finish:
                    break
        aborted = time.monotonic()
        time.sleep(3.0)
    stream.close()
    assert finish == "stop"
    assert text.startswith(LINE * 8)
    assert text.endswith("[sparkfleet gateway: answer stopped, it was repeating itself (8 identical lines in a row)]")
    decoding = cpu.used(started + 1.0, aborted) / (aborted - started - 1.0)
    after = cpu.used(aborted + 1.0, aborted + 3.0) / 2.0
    assert decoding > 0.3, f"the engine did not look busy while decoding ({decoding:.2f} cores)"
    assert after < 0.1, f"the engine kept working after the abort: {after:.2f} cores from 1 s to 3 s after"
    gauge = [(t, v) for t, v in cpu.running if v is not None]
    if has_gauge:  # llama-server (--metrics); llama-cpp-python's server exports none
        assert gauge, "the engine stopped exporting llamacpp:requests_processing"
        assert any(v == 1 for t, v in gauge if t < aborted), "the gauge never saw the request running"
        freed = min(t for t, v in gauge if t > aborted and v == 0)
        assert freed - aborted <= 1.0, f"the engine's running requests dropped {freed - aborted:.2f} s after the abort"
