"""An idle worker claims an attempt on the dramatiq consumer thread that read its task
(workers/early.py): the claim is sent before the hand-off to a worker thread, and a claim of a
task that will not run here is handed back."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from dramatiq.broker import MessageProxy

from pending_actions.broker import texts
from pending_actions.broker.atomic.replies import BeginStatus
from pending_actions.broker.atomic.scripts import source
from pending_actions.broker.context import Context
from pending_actions.broker.routing import Live, heartbeat
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.workers.attempt import run_attempt
from pending_actions.workers.early import Claimed, EarlyClaims
from pending_actions.workers.renewer import Renewer
from pending_actions.workers.tasks import TaskMessage
from tests.support import handlers, skipping
from tests.support.faults import FAST, K, cluster
from tests.support.procs import Worker
from tests.support.runs import runs


def _addr(command: dict[str, Any]) -> str:
    return f"{command['client_address']}:{command['client_port']}"


def test_an_idle_worker_claims_before_a_worker_thread_starts_the_task(tmp_path: Path) -> None:
    """The claim is written by the consumer thread, on a connection of the early claims: not
    by the worker thread that runs the handler and then sends the outcome on its own."""
    with cluster(tmp_path) as (server, _workers, pa):
        rc = redis.Redis.from_url(server.url, socket_timeout=20)  # a missed step fails, not hangs
        begin = {hashlib.sha1(source("begin", flags).encode()).hexdigest()
                 for flags in (True, False)}
        finalize = {hashlib.sha1(source("finalize", flags).encode()).hexdigest()
                    for flags in (True, False)}
        pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        pa.resolve(session="s", action="discard", reason="warm")  # connections made
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        claims: list[str] = []
        with rc.monitor() as monitor:
            assert not pa.resolve(session="s", action="apply", reason="r").is_error
            while True:
                command = monitor.next_command()
                words = command["command"].split()
                if words[0] == "EVALSHA" and words[1] in begin:
                    claims.append(_addr(command))
                elif words[0] == "EVALSHA" and words[1] in finalize:
                    outcome = _addr(command)
                    break
        assert [(r["id"], r["attempt"]) for r in runs(rc, "s")] == [(action_id, 1)]
        assert len(claims) == 1 and claims[0] != outcome, (claims, outcome)


def test_a_claim_of_a_task_that_will_not_run_here_is_handed_back(tmp_path: Path) -> None:
    """A worker stopping with a claimed task still in memory hands the claim back: the lease
    is dispatched again (no stall), and the task's next delivery claims it."""
    with cluster(tmp_path, workers=0) as (server, _workers, pa):
        rc = redis.Redis.from_url(server.url)
        heartbeat(rc, K, "p", ["t.ok"], "by-hand", 60_000)
        pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        token = uuid.uuid4().hex
        got = pa.ctx.scripts.take(
            "s", req=uuid.uuid4().hex, action="apply", token=token, reason="r", extra=b"null",
            marker_ttl_s=60, none_reply=b"{}", live=Live(("p",), {"t.ok": [1]}),
            message=None).run()
        assert got.status == "ok"
        ctx = Context.create(Settings(redis_url=server.url), role="worker")
        ctx.scripts.load_all()  # as a worker does at start (the claim is sent by digest)
        early = EarlyClaims(ctx)
        task = TaskMessage(session="s", token=token, req="q", action="apply", reason="r")
        message = MessageProxy(task.to_message("q"))
        early.claim([message])
        answer = early.claimed[message.message_id].begun()  # written, not waited for
        assert answer is not None and answer.status is BeginStatus.OK
        lease: Any = pa.ctx.client.hget(K.inflight("s"), token)
        assert b'"running"' in lease
        early.release([message])
        assert early.take(message.message_id) is None
        lease = pa.ctx.client.hget(K.inflight("s"), token)
        assert b'"dispatched"' in lease and b"claimant" not in lease
        again = ctx.scripts.begin("s", token=token, claimant="next-delivery").run()
        assert again.status is BeginStatus.OK
        # a claim handed back is the claimant's own only: another's is left alone
        assert not ctx.scripts.unclaim("s", token=token, claimant="someone-else").run()
        assert b'"running"' in pa.ctx.client.hget(K.inflight("s"), token)  # type: ignore[operator]
        ctx.client.close()


