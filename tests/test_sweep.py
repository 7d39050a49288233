"""Nothing in flight for good, nothing gone unseen (issue 29 items 8 and 9), with real worker
processes: a lease that lost its index entry is found by the slow sweep and recovered; a lease
that does not parse and has no entry is parked; an action whose spec was deleted is
dead-lettered with the reason, on the stack or in flight; unreadable counters park their action
(one outcome: dead-lettered, not also pending), whichever path meets them. Nothing is lost and
nothing is run twice."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from tests.support.faults import K, cluster, events
from tests.support.load import effects, gated, pool, wait_healthy
from tests.support.replies import byte_list
from tests.support.runs import runs
from tests.support.waits import wait_until

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2


def dead(rc: redis.Redis, session: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in byte_list(rc.lrange(K.dead(session), 0, -1))]


def until(what: str, done: Callable[[], object], within: float = 30.0) -> float:
    """Poll Redis until ``done()`` (a state other processes reach: no event announces it);
    how long it took."""
    started = time.monotonic()
    wait_until(lambda: bool(done()), within, what, interval_s=0.1)
    return time.monotonic() - started


def test_a_lease_whose_index_entry_was_deleted_is_found_and_recovered(tmp_path: Path) -> None:
    """SIGSTOP the process running a handler, delete its partition's lease index, SIGKILL the
    process: the action used to stay in flight for good (resolve: nothing to target, health
    0, stats "in flight 1, leases 0"). With leases of 3 s, as there, and a sweep pass of 3 s:
    the sweep gives the lease its entry back and recovery
    returns the action; it is then applied once."""
    with cluster(tmp_path, lease_ms="3000", sweep_s="3") as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        with gated(pa, rc, "lost"):
            pid = runs(rc, "lost")[-1]["pid"]
            os.kill(pid, signal.SIGSTOP)
            rc.delete(K.leases(K.partition("lost")))
            os.kill(pid, signal.SIGKILL)
            took = until("the action back from flight", lambda: not rc.hlen(K.inflight("lost")))
        assert took < 20  # a lease (3 s) and a sweep pass (3 s), with room for a busy machine
        assert [a.label for a in pa.pending("lost")] == ["gated"]
        assert "recovered" in events(rc, "lost")
        done = pa.resolve(session="lost", action="apply", reason="again", timeout=30)
        assert not done.is_error, done.text
        ran = [r["handler"] for r in runs(rc, "lost")]
        assert ran.count("t.gate") == 1 and ran.count("t.gate:start") == 2  # once, a new attempt
        assert pa.pending("lost") == [] and not rc.zcard(K.leases(K.partition("lost")))
        wait_healthy(server.url)


def test_a_lease_that_does_not_parse_and_has_no_index_entry_is_parked(tmp_path: Path) -> None:
    with cluster(tmp_path, lease_ms="3000", sweep_s="3") as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        kept = pa.stage(session="junk", tool="t", label="kept", apply="t.idem")
        rc.hset(K.inflight("junk"), "by-hand", b"[1, 2")  # no entry in the lease index
        until("the lease parked", lambda: rc.llen(K.dead("junk")))
        [parked] = dead(rc, "junk")
        assert parked["poison"] == "lease" and parked["raw"] == "[1, 2"
        assert not rc.hlen(K.inflight("junk"))
        assert [a.id for a in pa.pending("junk")] == [kept]  # untouched, served as usual
        assert not pa.resolve(session="junk", action="apply", reason="r").is_error
        assert effects(rc, "junk") == [kept]


def test_a_stacked_action_whose_spec_was_deleted_is_dead_lettered(tmp_path: Path) -> None:
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        below, middle, head = (pa.stage(session="hdel", tool="t", label=x, apply="t.idem")
                               for x in ("below", "middle", "head"))
        rc.hdel(K.actions("hdel"), middle)
        for _ in range(2):
            done = pa.resolve(session="hdel", action="apply", reason="r", timeout=20)
            assert not done.is_error, done.text
        assert effects(rc, "hdel") == [head, below]  # the one below it served, none twice
        [lost] = dead(rc, "hdel")
        assert (lost["id"], lost["reason"]) == (middle, "spec missing")
        entries = [e for e in pa.history("hdel") if e.get("id") == middle]
        assert [e["event"] for e in entries][-1] == "dead-lettered"
        assert pa.pending("hdel") == [] and not rc.zcard(K.stack("hdel"))


def test_an_action_in_flight_whose_spec_was_deleted_is_dead_lettered(tmp_path: Path) -> None:
    """Its worker lost mid-handler, recovery finds no spec to put back: dead-lettered, and
    the resolver told so, never "pending again"."""
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        gate = "gate:never"
        action_id = pa.stage(session="gone", tool="t", label="L", apply="t.gate",
                             payload={"gate": gate})
        waiting = pool.submit(pa.resolve, session="gone", action="apply", reason="r", timeout=30)
        until("the handler started", lambda: rc.llen("test:started:gone"))
        rc.hdel(K.actions("gone"), action_id)
        os.kill(runs(rc, "gone")[-1]["pid"], signal.SIGKILL)
        result = waiting.result(timeout=40)
        assert result.is_error and "spec" in result.text and "dead-letter" in result.text
        [lost] = dead(rc, "gone")
        assert (lost["id"], lost["reason"]) == (action_id, "spec missing")
        assert pa.pending("gone") == [] and not rc.hlen(K.inflight("gone"))


def test_unreadable_counters_park_their_action_in_flight_too(tmp_path: Path) -> None:
    """Counters that do not parse, met by recovery (their worker lost mid-handler): the
    action is parked with them (dead-lettered, raw), its lease ended and its resolver told;
    it is not pending as well, and never run again."""
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        below = pa.stage(session="counted", tool="t", label="below", apply="t.idem")
        gate = "gate:counted"
        action_id = pa.stage(session="counted", tool="t", label="gated", apply="t.gate",
                             payload={"gate": gate})
        waiting = pool.submit(pa.resolve, session="counted", action="apply", reason="r",
                              timeout=30)
        until("the handler started", lambda: rc.llen("test:started:counted"))
        rc.hset(K.state("counted"), action_id, b'{"attempts": "many"}')
        os.kill(runs(rc, "counted")[-1]["pid"], signal.SIGKILL)
        result = waiting.result(timeout=40)
        assert result.is_error and "dead letters" in result.text, result.text
        [parked] = dead(rc, "counted")
        assert (parked["id"], parked["poison"]) == (action_id, "state")
        assert parked["raw"] == '{"attempts": "many"}' and parked["spec"]["label"] == "gated"
        assert [a.id for a in pa.pending("counted")] == [below]
        assert not rc.hlen(K.inflight("counted")) and not rc.hexists(K.state("counted"),
                                                                      action_id)
        assert not pa.resolve(session="counted", action="apply", reason="r").is_error
        assert effects(rc, "counted") == [below]
        rc.rpush(gate, "open")
        assert [r["handler"] for r in runs(rc, "counted")].count("t.gate:start") == 1
