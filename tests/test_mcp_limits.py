"""The MCP servers' bounds, on every surface we run (``mcp`` over stdio and HTTP, ``mcp-proxy``
over stdio), each a real process driven by the SDK's own client: a request past a depth or a
size limit is answered at once and the server serves the next one; an upstream's answer past
``MCP_MAX_RESULT_BYTES`` fails its call at once, in the proxy and in a worker, and the upstream
serves the next; another tenant's session, claimed after the server started, answers exactly
as one that does not exist, at every call; ``pending`` shows the head and a count."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp.client.session import ClientSession

from pending_actions.broker.keys import Keys
from pending_actions.broker.payloads import max_body_bytes
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.mcp.texts import NOTHING_PENDING
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.support.mcp import (
    McpWorker,
    connect,
    http_connect,
    http_server,
    proxy_args,
    text,
    writes,
)
from tests.support.unchanged import redis_unchanged

SURFACES = ["mcp", "mcp-proxy", "mcp-http"]
PAYLOAD = "1000"  # MAX_PAYLOAD_BYTES of the servers here: a request over the size is ~1.1 MB
# the most a request may be: a request body of serve's (payloads.max_body_bytes)
REQUEST_BYTES = max_body_bytes(Settings(max_payload_bytes=int(PAYLOAD)))
SHOWN = 10  # what `pending` lists before it counts
RESULT_CAP = 200_000  # MCP_MAX_RESULT_BYTES of the proxies and the worker here
ANSWER_S = 10.0  # "at once": far below any timeout of ours (60 s), on a loaded 2-core machine
TENANT = f"acme-{uuid.uuid4().hex[:6]}"
OTHER = f"beta-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[str]:
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-mcp-limits")).start()
    worker = McpWorker(server.url, folder,
                       overrides={"mcp_max_result_bytes": str(RESULT_CAP)}).start()
    yield server.url
    worker.stop()
    server.stop()


@pytest.fixture(scope="module")
def pa(url: str) -> Iterator[PendingActions]:
    client = PendingActions.from_url(url, resolve_timeout_s=30)
    yield client
    client.close()


@pytest.fixture(scope="module")
def rc(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def endpoint(url: str) -> Iterator[str]:
    with http_server(url, max_payload_bytes=PAYLOAD) as found:
        yield found


@pytest.fixture(scope="module")
def token(rc: redis.Redis) -> str:
    made, _ = Tokens(rc, Keys()).create(TENANT, "producer", f"agent-{uuid.uuid4().hex[:6]}")
    return made


@pytest.fixture
def session() -> str:
    return f"l-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def surface(kind: str, url: str, folder: Path, endpoint: str, token: str,
                  session: str) -> AsyncIterator[ClientSession]:
    """The server ``kind`` for ``session``, as a client of it: of ``TENANT``, but for ``mcp``
    over stdio without ``--tenant``, which serves the default tenant."""
    if kind == "mcp-http":
        async with http_connect(endpoint, token, session) as mcp:
            yield mcp
    elif kind == "mcp --tenant":
        async with connect(url, "mcp", "--session", session, "--tenant", TENANT,
                           max_payload_bytes=PAYLOAD) as mcp:
            yield mcp
    elif kind == "mcp":
        async with connect(url, "mcp", "--session", session, max_payload_bytes=PAYLOAD) as mcp:
            yield mcp
    else:
        async with connect(url, *proxy_args(session, folder, "--tenant", TENANT),
                           max_payload_bytes=PAYLOAD,
                           mcp_max_result_bytes=str(RESULT_CAP)) as mcp:
            yield mcp


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


async def answered(mcp: ClientSession, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    with anyio.fail_after(ANSWER_S):
        got = await mcp.call_tool(tool, arguments)
    return text(got), bool(got.is_error)


async def whole(mcp: ClientSession, tool: str, arguments: dict[str, Any]
                ) -> tuple[str, bool, dict[str, Any] | None]:
    with anyio.fail_after(ANSWER_S):
        got = await mcp.call_tool(tool, arguments)
    return text(got), bool(got.is_error), got.meta


@pytest.mark.parametrize("kind", SURFACES)
def test_a_request_past_a_limit_is_answered_at_once_and_the_next_one_is_served(
        kind: str, url: str, folder: Path, endpoint: str, token: str, rc: redis.Redis,
        session: str) -> None:
    """200 levels is past what the SDK's parser reads (it dropped such a request unanswered:
    the client waited for ever); 70 is past ours only; ~1.1 MB is past the size of a request."""
    if kind == "mcp-proxy":
        def call(value: Any) -> tuple[str, dict[str, Any]]:
            return "write_file", {"path": "a.txt", "text": value}
    else:
        def call(value: Any) -> tuple[str, dict[str, Any]]:
            return "resolve", {"action": "apply",
                               "reason": value if isinstance(value, str) else "r",
                               **({} if isinstance(value, str) else {"extra": value})}
    cases = [(nested(200), "nested deeper than 64 levels"),
             (nested(70), "nested deeper than 64 levels"),
             ("x" * (REQUEST_BYTES + 1), f"over {REQUEST_BYTES} bytes")]

    async def body() -> None:
        async with surface(kind, url, folder, endpoint, token, session) as mcp:
            for value, said in cases:
                with redis_unchanged(rc):
                    started = time.monotonic()
                    refused, failed = await answered(mcp, *call(value))
                    took = time.monotonic() - started
                assert failed and said in refused, refused
                assert refused.startswith("invalid ") and "Nothing was run" in refused
                assert took < ANSWER_S
                assert await answered(mcp, "pending", {}) == (NOTHING_PENDING, False)

    anyio.run(body)


def test_an_upstream_answer_past_the_cap_fails_the_proxys_call_at_once_and_it_serves_on(
        url: str, folder: Path, endpoint: str, token: str, session: str) -> None:
    (folder / f"{session}-big.txt").write_text("x" * (RESULT_CAP * 5))
    (folder / f"{session}.txt").write_text("small")

    async def body() -> None:
        async with surface("mcp-proxy", url, folder, endpoint, token, session) as proxy:
            said, failed = await answered(proxy, "read_file", {"path": f"{session}-big.txt"})
            assert failed, said[:200]
            assert f"answered the call of read_file with more than {RESULT_CAP} bytes" in said
            assert "MCP_MAX_RESULT_BYTES" in said and len(said) < 1000
            for _ in range(3):  # the rest of the big line read away, the upstream serves on
                assert await answered(proxy, "read_file", {"path": f"{session}.txt"}) == \
                    ("small", False)

    anyio.run(body)


def test_an_upstream_answer_past_the_cap_fails_the_apply_and_the_worker_applies_the_next(
        pa: PendingActions, folder: Path, session: str) -> None:
    (folder / f"{session}-big.txt").write_text("y" * (RESULT_CAP * 5))

    def write(text: str) -> int:
        """A write applied by the worker's upstream: the pid of the process that wrote it."""
        pa.stage(session=session, tool="write_file", label="w", apply="mcp:files",
                 payload={"path": f"{session}.txt", "text": text})
        done = pa.resolve(session=session, action="apply", reason="r")
        assert not done.is_error, done.text
        pid: int = [w for w in writes(folder) if w["path"] == f"{session}.txt"][-1]["pid"]
        return pid

    before = write("small")
    action_id = pa.stage(session=session, tool="read_file", label="big", apply="mcp:files",
                         payload={"path": f"{session}-big.txt"})
    started = time.monotonic()
    failed = pa.resolve(session=session, action="apply", reason="r")
    assert time.monotonic() - started < ANSWER_S
    assert failed.is_error and failed.text.startswith("Apply failed: "), failed.text[:200]
    assert f"more than {RESULT_CAP} bytes" in failed.text
    assert "MCP_MAX_RESULT_BYTES" in failed.text
    [still] = pa.pending(session)
    assert (still.id, still.attempts) == (action_id, 1)
    pa.resolve(session=session, action="discard", reason="too big")
    pa.stage(session=session, tool="read_file", label="small", apply="mcp:files",
             payload={"path": f"{session}.txt"})
    done = pa.resolve(session=session, action="apply", reason="r")
    assert not done.is_error and done.text == "small", done.text
    assert write("again") == before  # the same upstream process: it was never restarted


