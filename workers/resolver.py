"""The resolve worker: reads resolve requests from the request stream through a consumer group
(so many can run), takes the target atomically with take.lua, and sends the handler run to
dramatiq. A second loop recovers attempts whose lease expired."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Any

import dramatiq
import orjson
import redis
from pydantic import ValidationError

from broker import failpoints
from broker.connection import TRANSIENT
from broker.context import ACTOR_NAME, Context
from broker.keys import Keys
from broker.models import Lease, ResolveRequest, Spec
from broker.results import base_details, nothing_to_target, text_result

log = logging.getLogger("pending_actions.resolver")

REQUEST_FIELD = b"r"
OUTCOMES = {1: "worker lost; pending again", 2: "worker lost; dead-lettered",
            3: "never started; pending again"}


class ResolveWorker:

    def __init__(self, ctx: Context, tasks: Any, name: str | None = None) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        if hasattr(tasks, "declare_queue"):
            tasks.declare_queue(ctx.settings.queue)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ResolveWorker:
        # several serve threads, each its own consumer in the group: a request's round trips
        # are sequential, so one thread would cap throughput at 1 / (round trips x latency)
        targets = [(self.serve, f"resolve-{i}") for i in range(self.ctx.settings.resolve_threads)]
        for target, name in [*targets, (self.recover_forever, "recover")]:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _backoff(self, attempt: int, exc: Exception) -> int:
        delay = min(0.05 * 2**attempt, 2.0)
        log.warning("Redis unavailable (%s); retrying in %.2fs", exc, delay)
        self.stop.wait(delay)
        return attempt + 1

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
        failures = 0
        announced = threading.current_thread().name != "resolve-0"
        next_claim = 0.0
        while not self.stop.is_set():
            try:
                self._ensure_group()
                if not announced:
                    self.ctx.client.xadd(self.ctx.keys.workers,
                                         {"role": "resolver", "event": "ready",
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
                    done = [e for e, fields in entries if self.handle(e, fields) != "malformed"]
                    # one ack for the batch (under load a read returns several requests; every
                    # write costs an fsync with appendfsync always). A crash before it only means
                    # redelivery, which take.lua answers with the same lease.
                    self._ack(done)
                    failures = 0
            except TRANSIENT as exc:
                failures = self._backoff(failures, exc)
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

    def _ack(self, entry_ids: list[bytes]) -> None:
        if not entry_ids:
            return
        pipe = self.ctx.client.pipeline(transaction=True)
        pipe.xack(self.ctx.keys.requests, Keys.RESOLVER_GROUP, *entry_ids)
        pipe.xdel(self.ctx.keys.requests, *entry_ids)
        pipe.execute()

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

    def handle(self, entry_id: bytes, fields: dict[bytes, bytes]) -> str:
        """Dispatch one request; the caller acks it (malformed ones are parked and acked
        here)."""
        try:
            request = ResolveRequest.model_validate_json(fields.get(REQUEST_FIELD, b""))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "entry"
            self._dead(entry_id, fields, f"{where}: {first['msg']} ({exc.error_count()} errors)")
            return "malformed"
        return self.dispatch(request)

    def dispatch(self, request: ResolveRequest) -> str:
        ctx, s = self.ctx, request.session
        if time.time() * 1000 > request.deadline_ms:
            return "expired"  # the caller gave up; acting now would surprise it
        token = uuid.uuid4().hex
        extra = orjson.dumps(request.extra)
        # the marker must outlive every redelivery of this request, which stops at its deadline
        marker_ttl = max(ctx.settings.reply_ttl_s,
                         int(request.deadline_ms / 1000 - time.time()) + 60)
        # One round trip: take, then point the lease index at the session. Sent together, the
        # index cannot miss the lease even if this process dies right after; and lease_touch
        # runs after take.lua, so a recovery pass racing with it cannot drop the pointer.
        pipe = ctx.client.pipeline(transaction=False)
        ctx.scripts.take(s, request.req, request.action, token, request.reason, extra,
                         marker_ttl, client=pipe)
        ctx.scripts.lease_touch(s, time.time() * 1000 + ctx.settings.dispatch_timeout_ms,
                                client=pipe)
        got = pipe.execute()[0]
        status = got[0].decode()
        if status == "dup":
            return "duplicate"
        if status == "none":
            result = nothing_to_target(request.action, request.reason, request.extra)
            pipe = ctx.client.pipeline(transaction=True)
            pipe.rpush(ctx.keys.reply(s, request.req), result.to_json())
            pipe.expire(ctx.keys.reply(s, request.req), ctx.settings.reply_ttl_s)
            pipe.execute()
            return "none"
        token = got[6].decode()  # an earlier token when this request was taken before
        failpoints.hit("after-take", ctx.client, ctx.keys)
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=ctx.settings.queue, actor_name=ACTOR_NAME, args=(),
            kwargs={"session": s, "token": token, "req": request.req,
                    "action": request.action, "reason": request.reason,
                    "extra": request.extra},
            options={},
        )
        self.tasks.enqueue(message)
        return "dispatched"

    # --- recovery --------------------------------------------------------------------------
    def recover_forever(self) -> None:
        failures = 0
        every = self.ctx.settings.sweep_interval_s
        next_sweep = time.monotonic() + random.uniform(5, 60)  # soon after start, spread out
        interval = self.ctx.settings.recovery_interval_ms / 1000
        while not self.stop.wait(interval):
            try:
                self.recover_due()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + every
                    # one sweep per interval for the whole deployment, whoever gets the lock
                    if self.ctx.client.set(self.ctx.keys.sweep_lock, self.name, nx=True,
                                           ex=max(1, int(every))):
                        self.sweep()
                failures = 0
            except TRANSIENT as exc:
                failures = self._backoff(failures, exc)

    def _now_ms(self) -> int:
        sec, usec = self.ctx.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def recover_due(self) -> int:
        now = self._now_ms()
        due: Any = self.ctx.client.zrangebyscore(self.ctx.keys.leases, "-inf", now, start=0,
                                                 num=100, withscores=True)
        return sum(self.recover_session(m.decode(), score, now) for m, score in due)

    def sweep(self) -> int:
        """Backstop for the lease index (which only a lost AOF tail could leave short): look
        at every session, 500 per round trip, and recover what has expired."""
        now, count, cursor = self._now_ms(), 0, 0
        while True:
            scanned: Any = self.ctx.client.sscan(self.ctx.keys.sessions, cursor, count=500)
            cursor, members = scanned
            sessions = [m.decode() for m in members]
            pipe = self.ctx.client.pipeline(transaction=False)
            for session in sessions:
                pipe.hlen(self.ctx.keys.inflight(session))
            for session, leased in zip(sessions, pipe.execute(), strict=True):
                if leased:
                    count += self.recover_session(session, None, now)
            if not cursor:
                return count

    def recover_session(self, session: str, score: float | None, now: int) -> int:
        ctx = self.ctx
        recovered, next_deadline = 0, 0
        leases: Any = ctx.client.hgetall(ctx.keys.inflight(session))
        for token, raw in leases.items():
            lease = Lease.model_validate_json(raw)
            if lease.deadline > now:
                next_deadline = min(next_deadline or lease.deadline, lease.deadline)
                continue
            replies = self._recovery_replies(session, lease)
            outcome = ctx.scripts.recover(session, token.decode(), lease.req, *replies)
            if outcome:
                recovered += 1
                log.warning("lease of %s attempt %d expired: %s", lease.id, lease.attempt,
                            OUTCOMES[outcome])
        if score is not None:
            ctx.scripts.lease_hint(session, score, next_deadline)
        return recovered

    def _recovery_replies(self, session: str, lease: Lease) -> tuple[bytes, bytes, bytes]:
        raw: Any = self.ctx.client.hget(self.ctx.keys.actions(session), lease.id)
        spec = Spec.model_validate_json(raw) if raw else None
        details = base_details(lease.action, lease.reason, lease.extra_value, spec)
        verb = "Apply" if lease.action == "apply" else "Discard"
        returned = text_result(
            f"{verb} interrupted: the worker running attempt {lease.attempt} of {lease.id} was "
            "lost. The action is pending again; retry or discard it.", details, is_error=True)
        dead = text_result(
            f"{verb} failed: {lease.id} was moved to the dead-letter list after its worker was "
            f"lost {self.ctx.settings.max_stalls} times.", details, is_error=True)
        unstarted = text_result(
            f"{verb} interrupted: no worker started attempt {lease.attempt} of {lease.id} in "
            "time. The action is pending again; retry or discard it.", details, is_error=True)
        return returned.to_json(), dead.to_json(), unstarted.to_json()
