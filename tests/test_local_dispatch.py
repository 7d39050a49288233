"""LOCAL_DISPATCH (workers/local.py): a dramatiq process serves resolve requests itself, and a
take that finds one of its threads free claims the attempt for that thread in the same atomic
step, enqueuing no task. What must still hold: every attempt fenced by its lease, nothing lost
when that process dies between the take and the handler, nothing run by a process that lacks
the handler."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

from pending_actions.broker.routing import read_live
from tests.support.faults import K, cluster, events, wait_for
from tests.support.procs import Worker
from tests.support.replies import tail_id
from tests.support.runs import runs

LOCAL = {"local_dispatch": "true"}


def tasks_enqueued(rc: redis.Redis) -> int:
    """Entries ever added to the task streams of every pool and partition."""
    return sum(int(rc.xinfo_stream(key)["entries-added"]) for key in rc.scan_iter("pa:*:dq:*")
               if rc.type(key) == b"stream")


def test_an_idle_resolve_is_claimed_by_its_take(tmp_path: Path) -> None:
    """The take claims for the serving process: no task in any stream, the lease was written
    running by take.lua, the handler ran once, in the process that served the request."""
    with cluster(tmp_path, local_dispatch="true") as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        ids = [pa.stage(session=f"s{i}", tool="edit", label="L", apply="t.ok")
               for i in range(5)]
        for i, action_id in enumerate(ids):
            result = pa.resolve(session=f"s{i}", action="apply", reason="r")
            assert not result.is_error, result.text
            assert [(r["id"], r["attempt"]) for r in runs(rc, f"s{i}")] == [(action_id, 1)]
            assert runs(rc, f"s{i}")[0]["pid"] in workers[0].dramatiq_pids
            assert events(rc, f"s{i}") == ["staged", "taken", "applied"]
        assert tasks_enqueued(rc) == 0
        consumers = rc.xinfo_consumers(K.requests(K.partition("s0")), "resolvers")
        assert [c["name"].decode().endswith(":serve:resolve-0") for c in consumers] == [True]


def test_a_failed_apply_claimed_by_its_take_stays_pending_and_is_retried(
        tmp_path: Path) -> None:
    """The re-add after a failure is the same on this path: same id, attempts counted, the
    next resolve a new attempt of its own."""
    with cluster(tmp_path, local_dispatch="true") as (server, _workers, pa):
        rc = redis.Redis.from_url(server.url)
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.flaky",
                             payload={"fail_times": 1})
        failed = pa.resolve(session="s", action="apply", reason="r")
        assert failed.is_error and failed.text == "flaky failure on attempt 1", failed.text
        [again] = pa.pending("s")
        assert (again.id, again.attempts, again.state) == (action_id, 1, "pending")
        done = pa.resolve(session="s", action="apply", reason="r")
        assert not done.is_error, done.text
        assert [r["attempt"] for r in runs(rc, "s")] == [1, 2]
        assert tasks_enqueued(rc) == 0


def test_killed_between_its_take_and_the_handler_the_action_comes_back(tmp_path: Path) -> None:
    """The process is SIGKILLed after its take claimed the attempt, before a thread ran it:
    the running lease runs out and recovery returns the action (a stall counted, as for a
    worker that died mid-handler); nothing ran, and the next resolve applies it once."""
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        doomed = Worker(server.url, overrides={"failpoint": "after-local-take",
                                               "lease_ms": "1000", **LOCAL}).start()
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        mark = tail_id(rc, K.workers)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
            wait_for(rc, K.workers, lambda f: f.get(b"event") == b"after-local-take", mark)
            [lease] = rc.hvals(K.inflight("s"))
            assert b'"state":"running"' in lease and b'"claimant":"' in lease
            doomed.kill()
            workers.append(Worker(server.url, overrides={"recovery_interval_ms": "100",
                                                         **LOCAL}).start())
            result = waiting.result(timeout=30)
        assert result.is_error and "interrupted" in result.text, result.text
        [back] = pa.pending("s")
        assert (back.id, back.state, back.attempts) == (action_id, "pending", 1)
        assert runs(rc, "s") == []  # no handler ran
        done = pa.resolve(session="s", action="apply", reason="again")
        assert not done.is_error, done.text
        assert [(r["id"], r["attempt"]) for r in runs(rc, "s")] == [(action_id, 2)]


def test_a_handler_this_process_lacks_goes_to_a_pool_that_has_it(tmp_path: Path) -> None:
    """Two fleets with disjoint handlers, both serving requests themselves: whichever reads a
    request, the attempt runs in the fleet that has its handler, once."""
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        for handlers in ("tests.support.mix_a", "tests.support.mix_b"):
            workers.append(Worker(server.url, handlers=handlers, overrides=LOCAL).start())
        assert len(read_live(rc, K).pools) == 2
        sessions = [f"m{i}" for i in range(12)]
        ids = [pa.stage(session=s, tool="edit", label="L", apply="mix.a" if i % 2 else "mix.b")
               for i, s in enumerate(sessions)]
        for s in sessions:
            result = pa.resolve(session=s, action="apply", reason="r")
            assert not result.is_error, result.text
        for i, (s, action_id) in enumerate(zip(sessions, ids, strict=True)):
            fleet = "a" if i % 2 else "b"
            assert rc.lrange(f"test:mix:{s}", 0, -1) == [f"{fleet}:{action_id}".encode()]
