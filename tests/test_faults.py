"""CONTRACT section 4 under real faults: SIGKILL, SIGSTOP, SIGTERM and Redis outages."""

from __future__ import annotations

import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from pending_actions.broker.connection import producer_client
from pending_actions.broker.routing import Live, heartbeat, read_live
from pending_actions.broker.texts import NOTHING_TO_APPLY
from pending_actions.producers import PendingActions
from tests.support.faults import (
    FAST,
    K,
    cluster,
    events,
    started_pid,
    wait_for,
    wait_history,
)
from tests.support.procs import Worker
from tests.support.replies import tail_id
from tests.support.runs import runs
from tests.support.waits import wait_until

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2

pool = ThreadPoolExecutor(max_workers=4)


def test_resolve_worker_killed_after_reading_a_request(tmp_path: Path) -> None:
    """Killed with a request read but not taken: the request is still pending in the group,
    and another resolve worker claims it once it has been idle for claim_idle_ms."""
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        doomed = Worker(server.url, overrides={"failpoint": "after-read"}).start()
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        mark = tail_id(rc, K.workers)
        waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
        wait_for(rc, K.workers, lambda f: f.get(b"event") == b"after-read", mark)
        assert rc.zcard(K.stack("s")) == 1  # nothing taken yet
        doomed.kill()
        workers.append(Worker(server.url, overrides=FAST).start())  # claim_idle_ms 3000
        result = waiting.result(timeout=30)
        assert not result.is_error, result.text
        assert [(r["id"], r["attempt"]) for r in runs(rc, "s")] == [(action_id, 1)]


def test_task_taken_but_never_started_goes_back(tmp_path: Path) -> None:
    """The whole worker is killed while its dramatiq process holds the task, before begin.lua:
    no handler ran, so when the dispatch timeout ends the action goes back without a stall and
    the resolver is told."""
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        doomed = Worker(server.url, overrides={"failpoint": "before-begin",
                                               "dispatch_timeout_ms": "1000"}).start()
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        mark = tail_id(rc, K.workers)
        waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
        wait_for(rc, K.workers, lambda f: f.get(b"event") == b"before-begin", mark)
        assert rc.hlen(K.inflight("s")) == 1 and rc.zcard(K.stack("s")) == 0  # popped
        doomed.kill()
        workers.append(Worker(server.url, overrides={"recovery_interval_ms": "100"}).start())
        result = waiting.result(timeout=30)
        assert result.is_error and "no worker started attempt 1" in result.text
        assert action_id in result.text
        [again] = pa.pending("s")
        assert (again.id, again.state, again.attempts) == (action_id, "pending", 1)
        assert again.last_error == "no worker started attempt 1"
        assert runs(rc, "s") == []  # the handler never ran
        done = pa.resolve(session="s", action="apply", reason="retry")
        assert not done.is_error
        assert [(r["id"], r["attempt"]) for r in runs(rc, "s")] == [(action_id, 2)]


def test_a_lease_is_indexed_by_its_own_script_and_recovered_after_redis_restarts(
        tmp_path: Path) -> None:
    """take.lua writes the lease and its index entry in one atomic step, so even a Redis that
    loses the tail of its data (a crash under everysec, a failover) never keeps a lease without
    its entry: no sweep is needed. Made here by running take.lua alone (no task, no worker),
    then a Redis restart; the lease is recovered as usual."""
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        heartbeat(rc, K, "p", ["t.ok"], "by-hand", 60_000)  # t.ok live, with no worker yet
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        short = PendingActions.from_url(server.url, dispatch_timeout_ms=300)
        token = uuid.uuid4().hex
        got = short.ctx.scripts.take(
            "s", req=uuid.uuid4().hex, action="apply", token=token, reason="r", extra=b"null",
            marker_ttl_s=60, none_reply=b"{}", live=Live(("p",), {"t.ok": [1]}),
            message=None).run()
        short.close()
        index = K.leases(K.partition("s"))
        assert got.status == "ok"
        assert rc.zscore(index, K.lease_member("s", token)) == got.deadline
        assert [a.state for a in pa.pending("s")] == ["in_flight"]
        server.kill()
        server.start()
        assert rc.zscore(index, K.lease_member("s", token)) == got.deadline  # from the AOF
        workers.append(Worker(server.url, overrides={"recovery_interval_ms": "100"}).start())
        wait_history(rc, "s", "recovered")
        assert rc.zcard(index) == 0
        [back] = pa.pending("s")
        assert (back.id, back.state, back.attempts) == (action_id, "pending", 1)


