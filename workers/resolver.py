"""The resolve worker: reads resolve requests from the request stream through a consumer group
(so many can run), takes the target atomically with take.lua, and sends the handler run to
dramatiq. A second loop (``workers.recovery``) recovers attempts whose lease expired."""

from __future__ import annotations

import contextlib
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
from pending_actions.broker.context import Context
from pending_actions.broker.errors import RedisFull
from pending_actions.broker.events import WorkerEvent
from pending_actions.broker.failures import poison_of, translate
from pending_actions.broker.keys import Keys
from pending_actions.broker.loops import PULSE_S, Beats, Fatal, Loop
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.replies import Taken, TakeStatus
from pending_actions.broker.results import expired, not_the_target, nothing_to_target
from pending_actions.broker.scripts import Queued
from pending_actions.broker.taskbroker import StreamsBroker
from pending_actions.broker.tasks import TaskMessage
from pending_actions.workers.poison import not_served, park_poison
from pending_actions.workers.recovery import Recovery

log = logging.getLogger("pending_actions.resolver")


class ResolveWorker:

    def __init__(self, ctx: Context, tasks: Any, name: str | None = None,
                 on_fatal: Fatal | None = None) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.on_fatal = on_fatal
        self.beats = Beats(ctx, self.name, "resolver")
        self.recovery = Recovery(ctx, self.name, self.stop)
        if hasattr(tasks, "declare_queue"):
            tasks.declare_queue(ctx.settings.queue)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ResolveWorker:
        # several serve threads, each its own consumer in the group: a request's round trips
        # are sequential, so one thread would cap throughput at 1 / (round trips x latency)
        s = self.ctx.settings
        block_s = s.block_ms / 1000
        loops = [Loop(f"resolve-{i}", _Server(self, f"resolve-{i}").step, self.stop,
                      every_s=3 * block_s + 2, beats=self.beats, on_fatal=self.on_fatal)
                 for i in range(s.resolve_threads)]
        interval = s.recovery_interval_ms / 1000
        loops.append(Loop("recover", self.recovery.step, self.stop, pause_s=interval,
                          every_s=3 * interval + 2, beats=self.beats,
                          on_fatal=self.on_fatal))
        loops.append(Loop("pulse", lambda: self.beats.beat("pulse", PULSE_S * 3, force=True),
                          self.stop, pause_s=PULSE_S, every_s=PULSE_S * 3,
                          on_fatal=self.on_fatal))
        for loop in loops:
            thread = loop.thread()
            thread.start()
            self.threads.append(thread)
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # --- requests --------------------------------------------------------------------------
    def ensure_group(self) -> None:
        try:
            self.ctx.client.xgroup_create(self.ctx.keys.requests, Keys.RESOLVER_GROUP, id="0",
                                          mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

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

    def _dead(self, entry_id: bytes, fields: dict[bytes, bytes], reason: str,
              ack: bool = True) -> None:
        log.warning("resolve request %s parked: %s", entry_id, reason)
        pipe = self.ctx.client.pipeline(transaction=not ack)
        pipe.xadd(self.ctx.keys.requests_dead,
                  {b"entry": entry_id, b"reason": reason[:500],
                   b"data": orjson.dumps({k.decode(errors="replace"): v.decode(errors="replace")
                                          for k, v in fields.items()})},
                  maxlen=10_000, approximate=True)
        if ack:
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

    def _take(self, pipe: Any, entry_id: bytes, request: ResolveRequest,
              now_ms: int) -> tuple[str, Queued[Taken]]:
        """Queue the index entry of the lease take.lua would make, then take.lua: the entry
        goes first, so that no lease is ever without one, even if this process dies or Redis
        refuses writes (full) in between. An entry for a lease that was not made is removed
        afterwards (or, should we die first, by recovery, which finds no such lease). Returns
        the token and take's reply. ``now_ms`` is Redis time."""
        ctx, token = self.ctx, uuid.uuid4().hex
        # the marker must outlive every redelivery of this request, which stops at its expiry
        expires = request.expires_ms(entry_id)
        marker_ttl = max(ctx.settings.reply_ttl_s, (expires - now_ms) // 1000 + 60)
        none = nothing_to_target(request.action, request.reason, request.extra).to_json()
        conflict = gone = b""
        if request.expect_id is not None:
            args = (request.action, request.reason, request.extra, request.expect_id)
            conflict, gone = not_the_target(*args).to_json(), expired(*args).to_json()
        pipe.zadd(ctx.keys.leases, {ctx.keys.lease_member(request.session, token):
                                    now_ms + ctx.settings.dispatch_timeout_ms})
        taken = ctx.scripts.take(request.session, request.req, request.action, token,
                                 request.reason, orjson.dumps(request.extra), marker_ttl,
                                 none, request.expect_id or "", request.by or "",
                                 conflict, gone).on(pipe)
        return token, taken

    def _live(self, requests: list[tuple[bytes, ResolveRequest]],
              now_ms: int) -> list[tuple[bytes, ResolveRequest]]:
        """The requests whose caller still waits (both sides of the test are Redis time)."""
        return [(e, r) for e, r in requests if now_ms <= r.expires_ms(e)]

    def _failed_take(self, entry_id: bytes, request: ResolveRequest,
                     exc: Exception) -> bool:
        """A take that Redis refused. Returns whether the request may be acked: not when
        Redis is full (it stays pending and is claimed again once memory is back). A poison
        record in the way is parked and the caller told; any other refusal parks the request
        in the dead requests, its caller told too."""
        found = poison_of(exc)
        why = f"{found}; it was moved to the session's dead letters" if found else ""
        if found is not None and park_poison(self.ctx, request.session, found, request.req,
                                             not_served(request, why)):
            return True
        if found is None and isinstance(translate(exc), RedisFull):
            log.warning("Redis is full; request %s of %s waits", request.req, request.session)
            return False
        log.error("take for %s failed: %s", request.session, exc)
        self._dead(entry_id, {ResolveRequest.FIELD: request.model_dump_json().encode()},
                   f"take failed: {exc}"[:500], ack=False)
        reply = not_served(request, f"this resolve could not be served: {exc}")
        with contextlib.suppress(redis.RedisError):
            key = self.ctx.keys.reply(request.session, request.req)
            pipe = self.ctx.client.pipeline(transaction=False)
            pipe.rpush(key, reply)
            pipe.expire(key, self.ctx.settings.reply_ttl_s)
            pipe.execute()
        return True

    def _dispatch_at_once(self, requests: list[tuple[bytes, ResolveRequest]]) -> list[str]:
        """On our streams broker, in the same Redis: every take, its index entry and its
        task message (with the token it will hold if take makes a lease) go in one round
        trip; the acks follow once the takes are known to have gone through. Requests that
        found nothing got their reply from take.lua itself; their task is fenced off as stale
        by begin.lua, and a request taken before (a redelivery) gets a second task carrying
        the token of its earlier lease."""
        ctx, now_ms = self.ctx, self.ctx.clock.now_ms()
        live = self._live(requests, now_ms)
        acks = _gone(requests, live)  # their caller gave up
        pipe = ctx.client.pipeline(transaction=False)
        sent: list[tuple[bytes, ResolveRequest, str, Queued[Taken], int,
                         dramatiq.Message[Any]]] = []
        for entry_id, request in live:
            token, taken = self._take(pipe, entry_id, request, now_ms)
            message = self._task(request, token)
            self.tasks.enqueue_on(pipe, message)
            sent.append((entry_id, request, token, taken, len(pipe) - 1, message))
        replies = pipe.execute(raise_on_error=False) if live else []
        outcomes = ["expired"] * (len(requests) - len(live))
        strays: list[str] = []
        again: list[dramatiq.Message[Any]] = []
        reindex: dict[str, int] = {}
        for entry_id, request, token, taken, at, message in sent:
            member = ctx.keys.lease_member(request.session, token)
            got = replies[taken.index]
            if isinstance(got, Exception):
                strays.append(member)
                if self._failed_take(entry_id, request, got):
                    acks.append(entry_id)
                outcomes.append("refused")
                continue
            acks.append(entry_id)
            got = taken.decode(got)
            if isinstance(replies[taken.index - 1], Exception) and got.token == token:
                # the index entry was refused and the lease made (memory freed in between)
                reindex[member] = now_ms + ctx.settings.dispatch_timeout_ms
            if isinstance(replies[at], Exception) and got.token == token:
                again.append(message)  # its task was refused: send it again below
            else:
                self.tasks.emit_after("enqueue", message, None)
            if got.token != token:
                strays.append(member)
                if got.token:
                    again.append(self._task(request, got.token))
            outcomes.append(_outcome(got))
        self._follow_up(strays, again, acks, reindex)
        return outcomes

    def _follow_up(self, strays: list[str], again: list[dramatiq.Message[Any]],
                   acks: list[bytes], reindex: dict[str, int] | None = None) -> None:
        """Tasks to send again, index entries of leases not made, acks: one round trip, the
        acks last (a task refused again leaves its request unacked, to be claimed again)."""
        pipe = self.ctx.client.pipeline(transaction=False)
        for message in again:
            self.tasks.enqueue_on(pipe, message)
        if strays:
            pipe.zrem(self.ctx.keys.leases, *strays)
        if reindex:
            pipe.zadd(self.ctx.keys.leases, reindex)
        if len(pipe) == 0 and not acks:
            return
        pipe.execute()
        for message in again:
            self.tasks.emit_after("enqueue", message, None)
        if acks:
            pipe = self.ctx.client.pipeline(transaction=False)
            self._queue_ack(pipe, acks)
            pipe.execute()

    def _dispatch_in_turn(self, requests: list[tuple[bytes, ResolveRequest]]) -> list[str]:
        """Any other broker: take, then send the tasks, then ack; a crash in between only
        means redelivery, which take.lua answers with the same lease."""
        ctx, now_ms = self.ctx, self.ctx.clock.now_ms()
        live = self._live(requests, now_ms)
        acks = _gone(requests, live)
        pipe = ctx.client.pipeline(transaction=False)
        takes = [self._take(pipe, entry_id, request, now_ms) for entry_id, request in live]
        replies = pipe.execute(raise_on_error=False) if live else []
        outcomes = ["expired"] * (len(requests) - len(live))
        strays: list[str] = []
        for (entry_id, request), (token, taken) in zip(live, takes, strict=True):
            raw = replies[taken.index]
            if isinstance(raw, Exception):
                strays.append(ctx.keys.lease_member(request.session, token))
                if self._failed_take(entry_id, request, raw):
                    acks.append(entry_id)
                outcomes.append("refused")
                continue
            got = taken.decode(raw)
            if got.token:
                self.tasks.enqueue(self._task(request, got.token))
            if got.token != token:
                strays.append(ctx.keys.lease_member(request.session, token))
            acks.append(entry_id)
            outcomes.append(_outcome(got))
        self._follow_up(strays, [], acks)
        return outcomes

    def _task(self, request: ResolveRequest, token: str) -> dramatiq.Message[Any]:
        return TaskMessage.for_lease(request, token).to_message(self.ctx.settings.queue)


def _gone(requests: list[tuple[bytes, ResolveRequest]],
          live: list[tuple[bytes, ResolveRequest]]) -> list[bytes]:
    kept = {e for e, _r in live}
    return [e for e, _r in requests if e not in kept]


def _outcome(taken: Taken) -> str:
    """What became of a request, for logs and tests: dispatched, none, conflict or dup."""
    return "dispatched" if taken.status is TakeStatus.OK else taken.status.value


class _Server:
    """One serve loop's state: its consumer name, whether the group is known to exist, when
    to claim abandoned requests next."""

    def __init__(self, worker: ResolveWorker, thread: str) -> None:
        self.w = worker
        self.consumer = f"{worker.name}:{thread}"
        self.announce = thread == "resolve-0"
        self.grouped = False
        self.next_claim = 0.0

    def step(self) -> None:
        w = self.w
        try:
            if not self.grouped:
                w.ensure_group()
                self.grouped = True
            if self.announce:
                w.ctx.client.xadd(w.ctx.keys.workers,
                                  {"role": "resolver", "event": WorkerEvent.READY,
                                   "pid": os.getpid(), "name": w.name},
                                  maxlen=1000, approximate=True)
                self.announce = False
            entries = []
            if time.monotonic() >= self.next_claim:
                # half the idle time: a stuck request waits at most 1.5x claim_idle
                self.next_claim = time.monotonic() + w.ctx.settings.claim_idle_ms / 2000
                entries = w._claim(self.consumer)
            if not entries:
                entries = w._read(self.consumer)
            if entries:
                w.handle(entries)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                raise
            # the stream or its group was deleted (or Redis came back empty; UNBLOCKED: while
            # we were blocked on it): recreate it
            log.warning("request group missing; recreating it")
            self.grouped = False
