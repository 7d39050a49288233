"""The resolve worker: reads resolve requests from the request stream through a consumer group
(so many can run), takes the target atomically with take.lua, and sends the handler run to
dramatiq. A second loop (``workers.recovery``) recovers attempts whose lease expired."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import dramatiq
import orjson
import redis
from pydantic import ValidationError

from pending_actions.broker import failpoints
from pending_actions.broker.backoff import Backoff
from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.context import Context
from pending_actions.broker.events import WorkerEvent
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.replies import Taken, TakeStatus
from pending_actions.broker.results import expired, not_the_target, nothing_to_target
from pending_actions.broker.scripts import Queued
from pending_actions.broker.taskbroker import StreamsBroker
from pending_actions.broker.tasks import TaskMessage
from pending_actions.workers.recovery import Recovery

log = logging.getLogger("pending_actions.resolver")


class ResolveWorker:

    def __init__(self, ctx: Context, tasks: Any, name: str | None = None) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.recovery = Recovery(ctx, self.name, self.stop)
        if hasattr(tasks, "declare_queue"):
            tasks.declare_queue(ctx.settings.queue)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ResolveWorker:
        # several serve threads, each its own consumer in the group: a request's round trips
        # are sequential, so one thread would cap throughput at 1 / (round trips x latency)
        targets = [(self.serve, f"resolve-{i}") for i in range(self.ctx.settings.resolve_threads)]
        for target, name in [*targets, (self.recovery.run, "recover")]:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # --- requests --------------------------------------------------------------------------
    def _ensure_group(self) -> None:
        try:
            self.ctx.client.xgroup_create(self.ctx.keys.requests, Keys.RESOLVER_GROUP, id="0",
                                          mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def serve(self) -> None:
        consumer = f"{self.name}:{threading.current_thread().name}"
        retry = Backoff()
        announced = threading.current_thread().name != "resolve-0"
        next_claim = 0.0
        while not self.stop.is_set():
            try:
                self._ensure_group()
                if not announced:
                    self.ctx.client.xadd(self.ctx.keys.workers,
                                         {"role": "resolver", "event": WorkerEvent.READY,
                                          "pid": os.getpid(), "name": self.name},
                                         maxlen=1000, approximate=True)
                    announced = True
                while not self.stop.is_set():
                    entries = []
                    if time.monotonic() >= next_claim:
                        # half the idle time: a stuck request waits at most 1.5x claim_idle
                        next_claim = time.monotonic() + self.ctx.settings.claim_idle_ms / 2000
                        entries = self._claim(consumer)
                    if not entries:
                        entries = self._read(consumer)
                    if entries:
                        self.handle(entries)
                    retry.reset()
            except TRANSIENT as exc:
                retry.wait(self.stop, exc, "Redis unavailable")
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):  # Redis came back empty: recreate the group
                    raise
                log.warning("request group missing; recreating it")

    def _read(self, consumer: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        reply: Any = self.ctx.client.xreadgroup(
            Keys.RESOLVER_GROUP, consumer, {self.ctx.keys.requests: ">"}, count=16,
            block=self.ctx.settings.block_ms,
        )
        return [e for _s, entries in reply or () for e in entries]

    def _claim(self, consumer: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """Requests read by a resolve worker that died before acking them."""
        claimed: Any = self.ctx.client.xautoclaim(
            self.ctx.keys.requests, Keys.RESOLVER_GROUP, consumer,
            self.ctx.settings.claim_idle_ms, start_id="0-0", count=64,
        )
        return [(e, f) for e, f in claimed[1] if f]

    def _queue_ack(self, pipe: Any, entry_ids: list[bytes]) -> None:
        if entry_ids:
            pipe.xack(self.ctx.keys.requests, Keys.RESOLVER_GROUP, *entry_ids)
            pipe.xdel(self.ctx.keys.requests, *entry_ids)

    def _dead(self, entry_id: bytes, fields: dict[bytes, bytes], reason: str) -> None:
        log.warning("malformed resolve request %s: %s", entry_id, reason)
        pipe = self.ctx.client.pipeline(transaction=True)
        pipe.xadd(self.ctx.keys.requests_dead,
                  {b"entry": entry_id, b"reason": reason[:500],
                   b"data": orjson.dumps({k.decode(errors="replace"): v.decode(errors="replace")
                                          for k, v in fields.items()})},
                  maxlen=10_000, approximate=True)
        pipe.xack(self.ctx.keys.requests, Keys.RESOLVER_GROUP, entry_id)
        pipe.xdel(self.ctx.keys.requests, entry_id)
        pipe.execute()

    def handle(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[str]:
        """Dispatch a batch of requests; returns what became of each, for logs and tests.
        Malformed entries are parked and acked."""
        requests: list[tuple[bytes, ResolveRequest]] = []
        for entry_id, fields in entries:
            try:
                requests.append((entry_id, ResolveRequest.from_fields(fields)))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "entry"
                self._dead(entry_id, fields,
                           f"{where}: {first['msg']} ({exc.error_count()} errors)")
        if not requests:
            return []
        failpoints.hit("after-read", self.ctx.client, self.ctx.keys)
        if isinstance(self.tasks, StreamsBroker) and self.tasks.client is self.ctx.client:
            return self._dispatch_at_once(requests)
        return self._dispatch_in_turn(requests)

    def _take(self, pipe: Any, request: ResolveRequest,
              now_ms: float) -> tuple[str, Queued[Taken]]:
        """Queue take.lua and, after it, the index entry of the lease it would make: sent
        together, the index cannot miss a lease even if this process dies right after. An
        entry for a lease that was not made is removed afterwards (or, should we die first,
        by recovery, which finds no such lease). Returns the token and take's reply."""
        ctx, token = self.ctx, uuid.uuid4().hex
        # the marker must outlive every redelivery of this request, which stops at its deadline
        marker_ttl = max(ctx.settings.reply_ttl_s, int(request.deadline_ms / 1000 - now_ms / 1000)
                         + 60)
        none = nothing_to_target(request.action, request.reason, request.extra).to_json()
        conflict = gone = b""
        if request.expect_id is not None:
            args = (request.action, request.reason, request.extra, request.expect_id)
            conflict, gone = not_the_target(*args).to_json(), expired(*args).to_json()
        taken = ctx.scripts.take(request.session, request.req, request.action, token,
                                 request.reason, orjson.dumps(request.extra), marker_ttl,
                                 none, request.expect_id or "", request.by or "",
                                 conflict, gone).on(pipe)
        pipe.zadd(ctx.keys.leases, {ctx.keys.lease_member(request.session, token):
                                    now_ms + ctx.settings.dispatch_timeout_ms})
        return token, taken

    def _dispatch_at_once(self, requests: list[tuple[bytes, ResolveRequest]]) -> list[str]:
        """On our streams broker, in the same Redis: every take, its index entry, its task
        message (with the token it will hold if take makes a lease), and the request acks
        all go in one round trip. Requests that found nothing got their reply from take.lua
        itself; their task is fenced off as stale by begin.lua, and a request taken before
        (a redelivery) gets a second task carrying the token of its earlier lease."""
        ctx, now_ms = self.ctx, time.time() * 1000
        live = [(e, r) for e, r in requests if now_ms <= r.deadline_ms]  # else the caller gave up
        pipe = ctx.client.pipeline(transaction=False)
        sent: list[tuple[ResolveRequest, str, Queued[Taken], dramatiq.Message[Any]]] = []
        for _e, request in live:
            token, taken = self._take(pipe, request, now_ms)
            message = self._task(request, token)
            self.tasks.enqueue_on(pipe, message)
            sent.append((request, token, taken, message))
        self._queue_ack(pipe, [e for e, _r in requests])
        replies = pipe.execute()
        for *_rest, message in sent:
            self.tasks.emit_after("enqueue", message, None)
        outcomes = ["expired"] * (len(requests) - len(live))
        strays: list[str] = []
        again: list[dramatiq.Message[Any]] = []
        for request, token, taken, _m in sent:
            got = taken.get(replies)
            if got.token != token:
                strays.append(ctx.keys.lease_member(request.session, token))
                if got.token:
                    again.append(self._task(request, got.token))
            outcomes.append(_outcome(got))
        if strays or again:
            pipe = ctx.client.pipeline(transaction=False)
            for message in again:
                self.tasks.enqueue_on(pipe, message)
            if strays:
                pipe.zrem(ctx.keys.leases, *strays)
            pipe.execute()
            for message in again:
                self.tasks.emit_after("enqueue", message, None)
        return outcomes

    def _dispatch_in_turn(self, requests: list[tuple[bytes, ResolveRequest]]) -> list[str]:
        """Any other broker: take, then send the tasks, then ack; a crash in between only
        means redelivery, which take.lua answers with the same lease."""
        ctx, now_ms = self.ctx, time.time() * 1000
        live = [r for _e, r in requests if now_ms <= r.deadline_ms]
        pipe = ctx.client.pipeline(transaction=False)
        takes = [self._take(pipe, request, now_ms) for request in live]
        replies = pipe.execute() if live else []
        outcomes = ["expired"] * (len(requests) - len(live))
        strays: list[str] = []
        for request, (token, taken) in zip(live, takes, strict=True):
            got = taken.get(replies)
            if got.token:
                self.tasks.enqueue(self._task(request, got.token))
            if got.token != token:
                strays.append(ctx.keys.lease_member(request.session, token))
            outcomes.append(_outcome(got))
        pipe = ctx.client.pipeline(transaction=False)
        if strays:
            pipe.zrem(ctx.keys.leases, *strays)
        self._queue_ack(pipe, [e for e, _r in requests])
        pipe.execute()
        return outcomes

    def _task(self, request: ResolveRequest, token: str) -> dramatiq.Message[Any]:
        return TaskMessage.for_lease(request, token).to_message(self.ctx.settings.queue)


def _outcome(taken: Taken) -> str:
    """What became of a request, for logs and tests: dispatched, none, conflict or dup."""
    return "dispatched" if taken.status is TakeStatus.OK else taken.status.value