@pytest.mark.parametrize("on_cluster", [False, True], ids=["single", "cluster"])
def test_dramatiq_worker_killed_mid_handler(tmp_path: Path, on_cluster: bool) -> None:
    with cluster(tmp_path, on_cluster=on_cluster) as (server, _workers, pa):
        rc = producer_client(server.url)
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.gate",
                             payload={"gate": "gate:s"})
        waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
        os.kill(started_pid(rc, "s"), signal.SIGKILL)
        result = waiting.result(timeout=30)
        assert result.is_error and "interrupted" in result.text
        [again] = pa.pending("s")
        assert (again.id, again.attempts) == (action_id, 1)
        assert rc.hget(K.state("s"), action_id) is not None
        rc.rpush("gate:s", "open")  # let the next attempt through
        done = pa.resolve(session="s", action="apply", reason="retry")
        assert not done.is_error, done.text
        ran = runs(rc, "s")
        assert [(r["handler"], r["attempt"]) for r in ran] == \
            [("t.gate:start", 1), ("t.gate:start", 2), ("t.gate", 2)]
        assert {r["key"] for r in ran} == {action_id}  # same idempotency key on the retry
        assert events(rc, "s").count("applied") == 1


@pytest.mark.parametrize("on_cluster", [False, True], ids=["single", "cluster"])
def test_lease_expiring_under_a_running_handler_refuses_its_late_outcome(
        tmp_path: Path, on_cluster: bool) -> None:
    with cluster(tmp_path, on_cluster=on_cluster) as (server, _workers, pa):
        rc = producer_client(server.url)
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.gate",
                             payload={"gate": "gate:s"})
        waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
        pid = started_pid(rc, "s")
        os.kill(pid, signal.SIGSTOP)  # a hung worker: no renewals, no progress
        try:
            result = waiting.result(timeout=30)
            assert result.is_error and "interrupted" in result.text
            assert [a.id for a in pa.pending("s")] == [action_id]
            mark = tail_id(rc, K.history("s"))
            rc.rpush("gate:s", "open")
        finally:
            os.kill(pid, signal.SIGCONT)
        refused = wait_history(rc, "s", "late-refused", mark)
        assert refused[b"id"].decode() == action_id and refused[b"attempt"] == b"1"
        # the late finish changed nothing: still pending, no outcome recorded
        [still] = pa.pending("s")
        assert (still.id, still.state) == (action_id, "pending")
        assert "applied" not in events(rc, "s")
        rc.rpush("gate:s", "open")
        assert not pa.resolve(session="s", action="apply", reason="again").is_error
        assert events(rc, "s").count("applied") == 1
        assert pa.pending("s") == []


def test_handler_that_kills_its_worker_is_dead_lettered(tmp_path: Path) -> None:
    with cluster(tmp_path, max_stalls="3") as (server, _workers, pa):
        rc = redis.Redis.from_url(server.url)
        below = pa.stage(session="s", tool="edit", label="below", apply="t.ok")
        action_id = pa.stage(session="s", tool="deploy", label="poison", apply="t.crash")
        texts = [pa.resolve(session="s", action="apply", reason="r").text for _ in range(3)]
        assert all("interrupted" in t for t in texts[:2]), texts
        assert "dead-letter" in texts[2] and action_id in texts[2]
        assert [a.id for a in pa.pending("s")] == [below]
        [dead] = pa.dead_letters("s")
        assert dead["id"] == action_id and dead["stalls"] == 3 and "lost 3 times" in \
            dead["reason"]
        assert dead["spec"]["label"] == "poison"
        assert [r["attempt"] for r in runs(rc, "s")] == [1, 2, 3]
        assert "dead-lettered" in events(rc, "s")
        # the service carries on with the rest
        assert pa.resolve(session="s", action="apply", reason="r").details["label"] == "below"


