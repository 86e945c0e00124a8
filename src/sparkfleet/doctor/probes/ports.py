"""Listening TCP ports: `ss -ltnH`, or `/proc/net/tcp{,6}` where `ss` is absent."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import fixed

COMMAND = [
    "sh",
    "-c",
    'if command -v ss >/dev/null 2>&1; then echo "## ss"; ss -ltnH; '
    'else echo "## proc"; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; fi',
]

_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    """A listening socket: the local address (without brackets) and port."""

    address: str
    port: int


@dataclass(frozen=True)
class ListeningPorts:
    """Every listening TCP socket on the node."""

    listeners: tuple[Listener, ...]

    def holders(self, port: int) -> tuple[Listener, ...]:
        """The sockets bound to this port (any address)."""
        return tuple(item for item in self.listeners if item.port == port)


def _split_host_port(text: str) -> Listener:
    host, _, port = text.rpartition(":")
    return Listener(address=host.strip("[]").split("%")[0], port=int(port))


def parse_ss(text: str) -> tuple[Listener, ...]:
    """Parse `ss -ltnH` lines: State Recv-Q Send-Q Local:Port Peer:Port [Process]."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] == "LISTEN":
            out.append(_split_host_port(words[3]))
    return tuple(out)


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw[::-1])
    # IPv6: four little-endian 32-bit words
    words = [raw[i : i + 4][::-1].hex() for i in range(0, 16, 4)]
    joined = "".join(words)
    return ":".join(joined[i : i + 4] for i in range(0, 32, 4))


def parse_proc(text: str) -> tuple[Listener, ...]:
    """Parse /proc/net/tcp and tcp6 (hex address:port, state 0A = LISTEN)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 4 or words[3] != _LISTEN or ":" not in words[1]:
            continue
        addr, _, port = words[1].partition(":")
        out.append(Listener(address=_hex_address(addr), port=int(port, 16)))
    return tuple(out)


def parse(stdout: str) -> ListeningPorts:
    """Parse the output of `COMMAND`."""
    head, _, body = stdout.partition("\n")
    if head.strip() == "## ss":
        return ListeningPorts(parse_ss(body))
    if head.strip() == "## proc":
        return ListeningPorts(parse_proc(body))
    raise ValueError("not the ports probe's output")


FACT = fixed("ports", COMMAND, lambda out: parse(out.stdout))
