"""Retirement is paced by the retention: one pass over the stored sessions takes about
``retention_s / Retirement.PASSES`` in housekeeping rounds, so an idle worker beside many live
sessions looks at a few of them per round, not 200 per partition; a pass still reaches every
session, and what it finds finished it retires. Where the pass stands is kept in Redis, so two
workers taking rounds in turn carry one pass on. Driven by hand on a Redis of its own, so the
command counts are this test's alone."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pending_actions.broker.context import Context
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.workers.retention import Retirement
from tests.support.replies import command_calls

LIVE = 2_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis(directory=tmp_path / "redis").start()
    yield s
    s.stop()



def test_a_pass_is_paced_by_the_retention_and_reaches_every_session(
        server: EmbeddedRedis, caplog: pytest.LogCaptureFixture) -> None:
    # a pass of 100 s in rounds of 10 s: each round looks at about a tenth of the sessions
    settings = Settings(redis_url=server.url, key_prefix="rt", retention_s=2_400,
                        housekeeping_s=10)
    ctx = Context.create(settings, role="worker")
    rc = redis.Redis.from_url(server.url)
    k, retire = ctx.keys, Retirement(ctx)
    other = Retirement(ctx)  # another resolve worker's: the rounds alternate between the two
    rounds = round(retire.pass_s / settings.housekeeping_s)
    assert rounds == 10

    def one_round(by: Retirement) -> int:
        rc.delete(k.housekeeping_lock)  # as if the round's lock had run out: rounds on demand
        by.next_at = 0.0
        return by.step()

    try:
        rc.config_resetstat()
        assert one_round(retire) == 0  # nothing stored: the size of the round's hashes, no scan
        calls = command_calls(rc)
        assert calls.get("hlen") == math.ceil(k.partitions / rounds) and "hscan" not in calls

        pipe = rc.pipeline(transaction=False)
        for i in range(LIVE):
            s = f"live-{i}"
            pipe.hset(k.actions(s), "pending-action:t:1", "{}")
            pipe.hset(k.sessions(k.partition(s)), s, "default")
        # finished: only a history left (it is set to expire), or nothing at all (it goes),
        # and the same for a session of a tenant with an index
        for s in ("old-1", "old-2"):
            pipe.xadd(k.history(s), {"event": "staged"})
            pipe.hset(k.sessions(k.partition(s)), s, "default")
        pipe.hset(k.sessions(k.partition("gone-1")), "gone-1", "default")
        for s in ("gone-2", "live-acme"):
            pipe.hset(k.sessions(k.partition(s)), s, "acme")
            pipe.sadd(k.tenant_index(k.partition(s), "acme"), s)
        pipe.hset(k.actions("live-acme"), "pending-action:t:1", "{}")
        pipe.execute()
        rc.delete(k.housekeeping)  # where the pass stood is lost: it starts again
        rc.hset(k.housekeeping, k.sessions(5), "garbled")  # read as "from the start"

        rc.config_resetstat()
        dropped = one_round(retire)
        first = command_calls(rc).get("exists", 0)  # retire.lua: one EXISTS per session looked at
        # about a tenth (HSCAN's COUNT is a hint), where every session was looked at before
        assert LIVE / (2 * rounds) <= first <= 3 * LIVE / rounds, first

        everything = {k.sessions(p) for p in range(k.partitions)}
        seen, done = first, set()  # the hashes whose pass has ended
        for n in range(2, 4 * rounds):  # n: the rounds a pass took
            rc.config_resetstat()
            dropped += one_round(other if n % 2 else retire)
            seen += command_calls(rc).get("exists", 0)
            done |= {key for key, (cursor, size) in retire.load()[1].items()
                     if cursor == 0 and size > 0}
            if done == everything:
                break
        assert rounds // 2 <= n <= rounds + 1, n  # a whole pass took about the rounds planned
        assert seen >= LIVE  # and looked at every session

        assert dropped == 2  # gone-1, and gone-2 from its hash and its tenant's index
        assert not rc.hexists(k.sessions(k.partition("gone-1")), "gone-1")
        assert not rc.hexists(k.sessions(k.partition("gone-2")), "gone-2")
        assert not rc.sismember(k.tenant_index(k.partition("gone-2"), "acme"), "gone-2")
        assert rc.sismember(k.tenant_index(k.partition("live-acme"), "acme"), "live-acme")
        assert all(rc.pttl(k.history(s)) > 0 for s in ("old-1", "old-2"))
        assert all(rc.hexists(k.sessions(k.partition(s)), s) for s in ("old-1", "live-7"))

        # an operator's doing: the shared record is a string. The worker carries its own pass
        # on, says so once, and leaves the key as it is
        rc.set(k.housekeeping, "mine")
        with caplog.at_level(logging.WARNING, logger="pending_actions.resolver"):
            turns = []
            for _ in range(3):
                one_round(retire)
                turns.append(retire.own[0])
        assert len(set(turns)) == 3 and rc.get(k.housekeeping) == b"mine"
        assert len([r for r in caplog.records if "is not a hash" in r.getMessage()]) == 1
    finally:
        ctx.client.close()
        rc.close()


def test_the_record_drops_what_older_versions_paged(server: EmbeddedRedis) -> None:
    """Older versions paged the tenants' sessions sets too: their entries leave the record,
    and the sets themselves are left as they are (read by nothing)."""
    # a pass of one round: every hash is paged whole each round
    settings = Settings(redis_url=server.url, key_prefix="rs", retention_s=24, housekeeping_s=10)
    ctx = Context.create(settings, role="worker")
    rc = redis.Redis.from_url(server.url)
    k, retire = ctx.keys, Retirement(ctx)
    legacy = k.legacy_tenant_sessions("gone-co")

    def one_round() -> int:
        rc.delete(k.housekeeping_lock)
        retire.next_at = 0.0
        return retire.step()

    try:
        rc.sadd(legacy, "done-1")
        rc.hset(k.housekeeping, legacy, "0 1")
        assert one_round() == 0
        assert not rc.hexists(k.housekeeping, legacy)
        assert rc.hexists(k.housekeeping, k.sessions(0))
        assert legacy not in retire.own[1]
        assert rc.smembers(legacy) == {b"done-1"}
    finally:
        ctx.client.close()
        rc.close()