def test_sigterm_lets_the_running_handler_finish(tmp_path: Path) -> None:
    with cluster(tmp_path) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        pa.stage(session="s", tool="edit", label="L", apply="t.gate", payload={"gate": "g"})
        waiting = pool.submit(pa.resolve, session="s", action="apply", reason="r")
        started_pid(rc, "s")
        [w] = workers
        w.terminate()
        rc.rpush("g", "open")
        result = waiting.result(timeout=30)
        assert not result.is_error, result.text
        assert w.wait(30) == 0
        assert pa.pending("s") == []


def test_workers_wait_for_redis_and_producers_fail_fast(tmp_path: Path) -> None:
    from pending_actions.broker.errors import RedisUnavailable
    from pending_actions.embedded import EmbeddedRedis, free_port
    from pending_actions.producers import PendingActions

    port = free_port()
    server = EmbeddedRedis(directory=tmp_path / "r", port=port)
    worker = Worker(server.url, overrides={"lease_ms": "1000"}).launch()
    pa = PendingActions.from_url(server.url)
    try:
        try:
            pa.stage(session="s", tool="edit", label="L", apply="t.ok")
            raise AssertionError("stage succeeded with Redis down")
        except RedisUnavailable as exc:
            assert "Redis is unavailable" in str(exc)
        server.start()
        worker.wait_ready()
        pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        assert not pa.resolve(session="s", action="apply", reason="r").is_error
        assert pa.resolve(session="s", action="apply", reason="r").text == NOTHING_TO_APPLY
    finally:
        worker.kill()
        server.kill()
        pa.close()


def test_sigterm_hands_back_prefetched_work(tmp_path: Path) -> None:
    """Tasks a stopping worker had fetched but not started go straight back to the queue, not
    after a claim timeout (set to a minute here, longer than this test may take)."""
    slow = {"claim_idle_ms": "60000", "dispatch_timeout_ms": "60000", "worker_threads": "1"}
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        a = Worker(server.url, overrides=slow).start()
        workers.append(a)
        pa.stage(session="s1", tool="edit", label="gated", apply="t.gate", payload={"gate": "g"})
        first = pool.submit(pa.resolve, session="s1", action="apply", reason="r")
        started_pid(rc, "s1")
        for s in ("s2", "s3"):
            pa.stage(session=s, tool="edit", label=s, apply="t.ok")
        rest = [pool.submit(pa.resolve, session=s, action="apply", reason="r", timeout=20)
                for s in ("s2", "s3")]
        [task_pool] = read_live(rc, K).pools
        queues = {K.task_queue(K.partition(s), task_pool) for s in ("s1", "s2", "s3")}
        # worker a runs one task and holds (prefetch 2) another it cannot start yet
        wait_until(lambda: sum(rc.xpending(q, "workers")["pending"] for q in queues) >= 2, 10,
                   "worker a fetching both tasks", interval_s=0.01)
        workers.append(Worker(server.url, overrides=slow).start())
        mark = tail_id(rc, K.workers)
        a.terminate()
        # open the gate only once dramatiq itself is stopping, so it cannot start the next task
        wait_for(rc, K.workers, lambda f: f[b"event"] == b"stopping", mark)
        rc.rpush("g", "open")
        assert not first.result(timeout=30).is_error
        for fut in rest:
            res = fut.result(timeout=30)
            assert not res.is_error, res.text
        assert a.wait(30) == 0