def test_a_claim_whose_reply_was_lost_is_sent_again_by_its_claimant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer thread's claim landed but its answer did not come back: the worker thread
    claims again under the same claimant, is told OK, and runs the handler once."""
    with cluster(tmp_path, workers=0) as (server, _workers, pa):
        monkeypatch.setenv("PENDING_ACTIONS_REDIS_URL", server.url)
        handlers.client.cache_clear()
        rc = redis.Redis.from_url(server.url)
        heartbeat(rc, K, "p", ["t.ok"], "by-hand", 60_000)
        action_id = pa.stage(session="s", tool="edit", label="L", apply="t.ok")
        token = uuid.uuid4().hex
        assert pa.ctx.scripts.take(
            "s", req=uuid.uuid4().hex, action="apply", token=token, reason="r", extra=b"null",
            marker_ttl_s=60, none_reply=b"{}", live=Live(("p",), {"t.ok": [1]}),
            message=None).run().status == "ok"
        ctx = Context.create(Settings(redis_url=server.url), role="worker")
        assert ctx.scripts.begin("s", token=token, claimant="early").run().status is BeginStatus.OK
        # a claimant of its own would find the attempt claimed, and run nothing
        other = ctx.scripts.begin("s", token=token, claimant="other").run()
        assert other.status is BeginStatus.RUNNING
        lost = Claimed("s", token, "early", ctx.scripts.begin("s", token=token, claimant="early"))
        task = TaskMessage(session="s", token=token, req="q", action="apply", reason="r")
        renewer = Renewer(ctx)
        assert run_attempt(ctx, renewer, task, early=lost) == "applied"
        assert [(r["id"], r["attempt"]) for r in runs(rc, "s")] == [(action_id, 1)]
        ctx.client.close()
        handlers.client.cache_clear()


def test_a_claim_of_a_task_a_middleware_skipped_is_handed_back(tmp_path: Path) -> None:
    """A middleware skips the task after its claim was written (the actor never runs): the
    claim is handed back, so the action comes back as never started, with no stall counted
    against it, rather than as the work of a lost worker once the running lease runs out."""
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    worker = Worker(server.url, "tests.support.skipping",
                    overrides={**FAST, "dispatch_timeout_ms": "1500"})
    pa = PendingActions.from_url(server.url, resolve_timeout_s=30)
    try:
        worker.start()
        rc = redis.Redis.from_url(server.url, socket_timeout=20)
        begin = {hashlib.sha1(source("begin", flags).encode()).hexdigest()
                 for flags in (True, False)}
        action_id = pa.stage(session=skipping.SESSION, tool="edit", label="L", apply="t.ok")
        with rc.monitor() as monitor:
            result = pa.resolve(session=skipping.SESSION, action="apply", reason="r")
            # the consumer thread claimed it before the hand-off (the skip came after)
            deadline = time.monotonic() + 20  # heartbeats keep the feed moving meanwhile
            while time.monotonic() < deadline:
                words = monitor.next_command()["command"].split()
                if words[0] == "EVALSHA" and words[1] in begin:
                    break
            else:
                raise AssertionError("no claim was sent")
        assert result.is_error
        assert result.content[0]["text"] == texts.never_started("apply", 1, action_id)
        [pending] = pa.pending(skipping.SESSION)
        assert pending.id == action_id
        state = rc.hget(K.state(skipping.SESSION), action_id)
        assert state is not None and orjson.loads(state)["stalls"] == 0
        assert runs(rc, skipping.SESSION) == []
    finally:
        pa.close()
        worker.kill()
        server.kill()
