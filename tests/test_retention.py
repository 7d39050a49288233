"""Retirement is paced by the retention: a pass over the stored sessions takes at most
``retention_s / Retirement.PASSES``, so an idle worker beside many live sessions looks at a few
of them now and then, not 200 per partition each round; a pass still reaches every session,
whatever their number, and what it finds finished it retires. The pace is the clock's: a round
looks at what the pass should have reached by the next one. Where each pass stands is kept in
Redis, so two workers taking rounds in turn carry one pass on. Driven by hand on a Redis of its
own (a pass's start moved back stands for the time between rounds), so the command counts are
this test's alone; and timed with a real worker and 20,000 sessions."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pending_actions.broker.context import Context
from pending_actions.broker.keys import Keys
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.workers.retention import Retirement, Walk
from tests.support.procs import Worker
from tests.support.replies import command_calls
from tests.support.waits import wait_until

LIVE = 16_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis(directory=tmp_path / "redis").start()
    yield s
    s.stop()


def later(rc: redis.Redis, k: Keys, seconds: float, by: Retirement | None = None) -> None:
    """As if ``seconds`` had passed: every pass began that much earlier (in the shared
    record, or in ``by``'s own when the record is not a hash)."""
    if by is not None:
        for walk in by.own.values():
            walk.began -= int(seconds * 1000)
        return
    raw: Any = rc.hgetall(k.housekeeping)
    walks = {f: Walk.decode(v) for f, v in raw.items()}
    for walk in walks.values():
        walk.began -= int(seconds * 1000)
    if walks:
        rc.hset(k.housekeeping, mapping={f: w.encode() for f, w in walks.items()})


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
        assert one_round(retire) == 0  # nothing stored: the size of each hash, no scan
        calls = command_calls(rc)
        assert calls.get("hlen") == k.partitions and "hscan" not in calls
        later(rc, k, settings.housekeeping_s)
        rc.config_resetstat()
        one_round(other)  # an empty hash's pass lasts its time too: not measured again
        assert "hlen" not in command_calls(rc) and "hscan" not in command_calls(rc)

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
        rc.delete(k.housekeeping)  # where the passes stood is lost: they start again
        rc.hset(k.housekeeping, k.sessions(5), "garbled")  # read as "from the start"
        rc.hset(k.housekeeping, "turn", "3")  # an older version's field: it goes

        rc.config_resetstat()
        dropped = one_round(retire)
        first = command_calls(rc).get("exists", 0)  # retire.lua: one EXISTS per session looked at
        # about a tenth (the pass as far as the next round), where every session was looked
        # at before
        assert LIVE / (2 * rounds) <= first <= 3 * LIVE / rounds, first
        assert not rc.hexists(k.housekeeping, "turn")

        everything = {k.sessions(p) for p in range(k.partitions)}
        seen, done = first, set()  # the hashes whose pass has ended
        for n in range(2, 4 * rounds):  # n: the rounds a pass took
            later(rc, k, settings.housekeeping_s)
            rc.config_resetstat()
            dropped += one_round(other if n % 2 else retire)
            seen += command_calls(rc).get("exists", 0)
            done |= {key for key, walk in retire.load()[0].items() if walk.done and walk.size}
            if done == everything:
                break
        # a whole pass took the rounds planned, at most
        assert rounds // 2 <= n <= rounds, (n, everything - done)
        assert seen >= LIVE  # and looked at every session

        assert dropped == 2  # gone-1, and gone-2 from its hash and its tenant's index
        assert not rc.hexists(k.sessions(k.partition("gone-1")), "gone-1")
        assert not rc.hexists(k.sessions(k.partition("gone-2")), "gone-2")
        assert not rc.sismember(k.tenant_index(k.partition("gone-2"), "acme"), "gone-2")
        assert rc.sismember(k.tenant_index(k.partition("live-acme"), "acme"), "live-acme")
        assert all(rc.pttl(k.history(s)) > 0 for s in ("old-1", "old-2"))
        assert all(rc.hexists(k.sessions(k.partition(s)), s) for s in ("old-1", "live-7"))

        # an operator's doing: the shared record is a string. The worker carries its own
        # passes on, says so once, and leaves the key as it is
        rc.set(k.housekeeping, "mine")
        with caplog.at_level(logging.WARNING, logger="pending_actions.resolver"):
            progress = []
            for _ in range(3):
                later(rc, k, 5 * settings.housekeeping_s, by=retire)
                one_round(retire)
                progress.append(sum(w.seen for w in retire.own.values()))
        assert progress[0] < progress[1] < progress[2], progress
        assert rc.get(k.housekeeping) == b"mine"
        assert len([r for r in caplog.records if "is not a hash" in r.getMessage()]) == 1
    finally:
        ctx.client.close()
        rc.close()


def test_a_pass_over_20000_sessions_keeps_its_time(server: EmbeddedRedis) -> None:
    """A real worker, 20,000 finished sessions (nothing left but their entry in the sessions
    hashes), RETENTION_S 96: a pass of 4 s. Every session is looked at, and so leaves its hash,
    within the pass (measured on Redis's clock from the pass's start, in the shared record),
    where pages of at most 200 sessions once made it take 28 s."""
    k = Keys()
    rc = redis.Redis.from_url(server.url)
    pipe = rc.pipeline(transaction=False)
    for i in range(20_000):
        pipe.hset(k.sessions(k.partition(f"done-{i}")), f"done-{i}", "default")
    pipe.execute()

    def left() -> int:
        pipe = rc.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.hlen(k.sessions(p))
        return sum(pipe.execute())

    worker = Worker(server.url, overrides={"retention_s": "96", "housekeeping_s": "0.5",
                                           "recovery_interval_ms": "100"}).start()
    try:
        wait_until(lambda: not left(), 60, lambda: f"every session looked at ({left()} left)")
        sec, usec = rc.time()
        ended = sec * 1000 + usec // 1000
    finally:
        worker.kill()
    record: Any = rc.hgetall(k.housekeeping)
    began = min(Walk.decode(v).began for v in record.values())
    took = (ended - began) / 1000
    print(f"a pass over 20,000 sessions took {took:.2f} s (its time: 4 s)")
    # its time, and a round of slack for a machine shared with other tests
    assert took <= 4 + 0.6 + 1, took
