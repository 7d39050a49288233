"""tests/support/unchanged.py, the check every refusal test stands on: a lease renewed between
its two reads (renew.lua, as a running attempt's renewer does on its own) is no change; a lease
made or ended, or any other field of it changed, is one."""

from __future__ import annotations

import uuid

import redis

from pending_actions.broker.atomic.replies import TakeStatus
from pending_actions.broker.keys import Keys
from pending_actions.broker.routing import LiveView, heartbeat
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.support.unchanged import diff, live, snapshot


def test_a_renewal_is_no_change_and_a_lease_ended_or_rewritten_is_one(
        redis_server: EmbeddedRedis) -> None:
    prefix, session = f"un{uuid.uuid4().hex[:6]}", "s1"
    keys = Keys(prefix)
    rc = redis.Redis.from_url(redis_server.url)
    heartbeat(rc, keys, "p", ["t.ok"], "by-hand", 60_000)
    pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
    scripts, token = pa.ctx.scripts, uuid.uuid4().hex
    theirs = live(keys)

    def ignored(key: bytes) -> bool:  # another test's keys, and what idles by itself
        return not key.startswith(prefix.encode()) or theirs(key)

    try:
        pa.stage(session=session, tool="t", label="L", apply="t.ok")
        taken = scripts.take(session, req="r1", action="apply", token=token, reason="r",
                             extra=b"null", marker_ttl_s=60, none_reply=b"{}",
                             live=LiveView(rc, keys).get(), message=None).run()
        assert taken.status is TakeStatus.OK
        before = snapshot(rc, ignored)
        lease = rc.hget(keys.inflight(session), token)
        assert isinstance(lease, bytes)
        rc.blpop(["test:never"], timeout=0.01)  # a later ms: the deadline moves
        scripts.renew(session, token=token).run()
        assert rc.hget(keys.inflight(session), token) != lease  # renewed: its deadline moved
        assert diff(before, snapshot(rc, ignored)) == []
        rc.hset(keys.inflight(session), token, lease.replace(b'"attempt":1', b'"attempt":2'))
        [changed] = diff(before, snapshot(rc, ignored))
        assert changed.startswith(f"changed b'{keys.inflight(session)}'"), changed
        rc.zrem(keys.leases(keys.partition(session)), keys.lease_member(session, token))
        assert any(line.startswith(f"removed b'{keys.leases(keys.partition(session))}'")
                   for line in diff(before, snapshot(rc, ignored)))
    finally:
        pa.close()
        rc.close()
