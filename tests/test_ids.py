"""Ids are never handed out twice and a stage is never dropped silently (issue 29, item 7), on
a Redis of each test's own: the id counters deleted again and again while producers stage (the
issue saw 24,328 ids reused), both a counter and its copy lost (stages fail, clearly, until
``repair --ids``), a retry told from a collision, and a stage refused while Redis is full
writes nothing at all."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pending_actions.broker.atomic.replies import StageRefusal
from pending_actions.broker.atomic.scripts import ToStage
from pending_actions.broker.errors import Damaged, RedisFull
from pending_actions.broker.models import spec_json
from pending_actions.broker.routing import heartbeat
from pending_actions.procs import ROOT
from pending_actions.producers import AsyncPendingActions, PendingActions
from tests.support.faults import K, cluster
from tests.support.procs import worker_env
from tests.support.replies import byte_list, entries
from tests.support.unchanged import redis_unchanged

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

THREADS = 6


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args],
                          env=worker_env(url), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Any, redis.Redis]]:
    """A Redis of its own where handler t.ok is live (registered by hand, no worker: these
    tests only stage)."""
    with cluster(tmp_path, workers=0) as (srv, _w, _pa):
        rc = redis.Redis.from_url(srv.url)
        heartbeat(rc, K, "p", ["t.ok"], "by-hand", 600_000)
        yield srv, rc
        rc.close()


def staged_by(rc: redis.Redis, made: list[tuple[str, str, str]]) -> None:
    """Every id returned is distinct, stored under its own session with the spec its stage
    sent (its label), and staged once across the deployment (an id is the handler's
    idempotency key: no two actions share one)."""
    ids = Counter(action_id for action_id, _s, _l in made)
    assert [i for i, n in ids.items() if n > 1] == []
    pipe = rc.pipeline(transaction=False)
    for action_id, session, _label in made:
        pipe.hget(K.actions(session), action_id)
    for (action_id, session, label), raw in zip(made, pipe.execute(), strict=True):
        assert raw is not None, f"{action_id} returned but not stored in {session}"
        assert orjson.loads(raw)["label"] == label, (action_id, label, raw)
    sessions = {s for _i, s, _l in made}
    in_history = Counter(f[b"id"].decode() for s in sessions
                         for _e, f in entries(rc.xrange(K.history(s)))
                         if f[b"event"] == b"staged")
    assert [i for i, n in in_history.items() if n > 1] == []
    assert set(in_history) == set(ids)


def test_counters_deleted_under_load_never_hand_out_an_id_twice(
        server: tuple[Any, redis.Redis]) -> None:
    srv, rc = server
    stop = threading.Event()
    made: list[tuple[str, str, str]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def produce(t: int) -> None:
        pa = PendingActions.from_url(srv.url)  # a producer of its own: blocks of its own
        n = 0
        try:
            while not stop.is_set():
                sessions = [f"ld-{t}-{(n + i) % 12}" for i in range(5)]
                labels = [f"{t}-{n + i}" for i in range(5)]
                try:
                    if n % 2:
                        got = [pa.stage(session=sessions[0], tool="t", label=labels[0],
                                        apply="t.ok")]
                        done = list(zip(got, sessions[:1], labels[:1], strict=True))
                    else:
                        got = pa.stage_many({"session": s, "tool": "t", "label": lb,
                                             "apply": "t.ok"} for s, lb in zip(sessions, labels,
                                                                                strict=True))
                        done = list(zip(got, sessions, labels, strict=True))
                    with lock:
                        made.extend(done)
                except Exception as exc:
                    errors.append(repr(exc))
                n += 5
        finally:
            pa.close()

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    deleted = 0
    end = time.monotonic() + 4.0
    while time.monotonic() < end:
        deleted += int(rc.delete(*(K.seq(p) for p in range(K.partitions))))
        time.sleep(0.02)  # the fault's pace: a deletion every 20 ms, not a wait
    stop.set()
    for t in threads:
        t.join()
    assert errors == []  # the copy answers for a deleted counter: no stage fails
    assert deleted >= 50 and len(made) >= 500, (deleted, len(made))
    print(f"{len(made)} stages by {THREADS} producers, {deleted} counters deleted meanwhile")
    staged_by(rc, made)


def test_a_counter_and_its_copy_both_lost_fail_clearly_until_repaired(
        server: tuple[Any, redis.Redis]) -> None:
    srv, rc = server
    early = PendingActions.from_url(srv.url)  # holds blocks reserved before the loss
    late = PendingActions.from_url(srv.url)
    try:
        made = [(early.stage(session=f"lost-{i}", tool="t", label=f"e{i}", apply="t.ok"),
                 f"lost-{i}", f"e{i}") for i in range(40)]
        for p in range(K.partitions):
            rc.delete(K.seq(p), K.seq_mark(p))
        # nothing at all: the reservation hands out nothing
        with redis_unchanged(rc), pytest.raises(Damaged) as lost:
            late.stage(session="lost-0", tool="t", label="x", apply="t.ok")
        assert f"{K.seq(K.partition('lost-0'))} and its copy" in str(lost.value)
        assert "pending-actions repair --ids" in str(lost.value)
        # what was reserved before still goes out, never again
        made.append((early.stage(session="lost-0", tool="t", label="e-after", apply="t.ok"),
                     "lost-0", "e-after"))
        out = cli(srv.url, "--json", "repair", "--ids")
        assert out.returncode == 0, out.stderr
        rebuilt = {r["partition"]: r["counter"] for r in orjson.loads(out.stdout)}
        assert set(rebuilt) == {K.partition(s) for _i, s, _l in made}
        for p, value in rebuilt.items():
            assert int(rc.get(K.seq(p)) or 0) == int(rc.get(K.seq_mark(p)) or 0) == value
        made += [(late.stage(session=s, tool="t", label=f"l-{s}", apply="t.ok"), s, f"l-{s}")
                 for s in {s for _i, s, _l in made}]
        made += [(early.stage(session=f"lost-{i}", tool="t", label=f"e2-{i}", apply="t.ok"),
                  f"lost-{i}", f"e2-{i}") for i in range(40)]
        staged_by(rc, made)
        again = cli(srv.url, "repair", "--ids")
        assert again.returncode == 0 and again.stdout.strip() == "no id counter is lost"
    finally:
        early.close()
        late.close()


def test_a_busy_producer_reserves_ever_larger_blocks(server: tuple[Any, redis.Redis]) -> None:
    """A block used up soon after it was reserved is followed by one twice its size, up to
    ID_BLOCK_MAX: 400 stages into one partition take five reservations (16, 32, 64, 128 and
    256 ids), not 25. A producer whose blocks last longer than ID_BLOCK_GROW_S starts again
    at 16 each time. Every id is still handed out once."""
    srv, rc = server
    session = "busy"
    counter = K.seq(K.partition(session))
    made: list[tuple[str, str, str]] = []
    for grow_s, stages, reserved in ((10.0, 400, 16 + 32 + 64 + 128 + 256), (0.0, 40, 48)):
        pa = PendingActions.from_url(srv.url)
        pa.core.ID_BLOCK_GROW_S = grow_s  # 0: every block counts as one that lasted long
        before = int(rc.get(counter) or 0)
        try:
            for i in range(stages):
                label = f"{grow_s}-{i}"
                made.append((pa.stage(session=session, tool="t", label=label, apply="t.ok"),
                             session, label))
        finally:
            pa.close()
        assert int(rc.get(counter) or 0) - before == reserved, (grow_s, rc.get(counter))
    staged_by(rc, made)
    # ids stay ids of that partition, one counter value each
    seqs = sorted(int(i.rpartition(":")[2]) for i, _s, _l in made)
    assert {q % K.partitions for q in seqs} == {K.partition(session)}


def test_a_retry_is_told_from_a_collision(server: tuple[Any, redis.Redis]) -> None:
    """stage.lua sent twice with the same spec (a retry after a lost reply) stages once; the
    same id with another spec (a counter set back) is refused; neither writes anything, no
    second history or feed entry included."""
    srv, rc = server
    pa = PendingActions.from_url(srv.url)
    try:
        spec: dict[str, Any] = {"session": "retry", "tool": "t", "label": "L", "apply": "t.ok",
                                "reject": None, "payload": {}, "kind": "action",
                                "tenant": "default", "created_at": 1.0}
        first = pa.ctx.scripts.stage("retry", tenant="default", indexed=False, at="2.000",
                                     actions=[ToStage("pending-action:t:16", spec_json(spec),
                                                       None, "1.000")])
        assert first.run().depths == [1]
        with redis_unchanged(rc):
            assert first.run().depths == [0]
            other = pa.ctx.scripts.stage(
                "retry", tenant="default", indexed=False, at="3.000",
                actions=[ToStage("pending-action:t:32", spec_json({**spec, "label": "M"}), None,
                                 "1.000"),
                         ToStage("pending-action:t:16", spec_json({**spec, "label": "N"}), None,
                                 "1.000")]).run()
        assert (other.refused, other.collided) == (StageRefusal.COLLISION,
                                                   "pending-action:t:16")
        assert [f[b"id"] for _e, f in entries(rc.xrange(K.events(K.partition("retry"))))] == \
            [b"pending-action:t:16"]
    finally:
        pa.close()


def fill(rc: redis.Redis) -> None:
    """4 MB of junk, then maxmemory 2 MB below what is used: every write that may grow memory
    is refused."""
    for n in range(80):
        rc.set(f"junk:{n}", b"x" * 50_000)
    rc.config_set("maxmemory", int(rc.info("memory")["used_memory"]) - 2_000_000)


def test_a_stage_refused_while_redis_is_full_writes_nothing(
        server: tuple[Any, redis.Redis]) -> None:
    srv, rc = server
    PendingActions.from_url(srv.url).stage(session="full", tool="t", label="L", apply="t.ok")
    fill(rc)

    async def staged_async() -> str:
        async with AsyncPendingActions.from_url(srv.url) as apa:
            return await apa.stage(session="full", tool="t", label="L", apply="t.ok")

    with redis_unchanged(rc):  # no id block either: its reservation is refused too
        pa = PendingActions.from_url(srv.url)
        with pytest.raises(RedisFull):
            pa.stage(session="full", tool="t", label="L", apply="t.ok")
        pa.close()
        with pytest.raises(RedisFull):
            asyncio.run(staged_async())
        out = cli(srv.url, "stage", "--session", "full", "--tool", "t", "--label", "L",
                  "--apply", "t.ok")
    assert out.returncode == 1 and out.stderr.startswith("error: Redis") and \
        "is full" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    rc.delete(*(f"junk:{n}" for n in range(80)))
    assert len(byte_list(rc.zrange(K.stack("full"), 0, -1))) == 1
