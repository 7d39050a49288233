"""Running ``serve``'s listeners: the API's and, with ``--metrics-port``, the operator's, both
in one event loop. Their sockets are bound before anything starts, so a port in use is one
clear error (exit 2), never a listener half up beside a traceback.

Every connection is held to deadlines (``Deadlines``): a request's headers must arrive whole
within ``SERVE_HEADER_TIMEOUT_S``, its body within ``SERVE_BODY_TIMEOUT_S``, and an idle
connection is kept ``SERVE_KEEP_ALIVE_S`` between requests. uvicorn's own protocols (h11's and
httptools') have only the last: a timer armed when a response is complete and disarmed by any
byte received, so a connection that never sends, one that stops half way through its headers,
or one that sends a byte of its body every few seconds was kept open for ever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import h11
import orjson
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from pending_actions.broker.errors import ConfigError
from pending_actions.broker.settings import Settings
from pending_actions.serve.http import SECURITY_HEADERS

OPTIONS: dict[str, Any] = {"log_level": "warning", "access_log": False}


@dataclass(frozen=True)
class Limits:
    """How long a connection may take over each part of a request (``Settings``)."""

    header_s: float
    body_s: float
    keep_alive_s: float

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.serve_header_timeout_s, settings.serve_body_timeout_s,
                   settings.serve_keep_alive_s)


def deadlines(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol held to ``limits``: one timer per connection, for the part of the
    request it is waiting for, moved on as h11 parses (``their_state``)."""

    class Deadlines(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # uvicorn's own idle timer between requests, at our setting
            self.timeout_keep_alive = limits.keep_alive_s  # type: ignore[assignment]
            self.deadline: asyncio.TimerHandle | None = None
            self.waiting_for: Any = None  # h11.IDLE (headers), h11.SEND_BODY, or None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.expect(h11.IDLE)  # the first request's headers count from the opening

        def data_received(self, data: bytes) -> None:
            if self.waiting_for is None and self.conn.their_state is h11.IDLE:
                self.expect(h11.IDLE)  # a kept-alive connection's next request begins
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                self.expect(h11.SEND_BODY)
            elif state is h11.IDLE and self.waiting_for is not h11.IDLE:
                # between requests: idle is uvicorn's keep-alive timer's, but a request
                # already begun behind the last one (pipelined) has its headers' deadline
                self.expect(h11.IDLE if self.conn.trailing_data[0] else None)
            elif state is not h11.IDLE:
                self.expect(None)  # the request is in whole: the app's time is its own

        def connection_lost(self, exc: Exception | None) -> None:
            self.expect(None)
            super().connection_lost(exc)

        def expect(self, state: Any) -> None:
            """Wait for ``state``'s part of the request from now (None: for nothing)."""
            if state is self.waiting_for:
                return
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None
            self.waiting_for = state
            if state is not None:
                seconds = limits.header_s if state is h11.IDLE else limits.body_s
                self.deadline = self.loop.call_later(seconds, self.late)

        def late(self) -> None:
            self.deadline = None
            cycle = self.cycle
            if self.waiting_for is h11.SEND_BODY and cycle is not None and \
                    not cycle.response_started and not self.transport.is_closing():
                # the app has not answered: the 408 is ours, and the app's own answer, if it
                # ever comes, goes nowhere (to it the client has gone)
                cycle.disconnected = True
                cycle.message_event.set()
                self.transport.write(self.timed_out())
            self.waiting_for = None
            self.transport.close()

        def timed_out(self) -> bytes:
            body = orjson.dumps({"error": f"the body did not arrive within {limits.body_s:g} "
                                          "s", "field": "body"})
            headers = [*self.server_state.default_headers,
                       (b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close"), *SECURITY_HEADERS]
            return b"".join((
                self.conn.send(h11.Response(status_code=408, headers=headers,
                                            reason=b"Request Timeout")) or b"",
                self.conn.send(h11.Data(data=body)) or b"",
                self.conn.send(h11.EndOfMessage()) or b""))

    return Deadlines


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
        operator: tuple[Any, socket.socket] | None = None, limits: Limits | None = None) -> None:
    """Serve ``app`` on ``sock`` (and the operator's app on its socket) until a signal; with
    ``limits``, every connection held to them (else to uvicorn's keep-alive alone)."""
    # the h11 protocol itself, never uvicorn's "auto" (httptools' where that is installed)
    protocol: Any = "auto" if limits is None else deadlines(limits)
    main = uvicorn.Server(uvicorn.Config(app, http=protocol, **OPTIONS))
    if operator is None:
        main.run(sockets=[sock])
        return
    side_app, side_sock = operator
    side = _Beside(uvicorn.Config(side_app, lifespan="off", http=protocol, **OPTIONS))

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