@pytest.mark.parametrize("kind", [*SURFACES, "mcp --tenant"])
def test_another_tenants_session_answers_as_a_missing_one_at_every_call(
        kind: str, url: str, folder: Path, endpoint: str, token: str, pa: PendingActions,
        rc: redis.Redis, session: str) -> None:
    """The server starts on a session no one has claimed; another tenant then stages into it.
    From then on every call on it answers what a session that does not exist answers, word
    for word, reads nothing of the other tenant's and writes nothing; the proxy's staging of
    an upstream call into it is refused as any stage into another tenant's session is, and
    forwards nothing."""
    missing = f"l-{uuid.uuid4().hex[:10]}"
    calls: list[tuple[str, dict[str, Any]]] = [
        ("pending", {}), ("resolve", {"action": "apply", "reason": "go"}),
        ("resolve", {"action": "discard", "reason": "no"})]
    (folder / f"{session}.txt").write_text("a read")

    async def body() -> None:
        async with surface(kind, url, folder, endpoint, token, session) as mine, \
                surface(kind, url, folder, endpoint, token, missing) as nowhere:
            assert await answered(mine, "pending", {}) == (NOTHING_PENDING, False)
            theirs = pa.stage(session=session, tool="edit", label="beta's secret plan",
                              apply="t.ok", payload={"secret": "s3cret"}, tenant=OTHER)
            with redis_unchanged(rc):
                got = [await whole(mine, *c) for c in calls]
            expected = [await whole(nowhere, *c) for c in calls]
            assert got == expected  # text, isError and the result in _meta alike
            assert not any("secret" in said or theirs in said for said, _, _ in got)
            if kind == "mcp-proxy":
                for tool in ("write_file", "read_file"):
                    with redis_unchanged(rc):
                        said, failed = await answered(mine, tool, {"path": f"{session}.txt",
                                                                   "text": "x"})
                    assert failed and said == (f"session {session!r} belongs to another "
                                               "tenant. Nothing was run or staged.")
                assert (folder / f"{session}.txt").read_text() == "a read"
        [still] = pa.pending(session)
        assert (still.id, still.tenant, still.attempts) == (theirs, OTHER, 0)

    anyio.run(body)


def test_pending_shows_the_head_and_the_next_ones_and_counts_the_rest(
        url: str, pa: PendingActions, session: str) -> None:
    stacked = 300
    ids = pa.stage_many([{"session": session, "tool": "edit", "apply": "t.ok",
                          "label": f"edit {n:04d} " + "y" * 980} for n in range(stacked)])

    async def body() -> str:
        async with connect(url, "mcp", "--session", session) as mcp:
            said, failed = await answered(mcp, "pending", {})
            assert not failed
            return said

    listing, _reminder = anyio.run(body).split("\n<system-reminder>")
    lines = listing.splitlines()
    assert lines[0].startswith(f"{stacked} pending")
    assert len(lines) == 1 + SHOWN + 1
    newest_first = ids[::-1]
    for n, (line, action_id) in enumerate(zip(lines[1:-1], newest_first, strict=False), 1):
        assert line.startswith(f"{n}. {action_id}: edit {stacked - n:04d} ")
    assert lines[-1].startswith(f"… and {stacked - SHOWN} more")
    assert len(listing) < SHOWN * 1_100 + 300
