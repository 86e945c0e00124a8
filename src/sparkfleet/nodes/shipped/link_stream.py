"""A bidirectional TCP stream test for nodes without iperf3 (standard library only; on a link
faster than a few Gbit/s it reads below line rate): both ends send zeros for SECS seconds and
print ``{"received": bytes, "seconds": first-to-last byte}``.

    serve BIND_IP PORT SECS LIMIT      listens (prints "listening"), takes one connection, exits
                                       by LIMIT seconds whatever happens
    connect DST_IP SRC_IP PORT SECS
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def _send(sock: socket.socket, secs: float) -> None:
    block = bytes(CHUNK)
    end = time.monotonic() + secs
    try:
        while time.monotonic() < end:
            sock.sendall(block)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _receive(sock: socket.socket) -> tuple[int, float]:
    total, first, last = 0, None, None
    buf = bytearray(CHUNK)
    while True:
        try:
            n = sock.recv_into(buf)
        except OSError:
            break
        if not n:
            break
        now = time.monotonic()
        first = now if first is None else first
        last = now
        total += n
    return total, (last - first) if first is not None and last is not None else 0.0


def both_ways(sock: socket.socket, secs: float) -> None:
    sender = threading.Thread(target=_send, args=(sock, secs), daemon=True)
    sender.start()
    received, seconds = _receive(sock)
    sender.join(timeout=secs + 5)
    print(json.dumps({"received": received, "seconds": seconds}), flush=True)


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "serve":
        bind_ip, port, secs, limit = argv[1], int(argv[2]), float(argv[3]), float(argv[4])
        # Whatever happens (no client, a client that hangs), gone by the limit, or as soon as the
        # controller closes this program's stdin.
        threading.Timer(limit, lambda: os._exit(3)).start()
        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(4)), daemon=True).start()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((bind_ip, port))
            server.listen(1)
            print("listening", flush=True)
            conn, _ = server.accept()
        with conn:
            both_ways(conn, secs)
        sys.stdout.flush()
        os._exit(0)  # the limit's timer thread must not keep the process
    elif mode == "connect":
        dst, src, port, secs = argv[1], argv[2], int(argv[3]), float(argv[4])
        with socket.create_connection((dst, port), timeout=5, source_address=(src, 0)) as conn:
            conn.settimeout(secs + 10)
            both_ways(conn, secs)
    else:
        print(json.dumps({"error": f"unknown mode {mode!r}"}), flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
