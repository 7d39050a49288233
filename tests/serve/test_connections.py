"""``serve``'s connections at the TCP and HTTP/1.1 level, from raw sockets: Nagle's algorithm
off on every accepted socket (a kept-alive request was ~40 ms slower than the first), and the
deadlines on a request's headers, its body and an idle connection (each kept open for ever
before: a connection that never sent, half-sent headers, a byte of body every few seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import statistics
import time
import uuid
from collections.abc import Iterator

import orjson
import pytest

from pending_actions.embedded import EmbeddedRedis
from pending_actions.serve import listen
from pending_actions.serve.auth import Tokens
from tests.conftest import Deployment
from tests.serve.conftest import Server
from tests.serve.keepalive import REQUEST, exchange
from tests.support.procs import Worker
from tests.support.unchanged import redis_unchanged

HEADER_S, BODY_S, KEEP_ALIVE_S = 1.0, 1.5, 1.0
# how late a deadline may be kept on a loaded machine; uvicorn's own keep-alive (5 s), which
# the setting replaces, lies past it
MARGIN_S = 3.0
PACE_S = 0.2  # a slow client's byte every this long


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


@pytest.fixture(scope="module")
def strict(redis_server: EmbeddedRedis, worker: Worker,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """serve with deadlines of a second or so; its log kept, to be read."""
    log = tmp_path_factory.mktemp("strict") / "serve.log"
    s = Server(redis_server.url, log=log, overrides={
        "serve_header_timeout_s": str(HEADER_S), "serve_body_timeout_s": str(BODY_S),
        "serve_keep_alive_s": str(KEEP_ALIVE_S)}).wait_ready()
    yield s
    s.stop()


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def until_closed(sock: socket.socket, since: float, limit: float,
                 slowly: bytes = b"") -> tuple[bytes, float]:
    """All serve sends until it closes the connection, and when it did (seconds after
    ``since``), sending ``slowly`` a byte every ``PACE_S`` meanwhile; fails if it is open
    ``limit`` + ``MARGIN_S`` after ``since``."""
    return all_closed({sock: slowly}, since, limit)[sock]


def all_closed(clients: dict[socket.socket, bytes], since: float,
               limit: float) -> dict[socket.socket, tuple[bytes, float]]:
    """``until_closed`` for many connections at once, each with what it sends slowly."""
    left = dict(clients)
    received = dict.fromkeys(clients, b"")
    closed: dict[socket.socket, tuple[bytes, float]] = {}
    deadline = since + limit + MARGIN_S
    with selectors.DefaultSelector() as sel:
        for sock in clients:
            sel.register(sock, selectors.EVENT_READ)
        while len(closed) < len(clients):
            wait = deadline - time.monotonic()
            still = [received[sock][:200] for sock in clients if sock not in closed]
            assert wait > 0, f"{len(still)} of {len(clients)} still open " \
                             f"{limit + MARGIN_S:g} s on, having got {still[:3]}"
            ready = sel.select(min(wait, PACE_S) if any(left.values()) else wait)
            for key, _ in ready:
                sock = clients_sock(key)
                try:
                    got = sock.recv(65_536)
                except ConnectionResetError:
                    got = b""
                received[sock] += got
                if not got:
                    sel.unregister(sock)
                    closed[sock] = received[sock], time.monotonic() - since
            if not ready:  # a pace gone by: each slow client's next byte
                for sock, rest in left.items():
                    if rest and sock not in closed:
                        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                            sock.send(rest[:1])  # (closed meanwhile: the next select says)
                        left[sock] = rest[1:]
    return closed


def clients_sock(key: selectors.SelectorKey) -> socket.socket:
    sock = key.fileobj
    assert isinstance(sock, socket.socket)
    return sock


def head_of(request: str, token: str | None = None, length: int | None = None) -> bytes:
    lines = [request, "Host: test"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if length is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def parse(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    """An answer's status line, headers (lower-case names) and body."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = dict((k.lower(), v.strip()) for k, _, v in (x.partition(":") for x in lines))
    return status, headers, body


@pytest.mark.parametrize("sends", [b"", b"GET /healthz HTTP/1.1\r\nHost: test\r\n"],
                         ids=["nothing", "half-the-headers"])
def test_headers_not_in_whole_in_time_close_the_connection(strict: Server, sends: bytes) -> None:
    since = time.monotonic()
    with connect(strict) as sock:
        sock.sendall(sends)
        got, after = until_closed(sock, since, HEADER_S)
    assert got == b""  # no request yet: nothing to answer
    assert after >= HEADER_S * 0.9, f"closed after {after:.2f} s"


def test_headers_sent_a_byte_at_a_time_are_not_waited_for(strict: Server) -> None:
    """The deadline runs from the opening: each byte does not start it again."""
    since = time.monotonic()
    with connect(strict) as sock:
        got, after = until_closed(sock, since, HEADER_S, slowly=b"GET /healthz HTTP/1.1\r\n"
                                  b"X-Slow: " + b"x" * 200)
    assert got == b"" and after >= HEADER_S * 0.9


