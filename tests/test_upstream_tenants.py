"""An MCP upstream kept to some tenants (``--mcp-upstream-tenants NAME=T1,T2``, or any
``@handler(name, tenants=...)``), against a real Redis, a real worker with a real upstream
(tests/support/mcp_upstream.py) and ``mcp-proxy`` run as an MCP client runs it: another
tenant's stage of ``mcp:NAME`` is refused (``Denied``) with Redis unchanged, that tenant's
proxy does not start, and a worker whose upstream is kept to others never calls it for one."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import pending_actions
from pending_actions.broker.routing import Live, heartbeat, leave, parse_live, record
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from tests.support.faults import K
from tests.support.mcp import McpWorker, connect, text, upstream_option, writes
from tests.support.procs import worker_env
from tests.support.unchanged import redis_unchanged

KEPT = ("--mcp-upstream-tenants", "files=acme-2,acme")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-kept")).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def pa(url: str) -> Iterator[PendingActions]:
    client = PendingActions.from_url(url, resolve_timeout_s=30)
    yield client
    client.close()


def test_the_tenants_of_a_handler_are_those_every_pool_that_has_it_serves() -> None:
    pools = {b"a": record(["x", "y"], {"x": ["acme", "beta"]}),
             b"b": record(["x"], {"x": ["acme"]}), b"c": record(["x", "z"])}
    live: Live = parse_live([(1, 0), [(f"{p}/i", 9e15) for p in ("a", "b", "c")], pools])
    assert live.admits("x", "acme") and not live.admits("x", "beta")
    assert live.admits("y", "beta") and live.admits("z", "anyone")


def test_another_tenants_stage_is_refused_and_its_proxy_does_not_start(
        url: str, pa: PendingActions, folder: Path) -> None:
    # a pool that had the upstream for everyone before it was kept: beta's action staged then
    heartbeat(pa.client, K, "old-fleet", ["mcp:files"], "i1", 60_000)
    before = f"k-{uuid.uuid4().hex[:8]}"
    early = pa.stage(session=before, tool="write_file", label="W", apply="mcp:files",
                     payload={"path": "early.txt", "text": "beta"}, tenant="beta")
    leave(pa.client, K, "old-fleet", "i1")
    kept = McpWorker(url, folder)
    kept.child.argv += list(KEPT)
    kept.start()
    # a client of its own: the first one's view of live workers (the old fleet) is kept a while
    pa = PendingActions.from_url(url, resolve_timeout_s=30)
    try:
        session = f"k-{uuid.uuid4().hex[:8]}"
        with redis_unchanged(pa.client), pytest.raises(pending_actions.Denied) as caught:
            pa.stage(session=session, tool="write_file", label="W", apply="mcp:files",
                     payload={"path": "x.txt", "text": "beta"}, tenant="beta")
        assert "does not serve tenant 'beta'" in str(caught.value), caught.value
        assert "acme" not in str(caught.value)  # the other tenants' names are theirs
        assert caught.value.rule is None
        # the tenants it is kept to stage and apply as ever
        mine = pa.stage(session=session + "a", tool="write_file", label="W", apply="mcp:files",
                        payload={"path": "acme.txt", "text": "acme"}, tenant="acme")
        done = pa.resolve(session=session + "a", action="apply", reason="r")
        assert not done.is_error, done.text
        assert pa.pending(session + "a") == [] and mine
        assert (folder / "acme.txt").read_text() == "acme"
        # the action staged before: the worker that has the upstream now never runs it
        failed = pa.resolve(session=before, action="apply", reason="r")
        assert failed.is_error and "does not serve tenant 'beta'" in failed.text, failed.text
        assert [a.id for a in pa.pending(before)] == [early]
        assert not (folder / "early.txt").exists()
        assert [w["path"] for w in writes(folder)] == ["acme.txt"]
        # beta's proxy is refused before it starts anything: one line, exit 2
        proxy = subprocess.run(
            [sys.executable, "-m", "pending_actions", "mcp-proxy", "--session", session,
             "--upstream", "files", "--tenant", "beta", "--mcp-upstream",
             upstream_option(folder), *KEPT], env=worker_env(url), cwd=ROOT,
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert proxy.returncode == 2, proxy.stderr
        assert proxy.stderr.count("\n") == 1 and "not 'beta'" in proxy.stderr, proxy.stderr
        # started without the option, beta's proxy asks the live workers at its calls: it
        # forwards nothing to an upstream they keep to others
        (folder / "seen.txt").write_text("acme's")
        anyio.run(_forward_refused, url, folder, session + "p")
        assert [w["path"] for w in writes(folder)] == ["acme.txt"]
    finally:
        pa.close()
        kept.stop()


def test_a_bad_tenants_option_is_one_line(url: str, folder: Path) -> None:
    for option, said in (("other=acme", "no MCP upstream"), ("files=", "no tenant named"),
                         ("files=a b", "tenant"), ("nothing", "NAME=TENANT1,TENANT2")):
        got = subprocess.run(
            [sys.executable, "-m", "pending_actions", "worker", "--mcp-upstream",
             upstream_option(folder), "--mcp-upstream-tenants", option],
            env=worker_env(url), cwd=ROOT, capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL)
        assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
        assert said in got.stderr, got.stderr


async def _forward_refused(url: str, folder: Path, session: str) -> None:
    args = ["mcp-proxy", "--session", session, "--upstream", "files", "--tenant", "beta",
            "--mcp-upstream", upstream_option(folder)]
    async with connect(url, *args) as proxy:
        read = await proxy.call_tool("read_file", {"path": "seen.txt"})
        assert read.is_error and "does not serve tenant 'beta'" in text(read), text(read)
        assert "acme's" not in text(read)
