"""Running ``serve``'s listeners: the API's and, with ``--metrics-port``, the operator's, both
in one event loop. Their sockets are bound before anything starts, so a port in use is one
clear error (exit 2), never a listener half up beside a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from pending_actions.broker.errors import ConfigError

OPTIONS: dict[str, Any] = {"log_level": "warning", "access_log": False}


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; ConfigError naming it when that cannot be."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        # (create_server's own message adds the address again; a name lookup has no errno)
        why = exc.strerror if isinstance(exc, socket.gaierror) or not exc.errno else \
            os.strerror(exc.errno)
        raise ConfigError(f"cannot listen on {host}:{port}: {why}") from None
    # create_server's socket says protocol 0, and so does every socket accepted from it;
    # asyncio turns Nagle's algorithm off (TCP_NODELAY) only on one that says IPPROTO_TCP.
    # With it on, a response written as its head and then its body waited out the client's
    # delayed ACK (~40 ms) on every request of a kept-alive connection but the first
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP,
                         fileno=listener.detach())


class _Beside(uvicorn.Server):
    """A second listener in the same event loop: it leaves the signals to the first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run(app: Any, sock: socket.socket,
        operator: tuple[Any, socket.socket] | None = None) -> None:
    """Serve ``app`` on ``sock`` (and the operator's app on its socket) until a signal."""
    main = uvicorn.Server(uvicorn.Config(app, **OPTIONS))
    if operator is None:
        main.run(sockets=[sock])
        return
    side_app, side_sock = operator
    side = _Beside(uvicorn.Config(side_app, lifespan="off", **OPTIONS))

    async def both() -> None:
        beside = asyncio.create_task(side.serve(sockets=[side_sock]))
        # whichever ends first ends the other: the main one on a signal
        beside.add_done_callback(lambda _task: setattr(main, "should_exit", True))
        try:
            await main.serve(sockets=[sock])
        finally:
            side.should_exit = True
            await beside

    asyncio.run(both())
