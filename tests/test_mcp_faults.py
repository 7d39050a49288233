"""MCP upstreams that go wrong, and workers that die: an unknown upstream, one that does not
start, exits, writes garbage or hangs is one clear line at start or an error result at call
time, never a hung call; an upstream's error result keeps the action pending under its id; and
the upstream's write happens once per apply even when the worker is SIGKILLed after the
upstream answered (the idempotency key in the call's _meta is what lets it tell). Also the
streamable HTTP transport, with serve's bearer tokens."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
import redis
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis, free_port
from pending_actions.mcp.texts import NOTHING_PENDING
from pending_actions.mcp.worker import FAILPOINT
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from pending_actions.serve.auth import Tokens
from tests.support.faults import FAST, K, cluster, events, wait_for
from tests.support.mcp import (
    McpWorker,
    connect,
    proxy_args,
    resolved,
    text,
    upstream_option,
    writes,
)
from tests.support.procs import worker_env
from tests.support.replies import tail_id
from tests.support.waits import wait_until

pool = ThreadPoolExecutor(max_workers=2)
CALL_TIMEOUT = "3"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[str]:
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-mcp-faults")).start()
    worker = McpWorker(server.url, folder, overrides={"mcp_call_timeout_s": CALL_TIMEOUT}).start()
    yield server.url
    worker.stop()
    server.stop()


@pytest.fixture(scope="module")
def pa(url: str) -> Iterator[PendingActions]:
    client = PendingActions.from_url(url, resolve_timeout_s=30)
    yield client
    client.close()


@pytest.fixture
def session() -> str:
    return f"f-{uuid.uuid4().hex[:10]}"


def run_cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pending_actions", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
        env={**worker_env(url), **{f"PENDING_ACTIONS_{k.upper()}": v for k, v in env.items()}},
        capture_output=True, text=True, timeout=90)


def one_error_line(ran: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in ran.stderr, ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, ran.stderr
    return errors[0]


BAD_STARTS = {
    "unknown": (["--upstream", "nope"], "unknown MCP upstream 'nope' (configured: files)"),
    "no such command": (["--mcp-upstream", "files=no-such-command-here --flag"],
                        "did not start: cannot run its command"),
    "exits": (["--mcp-upstream", "{exit}"], "did not start: exited"),
    "garbage": (["--mcp-upstream", "{garbage}"],
                "did not start: wrote a line that is not JSON-RPC on its stdout: 'Welcome!"),
    "hangs": (["--mcp-upstream", "{hang}"], "did not answer `initialize` within 2s"),
    "clash": (["--mcp-upstream", "{resolve}"],
              "has a tool named 'resolve', which mcp-proxy serves itself"),
    "bad tool name": (["--mcp-upstream", "{bad}"],
                      "has a tool named 'bad/name', which cannot be a pending action's tool"),
    "bad option": (["--mcp-upstream", "files"], "write NAME='COMMAND ARGS'"),
}


@pytest.mark.parametrize("case", list(BAD_STARTS))
def test_a_bad_upstream_is_one_clear_line_at_the_proxys_start(url: str, folder: Path,
                                                               case: str) -> None:
    args, said = BAD_STARTS[case]
    flags = {"exit": ["--start", "exit"], "garbage": ["--start", "garbage"],
             "hang": ["--start", "hang"], "resolve": ["--tool", "resolve"],
             "bad": ["--tool", "bad/name"]}
    args = [upstream_option(folder, *flags[a[1:-1]]) if a.startswith("{") else a for a in args]
    started = time.monotonic()
    ran = run_cli(url, *proxy_args("s", folder), *args, mcp_start_timeout_s="2")
    assert ran.returncode == 2, ran.stderr
    assert said in one_error_line(ran)
    assert time.monotonic() - started < 30


def test_a_worker_refuses_an_upstream_that_does_not_start(url: str, folder: Path) -> None:
    ran = run_cli(url, "worker", "--mcp-upstream", "files=no-such-command-here")
    assert ran.returncode == 2
    line = one_error_line(ran)
    assert "MCP upstream files (`no-such-command-here`) did not start" in line
    ran = run_cli(url, "worker", "--mcp-upstream", upstream_option(folder, "--start", "exit"))
    assert ran.returncode == 2 and "did not start: exited" in one_error_line(ran)


def test_up_refuses_a_bad_upstream_before_it_starts_anything(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "pending_actions", "up", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "data"), "--mcp-upstream", "files=no-such-command-here"],
        cwd=ROOT, env={k: v for k, v in worker_env("").items()
                       if k != "PENDING_ACTIONS_REDIS_URL"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90)
    assert ran.returncode == 2 and ran.stdout == ""  # no Redis was started
    assert "MCP upstream files (`no-such-command-here`) did not start" in one_error_line(ran)


@pytest.mark.parametrize(("how", "said"), [
    ("crash", "exited (its stdout closed) during the call of fail"),
    ("garbage", "wrote a line that is not JSON-RPC on its stdout: 'this is not JSON-RPC'"),
    ("hang", f"did not answer the call of fail within {CALL_TIMEOUT}s"),
])
def test_an_upstream_failing_a_forwarded_call_is_an_error_result_then_it_restarts(
        url: str, folder: Path, session: str, how: str, said: str) -> None:
    (folder / f"{session}.txt").write_text("still here")

    async def body() -> None:
        async with connect(url, *proxy_args(session, folder),
                           mcp_call_timeout_s=CALL_TIMEOUT) as proxy:
            started = time.monotonic()
            failed = await proxy.call_tool("fail", {"how": how})  # read-only: forwarded
            assert failed.is_error and said in text(failed)
            assert time.monotonic() - started < float(CALL_TIMEOUT) + 5
            again = await proxy.call_tool("read_file", {"path": f"{session}.txt"})
            assert not again.is_error and text(again) == "still here"

    anyio.run(body)


@pytest.mark.parametrize(("how", "said"), [
    ("error", None),
    ("crash", "Apply failed: MCP upstream files"),
    ("garbage", "wrote a line that is not JSON-RPC"),
    ("hang", f"did not answer the call of fail within {CALL_TIMEOUT}s"),
])
def test_a_failed_apply_keeps_the_action_pending_under_its_id(
        pa: PendingActions, folder: Path, session: str, how: str, said: str | None) -> None:
    action_id = pa.stage(session=session, tool="fail", label="fail", apply="mcp:files",
                         payload={"how": how})
    result = pa.resolve(session=session, action="apply", reason="try")
    assert result.is_error
    if said is None:  # the upstream's error result: its text, unchanged (ToolError)
        assert result.text == "Error executing tool fail: disk full"
    else:
        assert result.text.startswith("Apply failed: ") and said in result.text
    [still] = pa.pending(session)
    assert (still.id, still.attempts, still.last_error) == (action_id, 1, result.text)
    # the upstream is started again for the next apply
    pa.stage(session=session, tool="write_file", label="w", apply="mcp:files",
             payload={"path": f"{session}.txt", "text": "ok"})
    done = pa.resolve(session=session, action="apply", reason="then")
    assert not done.is_error, done.text
    assert (folder / f"{session}.txt").read_text() == "ok"


def await_write(folder: Path, timeout: float = 20.0) -> None:
    """Until the upstream has made a write and kept its idempotency key (two records, each
    fsynced, in that order: a kill between them, which a loaded machine met, is a server that
    does not keep its keys, not the fault the tests mean)."""
    applied = folder / ".applied.jsonl"
    wait_until(lambda: writes(folder) and applied.exists() and applied.read_text().strip(),
               timeout, "the upstream's write and its key kept", interval_s=0.02)


@pytest.mark.parametrize("when", ["mid-call", "after-the-answer"])
def test_the_upstreams_write_happens_once_when_the_worker_is_killed(tmp_path: Path,
                                                                     when: str) -> None:
    """SIGKILL of the whole worker once the upstream has written: while the upstream has not
    answered yet (mid-call), or after it answered and before the outcome was recorded (at a
    failpoint). The lease expires, the action is pending again, and the next attempt calls the
    upstream with the same idempotency key, which answers its first result and writes nothing."""
    folder = tmp_path / "files"
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        if when == "mid-call":
            doomed = McpWorker(server.url, folder, overrides=FAST,
                               flags=("--pause-after-write", "3600")).start()
        else:
            doomed = McpWorker(server.url, folder,
                               overrides={**FAST, "failpoint": FAILPOINT}).start()
        action_id = pa.stage(session="s", tool="write_file", label="w", apply="mcp:files",
                             payload={"path": "once.txt", "text": "hello"})
        mark = tail_id(rc, K.workers)
        waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
        if when == "mid-call":
            await_write(folder)
        else:
            wait_for(rc, K.workers, lambda f: f.get(b"event") == FAILPOINT.encode(), mark)
        assert [(w["key"], w["attempt"]) for w in writes(folder)] == [(action_id, 1)]
        doomed.kill()
        workers.append(McpWorker(server.url, folder, overrides=FAST).start())
        lost = waiting.result(timeout=30)
        assert lost.is_error and "interrupted" in lost.text
        [again] = pa.pending("s")
        assert (again.id, again.attempts) == (action_id, 1)
        done = pa.resolve(session="s", action="apply", reason="retry")
        assert not done.is_error, done.text
        assert done.text == "Wrote 5 characters to once.txt"
        assert len(writes(folder)) == 1  # the retry (attempt 2) wrote nothing
        assert (folder / "once.txt").read_text() == "hello"
        assert events(rc, "s").count("applied") == 1
        rc.close()


def test_mcp_over_http_takes_a_producer_token_which_fixes_the_tenant(
        url: str, pa: PendingActions) -> None:
    rc = redis.Redis.from_url(url)
    tokens = Tokens(rc, Keys())
    suffix = uuid.uuid4().hex[:6]
    producer, _ = tokens.create("acme", "producer", f"agent-{suffix}")
    approver, _ = tokens.create("acme", "approver", f"alice-{suffix}")
    stranger, _ = tokens.create("other", "producer", f"other-{suffix}")
    session = f"h-{suffix}"
    action_id = pa.stage(session=session, tool="edit", label="Over HTTP", apply="t.ok",
                         tenant="acme")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pending_actions", "mcp", "--transport", "http", "--port",
         str(port)], cwd=ROOT, env=worker_env(url), stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    endpoint = f"http://127.0.0.1:{port}/mcp"
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("MCP (streamable HTTP) on")

        async def call(token: str, name: str, arguments: dict[str, str]) -> tuple[str, bool]:
            headers = {"Authorization": f"Bearer {token}", "Pending-Actions-Session": session}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                    streamable_http_client(endpoint, http_client=http) as (read, write), \
                    ClientSession(read, write) as mcp:
                await mcp.initialize()
                assert sorted(t.name for t in (await mcp.list_tools()).tools) == \
                    ["pending", "resolve"]
                got = await mcp.call_tool(name, arguments)
                if name == "resolve" and not got.is_error:
                    assert text(got).startswith("Accept: Over HTTP")
                    assert resolved(got).details["label"] == "Over HTTP"
                return text(got), got.is_error

        said, failed = anyio.run(call, stranger, "pending", {})
        # another tenant's session is one with nothing in it (tests/test_mcp_limits.py)
        assert not failed and said == NOTHING_PENDING
        said, failed = anyio.run(call, producer, "pending", {})
        assert not failed and action_id in said
        said, failed = anyio.run(call, producer, "resolve", {"action": "apply", "reason": "r"})
        assert not failed and pa.pending(session) == []

        hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        accept = {"Accept": "application/json, text/event-stream"}
        assert httpx.post(endpoint, json=hello, headers=accept).status_code == 401
        refused = httpx.post(endpoint, json=hello,
                             headers={**accept, "Authorization": f"Bearer {approver}"})
        assert refused.status_code == 403  # a person's token is not the model's
    finally:
        proc.terminate()
        proc.wait(30)
        rc.close()
