"""Expiry (stage(ttl=)) across real processes: past its ttl an action is gone for every reader at
once, and the resolve worker's recovery loop ends it with the outcome ``expired`` even while
every handler thread is busy; no handler runs for it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.atomic.replies import TakeStatus
from pending_actions.broker.context import Context
from pending_actions.broker.keys import NOTHING_DUE
from pending_actions.broker.routing import LiveView, heartbeat
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.producers.tool import render
from pending_actions.workers.recovery import Recovery
from tests.support.procs import Worker
from tests.support.replies import command_calls
from tests.support.runs import runs
from tests.support.waits import history_event

PREFIX = "pa"


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(directory=Path(tmp_path_factory.mktemp("redis-expiry"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def busy_worker(own_redis: EmbeddedRedis) -> Iterator[Worker]:
    """One handler thread only (so one gated handler keeps it busy) and a quick recovery loop,
    on a Redis of its own so no other worker serves its requests."""
    w = Worker(own_redis.url, overrides={"worker_threads": "1",
                                         "recovery_interval_ms": "100"}).start()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def epa(own_redis: EmbeddedRedis, busy_worker: Worker) -> Iterator[PendingActions]:
    client = PendingActions.from_url(own_redis.url, resolve_timeout_s=30)
    yield client
    client.close()


@pytest.fixture
def erc(own_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url)
    yield client
    client.close()


def test_expires_with_every_handler_thread_busy(epa: PendingActions, erc: redis.Redis) -> None:
    rc = erc
    busy, session = f"busy-{uuid.uuid4().hex[:8]}", f"exp-{uuid.uuid4().hex[:8]}"
    gate = f"test:gate:{busy}"
    epa.stage(session=busy, tool="edit", label="gated", apply="t.gate", payload={"gate": gate})
    held = threading.Thread(target=epa.resolve,
                            kwargs={"session": busy, "action": "apply", "reason": "hold"})
    held.start()
    try:
        assert rc.blpop([f"test:started:{busy}"], timeout=20) is not None  # the thread is busy
        action_id = epa.stage(session=session, tool="edit", label="Short-lived",
                              apply="t.ok", reject="t.reject_text", ttl=0.3)
        staged = epa.pending(session)[0]
        assert staged.expires_at is not None and staged.expires_at > staged.created_at
        choice = epa.next_tool_choice(session)
        assert choice is not None and choice["id"] == action_id
        ended = history_event(rc, Keys(PREFIX).history(session), "expired", 10)
        assert ended["id"] == action_id and int(ended["expires_at"]) > 0
        assert epa.pending(session) == [] and epa.next_tool_choice(session) is None
        assert epa.show(session, action_id) is None
        # no handler ran: neither apply nor reject
        assert runs(rc, session) == []
        # a resolver that targets it is told it expired, and nothing changes
        res = epa.resolve(session=session, action="apply", reason="late click",
                          expect_id=action_id)
        assert res.is_error and res.text.startswith(f"Expired: {action_id}")
        assert res.details["expect_id"] == action_id
        assert render(res).startswith("Failed:")
        # its keys are gone but the history (expires_at of the staged entry included)
        assert not rc.hexists(Keys(PREFIX).actions(session), action_id)
        keys = Keys(PREFIX)
        assert rc.zscore(keys.expiries(keys.partition(session)), f"{session}/{action_id}") is None
        assert [e["event"] for e in epa.history(session)] == ["staged", "expired"]
    finally:
        rc.rpush(gate, "open")
        held.join(30)
    assert not held.is_alive()


def test_past_ttl_is_gone_for_readers_before_any_sweep(redis_server: EmbeddedRedis,
                                                       rc: redis.Redis) -> None:
    """No resolve worker serves this prefix, so nobody sweeps: readers alone must hide it."""
    prefix, session = f"nw{uuid.uuid4().hex[:6]}", "s1"
    heartbeat(rc, Keys(prefix), "p", ["t.ok"], "by-hand", 60_000)  # t.ok live, no worker
    pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
    try:
        keep = pa.stage(session=session, tool="edit", label="Keep", apply="t.ok")
        short = pa.stage(session=session, tool="edit", label="Short", apply="t.ok", ttl=0.2)
        choice = pa.next_tool_choice(session)
        assert choice is not None and choice["id"] == short
        time.sleep(0.3)  # the passing of time is what is tested here
        assert [a.id for a in pa.pending(session)] == [keep]
        choice = pa.next_tool_choice(session)
        assert choice is not None and choice["id"] == keep
        assert pa.show(session, short) is None
        assert [e["event"] for e in pa.history(session)] == ["staged", "staged"]
    finally:
        pa.close()


def test_resolve_after_expiry_targets_what_pending_shows(epa: PendingActions, erc: redis.Redis,
                                                         session: str) -> None:
    rc = erc
    keep = epa.stage(session=session, tool="edit", label="Keep", apply="t.ok")
    short = epa.stage(session=session, tool="edit", label="Short", apply="t.ok", ttl=0.2)
    history_event(rc, Keys(PREFIX).history(session), "expired", 10)
    res = epa.resolve(session=session, action="apply", reason="r")
    assert (res.is_error, res.details["label"]) == (False, "Keep")
    assert [r["id"] for r in runs(rc, session)] == [keep]
    assert short not in {r["id"] for r in runs(rc, session)}


@pytest.mark.parametrize("ttl", [0, -1, "10", True])
def test_bad_ttl_is_refused(pa: PendingActions, session: str, ttl: object) -> None:
    from pending_actions.broker.errors import InvalidInput

    with pytest.raises(InvalidInput) as err:
        pa.stage(session=session, tool="edit", label="L", apply="t.ok", ttl=ttl)  # type: ignore[arg-type]
    assert err.value.field == "ttl"


@pytest.mark.parametrize("layout", ["current", "older"])
def test_take_passes_over_an_expired_head_whatever_its_spec_layout(
        redis_server: EmbeddedRedis, rc: redis.Redis, layout: str) -> None:
    """take.lua asks the expiry index only about a spec whose own JSON text says it may have a
    ttl. A spec stored by an older version (payload ahead of expires_at, here a payload that
    itself holds an "expires_at": null) must still be looked up, never taken past its ttl."""
    prefix, session = f"nw{uuid.uuid4().hex[:6]}", "s1"
    keys = Keys(prefix)
    heartbeat(rc, keys, "p", ["t.ok"], "by-hand", 60_000)  # t.ok live, no worker
    pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
    try:
        keep = pa.stage(session=session, tool="edit", label="Keep", apply="t.ok")
        short = pa.stage(session=session, tool="edit", label="Short", apply="t.ok", ttl=0.2,
                         payload={"expires_at": None})
        stored = orjson.loads(rc.hget(keys.actions(session), short) or b"")
        assert list(stored).index("expires_at") < list(stored).index("payload")
        if layout == "older":
            at = stored.pop("expires_at")
            rc.hset(keys.actions(session), short, orjson.dumps({**stored, "expires_at": at}))
        time.sleep(0.3)  # the passing of time is what is tested here
        live = LiveView(rc, keys).get()
        taken = pa.ctx.scripts.take(
            session, req="req-1", action="apply", token=uuid.uuid4().hex, reason="r",
            extra=b"null", marker_ttl_s=60, none_reply=b"{}", live=live, message=None).run()
        assert taken.id == keep
    finally:
        pa.close()


def test_one_record_of_a_ttl_which_holds_while_the_action_is_in_flight(
        redis_server: EmbeddedRedis, rc: redis.Redis) -> None:
    """An action's ttl is recorded once: its member ``<session>/<id>`` in its partition's
    expiries, score the expiry of the history's staged entry, and no key of the session's own.
    Taken before its ttl passes, it stays in flight past it; the sweep leaves it to its attempt
    and leaves its score, the expiry every reader checks: once the failed attempt puts it back it
    is gone for pending and peek at once, and the sweep ends it a lease later (by which time
    a resolve naming it is told it expired). No resolve worker serves this prefix: the scripts
    and the recovery loop's sweep are driven here."""
    prefix, session = f"nw{uuid.uuid4().hex[:6]}", "s1"
    keys = Keys(prefix)
    index, lease_ms = keys.expiries(keys.partition(session)), 1000
    heartbeat(rc, keys, "p", ["t.ok"], "by-hand", 60_000)  # t.ok live, no worker
    pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
    ctx = Context.create(Settings(redis_url=redis_server.url, key_prefix=prefix,
                                  lease_ms=lease_ms), role="worker")
    sweep = Recovery(ctx, "test", threading.Event())
    try:
        keep = pa.stage(session=session, tool="edit", label="Keep", apply="t.ok")
        short = pa.stage(session=session, tool="edit", label="Short", apply="t.ok", ttl=0.3)
        member = keys.expiry_member(session, short)
        staged = next(e for e in pa.history(session) if e["id"] == short)
        assert rc.zscore(index, member) == float(staged["expires_at"])
        own: Any = rc.keys(f"{prefix}:*:s:{session}:*")
        assert sorted(k.decode().rpartition(":")[2] for k in own) == [
            "actions", "history", "stack"]

        live = LiveView(rc, keys).get()
        taken = ctx.scripts.take(
            session, req="req-1", action="apply", token=uuid.uuid4().hex, reason="r",
            extra=b"null", marker_ttl_s=60, none_reply=b"{}", live=live, message=None).run()
        assert taken.id == short
        time.sleep(0.35)  # the passing of time is what is tested here: the ttl passes
        assert sweep.expire_due() == 0  # in flight: left to its attempt
        assert rc.zscore(index, member) == float(staged["expires_at"])
        assert member.encode() in sweep.in_flight

        assert ctx.scripts.readd(session, token=taken.token, req="req-1", last_error="boom",
                                 reply=b"{}", action_id=short, attempt=taken.attempt).run()
        assert rc.zscore(keys.stack(session), short) is not None  # back on the stack, yet:
        assert [a.id for a in pa.pending(session)] == [keep]
        choice = pa.next_tool_choice(session)
        assert choice is not None and choice["id"] == keep
        assert sweep.expire_due() == 0  # looked at again a lease after the first look, not now
        time.sleep(lease_ms / 1000)  # as above: a lease passes
        assert sweep.expire_due() == 1
        assert sweep.in_flight == {}
        ended = [e for e in pa.history(session) if e["event"] == "expired"]
        assert [(e["id"], e["expires_at"]) for e in ended] == [(short, staged["expires_at"])]
        assert rc.zscore(index, member) is None
        assert not rc.hexists(keys.actions(session), short)

        late = ctx.scripts.take(
            session, req="req-2", action="apply", token=uuid.uuid4().hex, reason="r",
            extra=b"null", marker_ttl_s=60, none_reply=b"{}", live=live, message=None,
            expect_id=short, conflict_reply=b"conflict", expired_reply=b"expired").run()
        assert late.status is TakeStatus.CONFLICT
        assert rc.lrange(keys.reply(session, "req-2"), 0, -1) == [b"expired"]
    finally:
        ctx.client.close()
        pa.close()



