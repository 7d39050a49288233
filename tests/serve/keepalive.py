"""Requests on one kept-alive connection to the real ``serve``, timed one by one from a raw
socket: ``python -m tests.serve.keepalive [N] [RUNS]``.

Each run opens a connection and sends N ``GET /healthz`` on it, one after another (each answer
read whole before the next is sent). A client's first request rides TCP's quick ACKs; the
ones after it are where a response held back by Nagle's algorithm waits out the client's
delayed ACK (about 40 ms on Linux), so the first is reported apart."""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pending_actions.embedded import EmbeddedRedis
from tests.serve.conftest import Server

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"


def exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send ``request`` and read its whole answer (a Content-Length body), head and body."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65_536)
        assert got, "serve closed the connection"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length:")]
    want = int(lengths[0])
    while len(body) < want:
        got = sock.recv(65_536)
        assert got, "serve closed the connection"
        body += got
    return head + b"\r\n\r\n" + body


def run(port: int, n: int) -> tuple[float, list[float]]:
    """The first request's time and the next ``n``'s, in ms, on one connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        times = []
        for _ in range(n + 1):
            started = time.perf_counter()
            answer = exchange(sock, REQUEST)
            times.append((time.perf_counter() - started) * 1000)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    return times[0], times[1:]


def main(n: int = 200, runs: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = EmbeddedRedis(directory=Path(tmp)).start()
        server = Server(redis_server.url).wait_ready()
        try:
            medians = []
            for number in range(1, runs + 1):
                first, rest = run(server.port, n)
                q = statistics.quantiles(rest, n=10)
                medians.append(statistics.median(rest))
                print(f"run {number}: first {first:.2f} ms; the next {n}: median "
                      f"{medians[-1]:.2f} ms  p10 {q[0]:.2f}  p90 {q[-1]:.2f}  "
                      f"max {max(rest):.2f}")
            print(f"median of the {runs} runs' medians {statistics.median(medians):.2f} ms, "
                  f"spread {min(medians):.2f}-{max(medians):.2f} ms")
        finally:
            server.stop()
            redis_server.stop()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
