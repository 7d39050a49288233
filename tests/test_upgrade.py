"""A deployment of the version before the sessions hash, upgraded in place: its sessions index
(a SET, each session's tenant in a string key) is turned into the hash by a resolve worker's
start, and its sessions keep their tenants."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.context import Context
from pending_actions.broker.errors import Forbidden
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.workers.upgrade import upgrade
from tests.support.procs import Worker


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
