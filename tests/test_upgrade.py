"""A deployment of an older version, upgraded in place by a resolve worker's start: the
sessions index (a SET, each session's tenant in a string key) is turned into the hash, and its
sessions keep their tenants; each session's stack (a LIST, head on the left) becomes a ZSET,
head first."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.context import Context
from pending_actions.broker.errors import Forbidden
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.workers.upgrade import upgrade, upgrade_stacks
from tests.support.procs import Worker
from tests.support.replies import byte_list


def test_a_resolve_worker_upgrades_the_older_sessions_index(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(directory=tmp_path).start()  # nothing else of ours on it
    prefix = "pa"
    rc = redis.Redis.from_url(redis_server.url)
    keys = Keys(prefix)
    theirs, slot_only, mine = "acme-1", "slot-only", "plain"
    planted: tuple[tuple[str, str | None], ...] = (
        (theirs, "acme"), (slot_only, None), (mine, "default"))
    for session, tenant in planted:
        rc.sadd(keys.sessions(keys.partition(session)), session)
        rc.xadd(keys.history(session), {"event": "staged", "id": "pending-action:t:1"})
        # the id counter as the older version's stage left it (an INCRBY, no mark beside it)
        rc.set(keys.seq(keys.partition(session)), 1)
        if tenant is not None:
            rc.set(keys.legacy_tenant(session), tenant)
    worker = Worker(redis_server.url).start()
    try:
        ctx = Context.create(Settings(redis_url=redis_server.url))
        assert upgrade(ctx) == 0  # the worker's start did it already
        for session, claim in ((theirs, b"acme"), (slot_only, b""), (mine, b"default")):
            assert rc.hget(keys.sessions(keys.partition(session)), session) == claim
            assert not rc.exists(keys.legacy_tenant(session))
        pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
        try:
            pa.stage(session=theirs, tool="t", label="x", apply="t.ok", tenant="acme")
            with pytest.raises(Forbidden):
                pa.stage(session=theirs, tool="t", label="x", apply="t.ok")
            pa.stage(session=slot_only, tool="t", label="x", apply="t.ok", tenant="other")
            assert not pa.resolve(session=theirs, action="apply", reason="r").is_error
        finally:
            pa.close()
    finally:
        worker.stop()
        rc.close()
        redis_server.stop()


def _as_old_list(rc: redis.Redis, key: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Rewrite a stack as the older version kept it: a LIST, head on the left (``extra``
    appended below, as a list may hold an id twice). Returns its ids head first."""
    got: Any = rc.zrange(key, 0, -1)
    ids = [x.decode() for x in got]
    rc.delete(key)
    rc.rpush(key, *ids, *extra)
    return ids


def test_a_resolve_worker_upgrades_the_older_list_stacks(tmp_path: Path) -> None:
    """Stacks written as the older LIST become ZSETs, head first, at a resolve worker's start;
    a stack already a zset is left as it is; a resolve then takes the old head. A list an
    older producer makes later is moved when a take meets it."""
    redis_server = EmbeddedRedis(directory=tmp_path).start()
    rc = redis.Redis.from_url(redis_server.url)
    keys = Keys()
    overrides = {"claim_idle_ms": "300"}
    worker = Worker(redis_server.url, overrides=overrides).start()
    # "deep" holds more than a session may by default
    pa = PendingActions.from_url(redis_server.url, max_pending_per_session=2000)
    try:
        def stage(session: str, n: int) -> None:
            pa.stage_many({"session": session, "tool": "t", "label": f"{session}-{i}",
                           "apply": "t.ok"} for i in range(n))

        for session, n in (("few", 3), ("one", 1), ("deep", 1500), ("modern", 2)):
            stage(session, n)
        worker.stop()
        old: dict[str, list[str]] = {}
        for session in ("few", "one", "deep"):
            # "few" holds its bottom id twice, below: the copy nearer the head is kept
            bottom = rc.zrange(keys.stack(session), -1, -1)
            extra = tuple(x.decode() for x in byte_list(bottom)) if session == "few" else ()
            old[session] = _as_old_list(rc, keys.stack(session), extra)
            assert rc.type(keys.stack(session)) == b"list"
        rc.delete(keys.layout)  # an older version writes no layout mark
        modern: Any = rc.zrange(keys.stack("modern"), 0, -1, withscores=True)
        worker = Worker(redis_server.url, overrides=overrides).start()
        ctx = Context.create(Settings(redis_url=redis_server.url))
        assert upgrade(ctx) == 0  # the worker's start did it already
        for session, ids in old.items():
            got: Any = rc.zrange(keys.stack(session), 0, -1, withscores=True)
            assert rc.type(keys.stack(session)) == b"zset"
            assert [(i.decode(), s) for i, s in got] == [(i, float(n)) for n, i in enumerate(ids)]
        assert rc.zrange(keys.stack("modern"), 0, -1, withscores=True) == modern
        for session, ids in (*old.items(), ("modern", [m.decode() for m, _s in modern])):
            result = pa.resolve(session=session, action="apply", reason="r", timeout=20)
            assert not result.is_error, result.text
            assert [a.id for a in pa.pending(session, limit=2000)] == ids[1:]
        # an older producer, still running, makes a new session's stack a list: the take that
        # meets it moves it, and the request, claimed again, is served
        stage("late", 2)
        late = _as_old_list(rc, keys.stack("late"))
        result = pa.resolve(session="late", action="apply", reason="r", timeout=20)
        assert not result.is_error, result.text
        assert [a.id for a in pa.pending("late")] == late[1:]
    finally:
        pa.close()
        worker.stop()
        rc.close()
        redis_server.stop()


