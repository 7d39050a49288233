"""Staging beyond the contract's rows, on one Redis and on a cluster: what a spec stores, the
session's tenant claim, a batch longer than one MULTI/EXEC, Redis without the script (SCRIPT
FLUSH), and a key of another type."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson
import pytest
import redis

from pending_actions.broker.errors import Forbidden, Poison
from pending_actions.producers import AsyncPendingActions, PendingActions
from pending_actions.views import all_sessions
from tests.conftest import Deployment, both
from tests.support.replies import byte_list, entries


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def staged_ids(pa: PendingActions, session: str) -> list[str]:
    return [e["id"] for e in pa.history(session, count=10_000) if e["event"] == "staged"]


def test_a_spec_stores_what_is_not_a_default(pa: PendingActions, rc: redis.Redis,
                                             session: str) -> None:
    k = pa.ctx.keys
    plain = pa.stage(session=session, tool="edit", label="L", apply="t.ok", payload={"a": 1})
    [text] = byte_list([rc.hget(k.actions(session), plain)])
    # the id, its tool and the session are where the spec is stored: not in it
    assert list(orjson.loads(text)) == ["label", "apply", "payload", "created_at"]
    [read] = pa.pending(session)
    assert (read.id, read.session, read.tool, read.kind, read.reject, read.expires_at,
            read.fingerprint, read.payload_schema, read.tenant) == \
        (plain, session, "edit", "action", None, None, None, None, "default")
    other = f"{session}-red"
    full = pa.stage(session=other, tool="edit", label="L", apply="t.ok", reject="t.ok",
                    payload={"b": "x"}, ttl=600, fingerprint="f1",
                    schema={"type": "object"}, tenant="red")
    [text] = byte_list([rc.hget(k.actions(other), full)])
    # take.lua reads apply and reject from the text: both ahead of anything free-form
    assert text.index(b'"reject":"t.ok"') < text.index(b'"payload"')
    [read] = pa.pending(other)
    assert (read.reject, read.fingerprint, read.payload_schema, read.tenant, read.payload) == \
        ("t.ok", "f1", {"type": "object"}, "red", {"b": "x"})
    assert read.expires_at is not None and read.expires_at - read.created_at == 600
    assert pa.tenant_of(session) == "default" and pa.tenant_of(other) == "red"
    # the default tenant has no index of its own: its sessions are found in the hashes; red's
    # session is in red's index of its partition, claimed in the step that staged
    assert not rc.exists(k.tenant_index(k.partition(session), "default"))
    assert rc.smembers(k.tenant_index(k.partition(other), "red")) == {other.encode()}
    default, red = set(all_sessions(pa, "default")), set(all_sessions(pa, "red"))
    assert session in default and other not in default
    assert other in red and session not in red and {session, other} <= set(all_sessions(pa))


def test_one_session_of_another_tenant_is_refused_by_the_script(pa: PendingActions,
                                                                 session: str) -> None:
    """A batch in one session is not looked at ahead (stage.lua refuses it atomically)."""
    mine = pa.stage(session=session, tool="edit", label="L", apply="t.ok", tenant="red")
    with pytest.raises(Forbidden):
        pa.stage(session=session, tool="edit", label="L", apply="t.ok", tenant="blue")
    with pytest.raises(Forbidden):
        pa.stage_many({"session": session, "tool": "edit", "label": "L", "apply": "t.ok",
                       "tenant": "blue"} for _ in range(3))
    assert [a.id for a in pa.pending(session)] == [mine] and staged_ids(pa, session) == [mine]
    assert pa.tenant_of(session) == "red"


def test_a_batch_longer_than_a_transaction(pa: PendingActions, rc: redis.Redis, session: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pa.core, "CHUNK", 4)
    sessions = [f"{session}-{i}" for i in range(3)]
    ids = pa.stage_many({"session": sessions[i % 3], "tool": "edit", "label": f"L{i}",
                         "apply": "t.ok"} for i in range(14))
    for n, s in enumerate(sessions):
        mine = ids[n::3]
        assert [a.id for a in pa.pending(s)] == mine[::-1]  # the last one given is the head
        assert staged_ids(pa, s) == mine
    # each session's partition feed has one entry per stage, with the fields an XADD of its
    # own would have (stage.lua writes them)
    k = pa.ctx.keys
    feed = {f[b"id"].decode(): f for s in sessions
            for _e, f in entries(rc.xrevrange(k.events(k.partition(s)), count=1000))
            if f[b"id"].decode() in ids}
    assert set(feed) == set(ids)
    one = feed[ids[0]]
    assert list(one) == [b"event", b"at", b"session", b"tenant", b"id", b"tool", b"kind",
                         b"created_at"]
    assert (one[b"event"], one[b"session"], one[b"tenant"], one[b"tool"], one[b"kind"]) == \
        (b"staged", sessions[0].encode(), b"default", b"edit", b"action")


def test_a_batch_leaves_the_history_and_the_feed_about_their_maxlen(
        deployment: Deployment, session: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """stage.lua appends to the history and the feed without trimming, then trims each once
    per call: a stream ends at least maxlen long, and shorter than maxlen and a whole stream
    node (at most 100 entries) more."""
    monkeypatch.setattr("pending_actions.broker.atomic.scripts.feed_cap", lambda _keys: 20)
    pa = PendingActions.from_url(deployment.url, history_maxlen=10)
    try:
        monkeypatch.setattr(pa.core, "CHUNK", 100)
        pa.stage_many({"session": session, "tool": "edit", "label": f"L{i}", "apply": "t.ok"}
                      for i in range(400))
        k, rc = pa.ctx.keys, deployment.rc
        assert 10 <= rc.xlen(k.history(session)) < 10 + 100
        assert 20 <= rc.xlen(k.events(k.partition(session))) < 20 + 100
    finally:
        pa.close()


@pytest.mark.parametrize("chunk", [250, 2])
def test_a_stage_after_redis_lost_its_scripts(pa: PendingActions, rc: redis.Redis,
                                              session: str, chunk: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """SCRIPT FLUSH (as a restart or a failover leaves Redis): the calls sent by digest come
    back NOSCRIPT and go again with the body, those of every transaction of a batch; each
    action is staged once."""
    monkeypatch.setattr(pa.core, "CHUNK", chunk)
    rc.script_flush()
    sessions = [f"{session}-{i}" for i in range(2)]
    ids = pa.stage_many({"session": sessions[i % 2], "tool": "edit", "label": "L",
                         "apply": "t.ok"} for i in range(5))
    for n, s in enumerate(sessions):
        assert [a.id for a in pa.pending(s)] == ids[n::2][::-1]
        assert staged_ids(pa, s) == ids[n::2]
    again = pa.stage(session=sessions[0], tool="edit", label="L", apply="t.ok")
    assert pa.pending(sessions[0])[0].id == again


@pytest.mark.parametrize("chunk", [250, 2])
def test_the_async_client_after_redis_lost_its_scripts(deployment: Deployment,
                                                      rc: redis.Redis, session: str,
                                                      chunk: int) -> None:
    """As above, with ``AsyncPendingActions``; with a chunk of 2, a batch of 7 is 4
    transactions sent back to back, each with its own NOSCRIPT replies."""
    rc.script_flush()
    sessions = [f"{session}-{i}" for i in range(2)]

    async def main() -> list[str]:
        async with AsyncPendingActions(deployment.pa.settings) as apa:
            apa.core.CHUNK = chunk
            return await apa.stage_many({"session": sessions[i % 2], "tool": "edit",
                                         "label": "L", "apply": "t.ok"} for i in range(7))

    ids = asyncio.run(main())
    for n, s in enumerate(sessions):
        assert [a.id for a in deployment.pa.pending(s)] == ids[n::2][::-1]
        assert staged_ids(deployment.pa, s) == ids[n::2]


PLANT: dict[str, Callable[[PendingActions, str], str]] = {
    "stack": lambda pa, s: pa.ctx.keys.stack(s),
    "actions": lambda pa, s: pa.ctx.keys.actions(s),
    "history": lambda pa, s: pa.ctx.keys.history(s),
    "sessions": lambda pa, s: pa.ctx.keys.sessions(pa.ctx.keys.partition(s)),
    "expiries": lambda pa, s: pa.ctx.keys.expiries(pa.ctx.keys.partition(s)),
    "feed": lambda pa, s: pa.ctx.keys.events(pa.ctx.keys.partition(s)),
    "tenants": lambda pa, s: pa.ctx.keys.tenant_index(pa.ctx.keys.partition(s), "red"),
}


def warmed(pa: PendingActions, session: str) -> None:
    """Stage once in another session of ``session``'s partition: ``pa`` then holds ids of that
    partition, and its next stage there reserves no block (stage.lua alone checks)."""
    k = pa.ctx.keys
    other = next(f"{session}-{i}" for i in range(10_000)
                 if k.partition(f"{session}-{i}") == k.partition(session))
    pa.stage(session=other, tool="edit", label="L", apply="t.ok", tenant="red")


@pytest.mark.parametrize("ids", ["reserved", "cached"])
@pytest.mark.parametrize("kind", sorted(PLANT))
def test_a_key_of_another_type_is_refused_before_any_write(
        deployment: Deployment, rc: redis.Redis, session: str, kind: str, ids: str) -> None:
    # a fresh client reserves an id block, and checks the session's keys before it does; a
    # warmed one has ids of the partition, and stage.lua checks: both say POISON, the same
    pa = PendingActions.from_url(deployment.url) if ids == "reserved" else deployment.pa
    k = pa.ctx.keys
    key = PLANT[kind](pa, session)
    if ids == "cached":
        warmed(pa, session)
    aside = f"{key}:aside"  # the partition's keys are shared: kept aside, then back
    # a partition never staged in has no id counter, and with a feed it looks used: no id
    # would be handed out (Damaged) before stage.lua could say what it finds
    rc.set(k.seq(k.partition(session)), 0, nx=True)
    if rc.exists(key):
        rc.rename(key, aside)
    try:
        rc.set(key, "junk")
        with pytest.raises(Poison) as bad:
            pa.stage(session=session, tool="edit", label="L", apply="t.ok", ttl=60,
                     tenant="red")
        assert (bad.value.what, bad.value.key, bad.value.field) == ("type", key, "string")
        written = [x for x in (k.stack(session), k.actions(session), k.history(session))
                   if x != key and rc.exists(x)]
        assert written == []
        assert kind == "sessions" or pa.tenant_of(session) is None
        if kind != "expiries":  # the ttl's one record was not written either
            index = k.expiries(k.partition(session))
            assert list(rc.zscan_iter(index, match=f"{session}/*")) == []
    finally:
        rc.delete(key)
        if rc.exists(aside):
            rc.rename(aside, key)
        if pa is not deployment.pa:
            pa.close()


def test_a_spec_an_older_version_stored_reads_the_same(pa: PendingActions, rc: redis.Redis,
                                                       session: str) -> None:
    """Older specs carry their id, session and tool: still read, and the same."""
    k = pa.ctx.keys
    action_id = pa.stage(session=session, tool="edit", label="L", apply="t.ok", payload={"a": 1})
    [before] = pa.pending(session)
    [text] = byte_list([rc.hget(k.actions(session), action_id)])
    rc.hset(k.actions(session), action_id, orjson.dumps(
        {"id": action_id, "session": session, "tool": "edit", **orjson.loads(text)}))
    assert pa.pending(session) == [before]
    assert pa.show(session, action_id) == before


def test_every_partitions_feed_is_read_as_one(deployment: Deployment) -> None:
    """What webhooks and metrics read: the stages of sessions in many partitions, followed from
    an id per partition, through a consumer group (claimed by another member while unacked),
    and the newest across partitions; on a cluster each partition is read on its master."""
    import threading
    import uuid

    from pending_actions.broker.feed import Feeds, order

    pa, rc = deployment.pa, deployment.rc
    feeds, stop = Feeds(pa.client, pa.ctx.keys), threading.Event()
    group = f"g-{uuid.uuid4().hex[:8]}"
    feeds.ensure_group(group)
    start = feeds.newest()
    sessions = [f"feed-{uuid.uuid4().hex[:8]}" for _ in range(24)]
    ids = {pa.stage(session=s, tool="edit", label="L", apply="t.ok") for s in sessions}
    assert len({pa.ctx.keys.partition(s) for s in sessions}) > 4
    try:
        seen: set[str] = set()
        for _ in range(20):
            got = feeds.read(start, 100, 200, stop)
            seen |= {f["id"] for _p, _e, f in got}
            start.update({p: e for p, e, _f in got})
            if ids <= seen:
                break
        assert ids <= seen
        mine = [e for _ in range(20) for e in feeds.read_group(group, "one", 100, 200, stop)
                if e[2]["id"] in ids]
        assert {f["id"] for _p, _e, f in mine} == ids
        claimed = [e for e in feeds.claim(group, "two", 0, 100) if e[2]["id"] in ids]
        assert sorted(claimed) == sorted(mine)
        feeds.ack(group, claimed)
        assert [e for e in feeds.claim(group, "two", 0, 100) if e[2]["id"] in ids] == []
        newest = sorted((e for each in feeds.latest(3) for e in each),
                        key=lambda e: order(e[1]), reverse=True)[:3]
        assert {f["id"] for _p, _e, f in newest} <= ids
    finally:
        for stream in feeds.streams:
            rc.xgroup_destroy(stream, group)
