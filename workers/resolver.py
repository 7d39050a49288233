"""The resolve worker: reads resolve requests from the partitions' request streams through a
consumer group (so many can run), and takes each target with take.lua, which also enqueues its
handler task to a pool of workers that has the handler. A second loop (``workers.recovery``)
recovers attempts whose lease expired."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Any

import orjson
import redis
from pydantic import ValidationError
from redis.exceptions import NoScriptError

from pending_actions.broker import failpoints, tracing
from pending_actions.broker.atomic.replies import Taken, TakeStatus
from pending_actions.broker.connection import is_cluster
from pending_actions.broker.context import Context
from pending_actions.broker.errors import RedisFull
from pending_actions.broker.events import WorkerEvent, announce
from pending_actions.broker.failures import poison_of, translate
from pending_actions.broker.keys import RESOLVER_GROUP
from pending_actions.broker.loops import PULSE_S, Beats, Fatal, Loop, process_name
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.results import (
    expired,
    not_the_target,
    nothing_to_target_json,
)
from pending_actions.broker.roundtrips import pipeline, read_group
from pending_actions.broker.routing import Live, LiveView
from pending_actions.workers.answers import answer_people, refuse_no_worker
from pending_actions.workers.poison import not_served, park_poison
from pending_actions.workers.recovery import Recovery
from pending_actions.workers.taskbroker import StreamsBroker
from pending_actions.workers.tasks import TaskMessage, encoded_task, pool_queue

log = logging.getLogger("pending_actions.resolver")

Entry = tuple[str, bytes, dict[bytes, bytes]]  # request stream, entry id, fields


class ResolveWorker:

    def __init__(self, ctx: Context, tasks: Any, name: str | None = None,
                 on_fatal: Fatal | None = None) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.name = name or self.new_name()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.on_fatal = on_fatal
        self.beats = Beats(ctx, self.name, "resolver")
        self.recovery = Recovery(ctx, self.name, self.stop)
        self.live = LiveView(ctx.client, ctx.keys)
        # on our streams broker in the same Redis, take.lua enqueues the task itself
        self.inline = isinstance(tasks, StreamsBroker) and tasks.client is ctx.client
        every = list(range(ctx.keys.partitions))
        # a blocking read's keys must share a slot on a cluster: a thread per partition there;
        # on one Redis each thread reads every partition's stream in one call
        self.groups = ([[p] for p in every] if is_cluster(ctx.client)
                       else [every] * ctx.settings.resolve_threads)

    @staticmethod
    def new_name() -> str:
        """A resolve worker's name (its consumer names and its beats start with it)."""
        return process_name()

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ResolveWorker:
        # one serve thread by default: each read takes up to 16 waiting requests and their
        # takes go in one pipeline, so under load one thread serves batches; more threads
        # (each its own consumer in the group) split the same load into smaller reads, which
        # costs every process more CPU per resolve (measured: docs/design.md)
        s = self.ctx.settings
        block_s = s.block_ms / 1000
        loops = [Loop(f"resolve-{i}", _Server(self, f"resolve-{i}", group).step, self.stop,
                      every_s=3 * block_s + 2, beats=self.beats, on_fatal=self.on_fatal)
                 for i, group in enumerate(self.groups)]
        interval = s.recovery_interval_ms / 1000
        loops.append(Loop("recover", self.recovery.step, self.stop, pause_s=interval,
                          every_s=3 * interval + 2, beats=self.beats, on_fatal=self.on_fatal))
        loops.append(Loop("pulse", lambda: self.beats.beat("pulse", PULSE_S * 3, force=True),
                          self.stop, pause_s=PULSE_S, every_s=PULSE_S * 3,
                          on_fatal=self.on_fatal))
        for loop in loops:
            thread = loop.thread()
            thread.start()
            self.threads.append(thread)
        return self

    def announce(self) -> None:
        """Say on the workers stream that this resolve worker is going round."""
        announce(self.ctx.client, self.ctx.keys, "resolver", WorkerEvent.READY, name=self.name)

    def shutdown(self, timeout: float = 10.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # --- requests --------------------------------------------------------------------------
    def _ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            try:
                self.ctx.client.xgroup_create(stream, RESOLVER_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def _read(self, consumer: str, streams: list[str]) -> list[Entry]:
        # on the serve thread's own connection, as its takes
        reply: Any = read_group(self.ctx.client, RESOLVER_GROUP, consumer, streams, 16,
                                self.ctx.settings.block_ms)
        return [(_text(s), e, f) for s, entries in reply or () for e, f in entries]

    def _claim(self, consumer: str, streams: list[str]) -> list[Entry]:
        """Requests read by a resolve worker that died before acking them."""
        out: list[Entry] = []
        for stream in streams:
            claimed: Any = self.ctx.client.xautoclaim(
                stream, RESOLVER_GROUP, consumer, self.ctx.settings.claim_idle_ms,
                start_id="0-0", count=64)
            out.extend((stream, e, f) for e, f in claimed[1] if f)
        return out

    @staticmethod
    def _queue_ack(pipe: Any, entries: list[tuple[str, bytes]]) -> None:
        by_stream: dict[str, list[bytes]] = {}
        for stream, entry_id in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            pipe.xack(stream, RESOLVER_GROUP, *ids)
            pipe.xdel(stream, *ids)

    def _dead(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], reason: str,
              ack: bool = True) -> None:
        log.warning("resolve request %s parked: %s", entry_id, reason)
        pipe = self.ctx.client.pipeline(transaction=False)
        pipe.xadd(self.ctx.keys.stream_dead(stream),
                  {b"entry": entry_id, b"reason": reason[:500],
                   b"data": orjson.dumps({k.decode(errors="replace"): v.decode(errors="replace")
                                          for k, v in fields.items()})},
                  maxlen=10_000, approximate=True)
        if ack:
            self._queue_ack(pipe, [(stream, entry_id)])
        pipe.execute()

    def handle(self, entries: list[Entry]) -> list[str]:
        """Dispatch a batch of requests; returns what became of each, for logs and tests.
        Malformed entries are parked and acked."""
        requests: list[tuple[tuple[str, bytes], ResolveRequest]] = []
        for stream, entry_id, fields in entries:
            try:
                requests.append(((stream, entry_id), ResolveRequest.from_fields(fields)))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "entry"
                self._dead(stream, entry_id, fields,
                           f"{where}: {first['msg']} ({exc.error_count()} errors)")
        if not requests:
            return []
        failpoints.hit("after-read", self.ctx.client, self.ctx.keys)
        ctx = self.ctx
        now_ms = ctx.clock.now_ms()  # Redis time, like the entry ids the timeouts count from
        live = [(e, r) for e, r in requests if now_ms <= r.expires_ms(e[1])]
        acks = [e for e, r in requests if now_ms > r.expires_ms(e[1])]  # the caller gave up
        outcomes = ["expired"] * len(acks)
        view = self.live.get()
        taken = self._take_all(live, view, now_ms)
        self._record_approvals(live, taken, view, now_ms)
        views = [view] * len(live)  # the view each take routed by (its pool numbers)
        refused = [i for i, t in enumerate(taken)
                   if isinstance(t, Taken) and t.status is TakeStatus.NO_WORKER]
        if refused:
            # our view of live workers may be a moment old: look again once before refusing
            fresh = self.live.get(fresh=True)
            if fresh != view:
                retaken = self._take_all([live[i] for i in refused], fresh, now_ms)
                for i, t in zip(refused, retaken, strict=True):
                    taken[i], views[i] = t, fresh
        for (entry, request), got, seen in zip(live, taken, views, strict=True):
            if isinstance(got, Exception):
                if self._failed_take(entry, request, got):
                    acks.append(entry)
                outcomes.append("refused")
                continue
            if got.status in (TakeStatus.COUNTED, TakeStatus.RETAKE):
                # undecided after every round (see _record_approvals): left pending, unacked
                log.warning("approval %s of %s contended; claimed again later", request.req,
                            request.session)
                outcomes.append("contended")
                continue
            if not self.inline and got.status is TakeStatus.OK:
                queue = pool_queue(ctx.settings.queue, seen.pools[got.pool - 1])
                self.tasks.enqueue(TaskMessage.for_lease(request, got.token).to_message(queue))
            if not self._acked_by_take(entry[0], request) or got.status in UNACKED or (
                    got.status is TakeStatus.APPROVED and not got.recorded):
                acks.append(entry)
            outcomes.append(_outcome(got))
        if acks:
            # after the takes, not beside them: a take Redis refused for memory leaves its
            # request pending, to be claimed again once memory is back; on another broker,
            # after the task was sent
            pipe = ctx.client.pipeline(transaction=False)
            self._queue_ack(pipe, acks)
            pipe.execute()
        # the answers take.lua left to us, after the acks: a caller told that nothing changed
        # finds its request gone too (a crash in between leaves it to time out, unchanged)
        answered = [(r, t) for (_e, r), t in zip(live, taken, strict=True) if isinstance(t, Taken)]
        refuse_no_worker(ctx, [(r, t) for r, t in answered if t.status is TakeStatus.NO_WORKER])
        answer_people(ctx, [(r, t) for r, t in answered if t.status in PEOPLE])
        return outcomes

    def _take_all(self, requests: list[tuple[tuple[str, bytes], ResolveRequest]], view: Live,
                  now_ms: int) -> list[Taken | Exception]:
        """Every take (each with its lease's index entry and, inline, its task) in one round
        trip; a take Redis refused is its error."""
        ctx = self.ctx
        key = None
        if is_cluster(ctx.client):
            # one partition's slot for all of them but a request written by hand to another
            # partition's stream: then straight to that slot's master
            slots = {ctx.keys.partition(request.session) for _, request in requests}
            key = ctx.keys.requests(slots.pop()) if len(slots) == 1 else None
        pipe = pipeline(ctx.client, own=True, key=key)  # called by a serve thread only
        calls = []
        traced = tracing.Takes([request for _e, request in requests])  # a span per take
        for i, ((stream, entry_id), request) in enumerate(requests):
            lease = uuid.uuid4()
            token = lease.hex
            marker_ttl = self._marker_ttl(request, entry_id, now_ms)
            none = nothing_to_target_json(request.action, request.reason, request.extra)
            # the message id is the token's uuid spelled with dashes, so that take.lua, which
            # puts an earlier token in its place for a redelivered request, leaves it alone
            message = (encoded_task(request, token, ctx.settings.queue, str(lease))
                       if self.inline else None)
            conflict = gone = b""
            if request.expect_id is not None:
                args = (request.action, request.reason, request.extra, request.expect_id)
                conflict, gone = not_the_target(*args).to_json(), expired(*args).to_json()
            calls.append(ctx.scripts.take(
                request.session, req=request.req, action=request.action, token=token,
                reason=request.reason, extra=orjson.dumps(request.extra),
                marker_ttl_s=marker_ttl, none_reply=none, live=view, message=message,
                expect_id=request.expect_id or "", by=request.by or "",
                conflict_reply=conflict, expired_reply=gone,
                entry=entry_id if self._acked_by_take(stream, request) else b"",
                trace=traced.trace(i), approver=request.approver or "",
                revision=request.revision, patched=request.patched or "",
                grant=request.grant or "", tenant=request.tenant or "",
                decided=request.decided))
        if not calls:
            return []
        # by digest: take.lua's body is several KB, which Redis would hash at every call
        queued = [call.on(pipe, by_digest=True) for call in calls]
        out: list[Taken | Exception] = []
        try:
            replies = pipe.execute(raise_on_error=False)
            for call, q in zip(calls, queued, strict=True):
                reply = replies[q.index]
                if isinstance(reply, NoScriptError):  # never ran: Redis lost its scripts
                    try:
                        out.append(call.run())  # loads it
                    except redis.RedisError as exc:
                        out.append(exc)
                else:
                    out.append(reply if isinstance(reply, Exception) else q.get(replies))
        finally:
            traced.done(out)
        return out

    def _marker_ttl(self, request: ResolveRequest, entry_id: bytes, now_ms: int) -> int:
        # the marker must outlive every redelivery of this request, which stops at its expiry
        expires = request.expires_ms(entry_id)
        return max(self.ctx.settings.reply_ttl_s, (expires - now_ms) // 1000 + 60)

    def _record_approvals(self, requests: list[tuple[tuple[str, bytes], ResolveRequest]],
                          taken: list[Taken | Exception], view: Live, now_ms: int) -> None:
        """Record each approval that a take counted and left unwritten (COUNTED: not the last
        one needed) with approve.lua, all in one round trip, in ``taken``'s place its answer:
        APPROVED, DUP, or RETAKE when its action changed since the take (another approval
        recorded first, say): taken again then, which decides on what is there now (it may be
        the last approval now, and apply). Each round records or applies one at least of the
        approvals that contend for an action, hence the bound; one still undecided after it
        stays pending, to be claimed again."""
        ctx = self.ctx
        for _round in range(APPROVAL_ROUNDS):
            counted = [i for i, t in enumerate(taken)
                       if isinstance(t, Taken) and t.status is TakeStatus.COUNTED]
            if not counted:
                return
            pipe = pipeline(ctx.client, own=True)  # called by a serve thread only
            queued = []
            for i in counted:
                (stream, entry_id), request = requests[i]
                got = taken[i]
                assert isinstance(got, Taken)
                queued.append(ctx.scripts.approve(
                    request.session, counted=got, req=request.req, action=request.action,
                    approver=request.approver or "", grant=request.grant or "",
                    patched=request.patched or "",
                    marker_ttl_s=self._marker_ttl(request, entry_id, now_ms),
                    entry=entry_id if self._acked_by_take(stream, request) else b"",
                    decided=request.decided).on(pipe))
            replies = pipe.execute(raise_on_error=False)
            for i, q in zip(counted, queued, strict=True):
                reply = replies[q.index]
                taken[i] = reply if isinstance(reply, Exception) else q.get(replies)
            again = [i for i in counted
                     if isinstance(t := taken[i], Taken) and t.status is TakeStatus.RETAKE]
            for i, t in zip(again, self._take_all([requests[i] for i in again], view, now_ms),
                            strict=True):
                taken[i] = t

    def _acked_by_take(self, stream: str, request: ResolveRequest) -> bool:
        """Whether take.lua acks this request in the same step as its take: when it enqueues
        the task itself, and the request came from its session's partition's stream (any
        other, written by hand, is acked here)."""
        keys = self.ctx.keys
        return self.inline and stream == keys.requests(keys.partition(request.session))

    def _failed_take(self, entry: tuple[str, bytes], request: ResolveRequest,
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
        self._dead(entry[0], entry[1], {ResolveRequest.FIELD: request.model_dump_json().encode()},
                   f"take failed: {exc}"[:500], ack=False)
        reply = not_served(request, f"this resolve could not be served: {exc}")
        with contextlib.suppress(redis.RedisError):
            key = self.ctx.keys.reply(request.session, request.req)
            pipe = self.ctx.client.pipeline(transaction=False)
            pipe.rpush(key, reply)
            pipe.expire(key, self.ctx.settings.reply_ttl_s)
            pipe.execute()
        return True


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# rounds of approve.lua and takes again for the approvals a take counted (_record_approvals)
APPROVAL_ROUNDS = 8
# what take.lua answers without acking the request: nothing changed
UNACKED = frozenset({TakeStatus.NO_WORKER, TakeStatus.NEEDS_APPROVAL, TakeStatus.REVISED,
                     TakeStatus.REDECIDE})
# what the resolve worker replies to itself, take.lua having decided about approvals
PEOPLE = frozenset({TakeStatus.NEEDS_APPROVAL, TakeStatus.REVISED, TakeStatus.APPROVED,
                    TakeStatus.REDECIDE})


def _outcome(taken: Taken) -> str:
    """What became of a request, for logs and tests: dispatched, none, dup or no-worker."""
    return "dispatched" if taken.status is TakeStatus.OK else taken.status.value


class _Server:
    """One serve loop's state: its partitions' request streams, its consumer name, whether the
    groups are known to exist, when to claim abandoned requests next."""

    def __init__(self, worker: ResolveWorker, thread: str, partitions: list[int]) -> None:
        self.w = worker
        self.streams = [worker.ctx.keys.requests(p) for p in partitions]
        self.consumer = f"{worker.name}:{thread}"
        self.announce = thread == "resolve-0"
        self.grouped = False
        self.next_claim = 0.0

    def step(self) -> None:
        w = self.w
        try:
            if not self.grouped:
                w._ensure_groups(self.streams)
                self.grouped = True
            if self.announce:
                w.announce()
                self.announce = False
            entries = []
            if time.monotonic() >= self.next_claim:
                # half the idle time: a stuck request waits at most 1.5x claim_idle
                self.next_claim = time.monotonic() + w.ctx.settings.claim_idle_ms / 2000
                entries = w._claim(self.consumer, self.streams)
            if not entries:
                entries = w._read(self.consumer, self.streams)
            if entries:
                w.handle(entries)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                raise
            # the stream or its group was deleted (or Redis came back empty; UNBLOCKED: while
            # we were blocked on it): recreate it
            log.warning("request group missing; recreating it")
            self.grouped = False