def test_two_upgrades_at_once_move_each_stack_once(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(directory=tmp_path).start()
    rc = redis.Redis.from_url(redis_server.url)
    keys = Keys()
    sessions = [f"s{i}" for i in range(60)]
    try:
        for n, session in enumerate(sessions):
            rc.hset(keys.sessions(keys.partition(session)), session, "default")
            rc.rpush(keys.stack(session),
                               *(f"pending-action:t:{n}-{j}" for j in range(1 + n % 4)))
        ctxs = [Context.create(Settings(redis_url=redis_server.url)) for _ in range(2)]
        start = threading.Barrier(2)

        def run(ctx: Context) -> int:
            start.wait()
            return upgrade_stacks(ctx)

        with ThreadPoolExecutor(2) as pool:
            moved = list(pool.map(run, ctxs))
        assert sum(moved) == len(sessions)
        for n, session in enumerate(sessions):
            got: Any = rc.zrange(keys.stack(session), 0, -1)
            assert [x.decode() for x in got] == [f"pending-action:t:{n}-{j}"
                                                 for j in range(1 + n % 4)]
        assert [upgrade_stacks(c) for c in ctxs] == [0, 0]
        # every stack looked at: later starts skip the scan (a take moves a later list)
        assert rc.get(keys.layout) == b"zset-stacks"
        rc.hset(keys.sessions(keys.partition("late")), "late", "default")
        rc.rpush(keys.stack("late"), "pending-action:t:late")
        assert upgrade_stacks(ctxs[0]) == 0 and rc.type(keys.stack("late")) == b"list"
    finally:
        rc.close()
        redis_server.stop()


def test_a_resolve_worker_builds_the_tenant_indexes_from_the_owner_records(
        tmp_path: Path) -> None:
    """An older version kept each tenant's sessions in one set across partitions, written
    beside the stage whatever it answered (so it could name another tenant's session). The
    indexes are built from the owner records instead; the old sets and the old feed are left
    as they were, read by nothing."""
    from pending_actions.views import tenant_sessions

    redis_server = EmbeddedRedis(directory=tmp_path).start()
    rc = redis.Redis.from_url(redis_server.url)
    keys = Keys()
    owners = {"acme-1": "acme", "acme-2": "acme", "plain": "default", "slot": ""}
    for session, tenant in owners.items():
        p = keys.partition(session)
        rc.hset(keys.sessions(p), session, tenant)
        rc.xadd(keys.history(session), {"event": "staged", "id": f"pending-action:t:{16 + p}"})
        rc.set(keys.seq(p), 1)
    legacy = keys.legacy_tenant_sessions("acme")
    rc.sadd(legacy, "acme-1", "acme-2", "plain")  # "plain": what a refused stage left there
    rc.xadd(keys.legacy_events, {"event": "staged", "session": "plain", "tenant": "acme"})
    rc.set(keys.layout, "zset-stacks")  # the older version's last layout
    worker = Worker(redis_server.url).start()
    pa = PendingActions.from_url(redis_server.url)
    try:
        assert rc.get(keys.layout) == b"tenant-indexes"
        assert sorted(tenant_sessions(pa, "acme")) == ["acme-1", "acme-2"]
        for p in range(keys.partitions):
            assert not rc.exists(keys.tenant_index(p, "default"), keys.tenant_index(p, ""))
        assert rc.smembers(legacy) == {b"acme-1", b"acme-2", b"plain"}
        assert rc.xlen(keys.legacy_events) == 1
        ctx = Context.create(Settings(redis_url=redis_server.url))
        assert upgrade(ctx) == 0  # done once: later starts skip it
        # a session the older version claimed is the tenant's, and only the tenant's
        pa.stage(session="acme-1", tool="t", label="x", apply="t.ok", tenant="acme")
        with pytest.raises(Forbidden):
            pa.stage(session="plain", tool="t", label="x", apply="t.ok", tenant="acme")
    finally:
        pa.close()
        worker.stop()
        rc.close()
        redis_server.stop()