def test_an_idle_sweep_reads_the_marks_not_every_index(tmp_path: Path) -> None:
    """Each partition's expiry index has a mark that no entry is due before: stage lowers it,
    the sweep sets it from the index after reading it. So an idle round reads the marks (one
    MGET on one Redis), and a round with something due reads that partition's index only; a
    mark that is lost, does not parse or holds another type only costs a read of its index;
    an entry added without lowering the mark (an older producer) still ends at the full sweep.
    On a Redis of its own, so that its command counts are this test's alone; the sweep is
    driven here."""
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    rc = redis.Redis.from_url(server.url)
    keys, session = Keys("mk"), "s1"
    p = keys.partition(session)
    heartbeat(rc, keys, "p", ["t.ok"], "by-hand", 60_000)  # t.ok live, no worker
    pa = PendingActions.from_url(server.url, key_prefix=keys.prefix)
    ctx = Context.create(Settings(redis_url=server.url, key_prefix=keys.prefix), role="worker")
    sweep = Recovery(ctx, "test", threading.Event())
    try:
        assert sweep.expire_due() == 0  # the first round reads every index, then marks it
        assert {rc.get(keys.expiries_due(q)) for q in range(keys.partitions)} == {
            str(NOTHING_DUE).encode()}
        rc.config_resetstat()
        for _ in range(3):
            assert sweep.expire_due() == 0
        calls = command_calls(rc)
        assert calls.get("mget") == 3 and "zrangebyscore" not in calls and "evalsha" not in calls

        short = pa.stage(session=session, tool="edit", label="Short", apply="t.ok", ttl=0.3)
        expiry = rc.zscore(keys.expiries(p), keys.expiry_member(session, short))
        assert expiry is not None and rc.get(keys.expiries_due(p)) == b"%d" % expiry
        time.sleep(0.35)  # the passing of time is what is tested here: the ttl passes
        rc.config_resetstat()
        assert sweep.expire_due() == 1
        assert command_calls(rc).get("zrangebyscore") == 1  # its partition's index, no other
        assert [e["id"] for e in pa.history(session) if e["event"] == "expired"] == [short]
        assert rc.get(keys.expiries_due(p)) == str(NOTHING_DUE).encode()

        # an operator's doing: the mark deleted, garbage, another type; stage goes on
        for spoil in (lambda: rc.delete(keys.expiries_due(p)),
                      lambda: rc.set(keys.expiries_due(p), "soon"),
                      lambda: (rc.delete(keys.expiries_due(p)),
                               rc.hset(keys.expiries_due(p), "x", "y"))):
            spoil()
            gone = pa.stage(session=session, tool="edit", label="Spoilt", apply="t.ok", ttl=0.2)
            time.sleep(0.25)  # as above
            assert sweep.expire_due() == 1
            assert rc.get(keys.expiries_due(p)) == str(NOTHING_DUE).encode()
            assert not rc.hexists(keys.actions(session), gone)

        # an older producer adds to the index and leaves the mark as it was
        old = pa.stage(session=session, tool="edit", label="Old", apply="t.ok")
        rc.zadd(keys.expiries(p), {keys.expiry_member(session, old): 0})
        assert sweep.expire_due() == 0  # the mark says nothing is due
        sweep.next_full_sweep = 0.0  # the full sweep's time has come
        assert sweep.expire_due() == 1
        assert not rc.hexists(keys.actions(session), old)
    finally:
        ctx.client.close()
        pa.close()
        rc.close()
        server.stop()