def test_a_slow_body_gets_a_408_and_nothing_is_tried(strict: Server, single: Deployment,
                                                     tokens: Tokens) -> None:
    token, _ = tokens.create(f"t-{uuid.uuid4().hex[:8]}", "approver")
    body = orjson.dumps({"items": [{"session": "s", "id": "i", "action": "apply",
                                    "reason": "x" * 1_000}]})
    with redis_unchanged(single.rc), connect(strict) as sock:
        sock.sendall(head_of("POST /v1/resolve-batch HTTP/1.1", token, len(body)))
        since = time.monotonic()
        got, after = until_closed(sock, since, BODY_S, slowly=body)
    status, headers, answer = parse(got)
    assert status == "HTTP/1.1 408 Request Timeout", got[:300]
    assert orjson.loads(answer) == {"error": f"the body did not arrive within {BODY_S:g} s",
                                    "field": "body"}
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close" and headers["x-frame-options"] == "DENY"
    assert int(headers["content-length"]) == len(answer)
    assert after >= BODY_S * 0.9
    # the route that was reading it saw a client gone, and said nothing of it
    assert strict.log is not None
    log = strict.log.read_text()
    assert "Traceback" not in log and "failed" not in log, log[-2000:]


def test_a_slow_body_nobody_reads_is_cut_after_the_answer(strict: Server) -> None:
    with connect(strict) as sock:
        sock.sendall(head_of("POST /healthz HTTP/1.1", length=1_000))
        since = time.monotonic()
        got, after = until_closed(sock, since, BODY_S, slowly=b"x" * 1_000)
    status, _, _ = parse(got)
    assert status == "HTTP/1.1 405 Method Not Allowed", got[:300]  # answered at once
    assert after >= BODY_S * 0.9


def test_an_idle_kept_alive_connection_is_closed(strict: Server) -> None:
    with connect(strict) as sock:
        assert exchange(sock, REQUEST).startswith(b"HTTP/1.1 200")
        since = time.monotonic()
        got, after = until_closed(sock, since, KEEP_ALIVE_S)
    assert got == b"" and after >= KEEP_ALIVE_S * 0.9


def test_the_next_requests_headers_have_their_deadline(strict: Server) -> None:
    """A byte of the next request stops the keep-alive timer: its headers' deadline runs."""
    with connect(strict) as sock:
        assert exchange(sock, REQUEST).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /heal")
        since = time.monotonic()
        got, after = until_closed(sock, since, HEADER_S)
    assert got == b"" and after >= HEADER_S * 0.9


def test_a_request_in_whole_has_all_the_time_it_needs(strict: Server, single: Deployment,
                                                      tokens: Tokens) -> None:
    """The deadlines are the client's: a resolve waiting on its handler past every one of
    them is answered, on a connection that is then kept alive."""
    tenant, gate = f"t-{uuid.uuid4().hex[:8]}", f"gate-{uuid.uuid4().hex[:8]}"
    token, _ = tokens.create(tenant, "approver")
    session = f"slow-{uuid.uuid4().hex[:8]}"
    action = single.pa.stage(session=session, tool="edit", label="waits", apply="t.gate",
                             payload={"gate": gate}, tenant=tenant)
    body = orjson.dumps({"action": "apply", "reason": "r"})
    with connect(strict) as sock:
        sock.sendall(head_of(f"POST /v1/sessions/{session}/resolve HTTP/1.1", token,
                             len(body)) + body)
        assert single.rc.blpop([f"test:started:{session}"], timeout=30), "never started"
        quiet = 2 * max(HEADER_S, BODY_S, KEEP_ALIVE_S)
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            assert sel.select(quiet) == [], "serve said something (or closed) too soon"
        single.rc.rpush(gate, "open")
        status, _, answer = parse(exchange(sock, b""))
        assert status == "HTTP/1.1 200 OK", answer[:300]
        assert orjson.loads(answer)["content"][0]["text"] == f"gated {action} done"
        assert exchange(sock, REQUEST).startswith(b"HTTP/1.1 200")


def test_three_hundred_slow_clients_are_all_let_go(strict: Server, tokens: Tokens) -> None:
    """The review's attack: connections that send nothing, half their headers, or a body
    byte by byte; every one is closed by its deadline (they were all open a minute on)."""
    token, _ = tokens.create(f"t-{uuid.uuid4().hex[:8]}", "approver")
    since = time.monotonic()
    socks = [connect(strict) for _ in range(300)]
    try:
        clients: dict[socket.socket, bytes] = {}
        for n, sock in enumerate(socks):
            if n % 3 == 1:
                sock.sendall(b"POST /v1/resolve-batch HTTP/1.1\r\nHost: test\r\n")
            elif n % 3 == 2:
                sock.sendall(head_of("POST /v1/resolve-batch HTTP/1.1", token, 1_000))
            clients[sock] = b"x" * 1_000 if n % 3 == 2 else b""
        closed = all_closed(clients, since, max(HEADER_S, BODY_S))
    finally:
        for sock in socks:
            sock.close()
    answers = [parse(closed[sock][0])[0] for sock in socks]
    assert answers[0::3] == answers[1::3] == [""] * 100  # nothing to answer yet
    assert answers[2::3] == ["HTTP/1.1 408 Request Timeout"] * 100
