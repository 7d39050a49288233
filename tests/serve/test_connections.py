"""``serve``'s connections at the TCP and HTTP/1.1 level, from raw sockets: Nagle's algorithm
off on every accepted socket (a kept-alive request was ~40 ms slower than the first)."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time

from pending_actions.serve import listen
from tests.serve.conftest import Server
from tests.serve.keepalive import REQUEST, exchange


def test_sockets_accepted_from_serves_listener_have_nagle_off() -> None:
    """asyncio sets TCP_NODELAY only on a socket that says IPPROTO_TCP: the listener must."""
    listener = listen.bind("127.0.0.1", 0)

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[int] = loop.create_future()

        class Accepted(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await loop.create_server(Accepted, sock=listener)
        try:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            try:
                return await asyncio.wait_for(seen, 10)
            finally:
                writer.close()
        finally:
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0


def test_a_kept_alive_request_is_as_quick_as_a_first_one(server: Server) -> None:
    """Against the real serve, its first and second request on each of ten connections: the
    second is not held back (it took ~44 ms where the first took 1-3; a ratio, not a time, so
    that a loaded machine slows both alike)."""
    firsts: list[float] = []
    seconds: list[float] = []
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            for times in (firsts, seconds):
                started = time.perf_counter()
                exchange(sock, REQUEST)
                times.append(time.perf_counter() - started)
    first, second = statistics.median(firsts), statistics.median(seconds)
    assert second < 4 * first, f"kept-alive {second * 1000:.2f} ms, first {first * 1000:.2f} ms"
