"""The resolve worker: reads resolve requests from the partitions' request streams through a
consumer group (so many can run), and takes each target with take.lua, which also enqueues its
handler task to a pool of workers that has the handler. A second loop (``workers.recovery``)
recovers attempts whose lease expired."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import orjson
import redis
from pydantic import ValidationError

from pending_actions.broker import failpoints, texts
from pending_actions.broker.backoff import Backoff
from pending_actions.broker.connection import TRANSIENT, is_cluster
from pending_actions.broker.context import Context
from pending_actions.broker.events import WorkerEvent
from pending_actions.broker.keys import RESOLVER_GROUP
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.pools import Live, LiveView
from pending_actions.broker.replies import Taken, TakeStatus
from pending_actions.broker.results import (
    base_details,
    expired,
    not_the_target,
    nothing_to_target,
    text_result,
)
from pending_actions.broker.taskbroker import StreamsBroker
from pending_actions.broker.tasks import TaskMessage, pool_queue
from pending_actions.workers.recovery import Recovery

log = logging.getLogger("pending_actions.resolver")

Entry = tuple[str, bytes, dict[bytes, bytes]]  # request stream, entry id, fields


class ResolveWorker:

    def __init__(self, ctx: Context, tasks: Any, name: str | None = None) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.recovery = Recovery(ctx, self.name, self.stop)
        self.live = LiveView(ctx.client, ctx.keys)
        # on our streams broker in the same Redis, take.lua enqueues the task itself
        self.inline = isinstance(tasks, StreamsBroker) and tasks.client is ctx.client
        every = list(range(ctx.keys.partitions))
        # a blocking read's keys must share a slot on a cluster: a thread per partition there;
        # on one Redis each thread reads every partition's stream in one call
        self.groups = ([[p] for p in every] if is_cluster(ctx.client)
                       else [every] * ctx.settings.resolve_threads)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ResolveWorker:
        # several serve threads, each its own consumer in the group: a request's round trips
        # are sequential, so one thread would cap throughput at 1 / (round trips x latency)
        for i, group in enumerate(self.groups):
            self._thread(lambda g=group: self.serve(g), f"resolve-{i}")
        self._thread(self.recovery.run, "recover")
        return self

    def _thread(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

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

    def serve(self, partitions: list[int] | None = None) -> None:
        streams = [self.ctx.keys.requests(p)
                   for p in (partitions if partitions is not None else self.groups[0])]
        consumer = f"{self.name}:{threading.current_thread().name}"
        retry = Backoff()
        announced = threading.current_thread().name != "resolve-0"
        next_claim = 0.0
        while not self.stop.is_set():
            try:
                self._ensure_groups(streams)
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
                        entries = self._claim(consumer, streams)
                    if not entries:
                        entries = self._read(consumer, streams)
                    if entries:
                        self.handle(entries)
                    retry.reset()
            except TRANSIENT as exc:
                retry.wait(self.stop, exc, "Redis unavailable")
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):  # Redis came back empty: recreate the group
                    raise
                log.warning("request group missing; recreating it")

    def _read(self, consumer: str, streams: list[str]) -> list[Entry]:
        reply: Any = self.ctx.client.xreadgroup(
            RESOLVER_GROUP, consumer, dict.fromkeys(streams, ">"), count=16,
            block=self.ctx.settings.block_ms,
        )
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

    def _dead(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes],
              reason: str) -> None:
        log.warning("malformed resolve request %s: %s", entry_id, reason)
        pipe = self.ctx.client.pipeline(transaction=False)
        pipe.xadd(f"{stream}:dead",
                  {b"entry": entry_id, b"reason": reason[:500],
                   b"data": orjson.dumps({k.decode(errors="replace"): v.decode(errors="replace")
                                          for k, v in fields.items()})},
                  maxlen=10_000, approximate=True)
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
        now_ms = time.time() * 1000
        live = [r for _e, r in requests if now_ms <= r.deadline_ms]  # else the caller gave up
        outcomes = ["expired"] * (len(requests) - len(live))
        view = self.live.get()
        # inline: every take (with its task) and the request acks, one round trip
        taken = self._take_all(live, view, now_ms, [e for e, _r in requests])
        refused = [(r, t) for r, t in zip(live, taken, strict=True)
                   if t.status is TakeStatus.NO_WORKER]
        if refused:
            # our view of live workers may be a moment old: look again once before refusing
            fresh = self.live.get(fresh=True)
            retaken = (self._take_all([r for r, _t in refused], fresh, now_ms, [])
                       if fresh != view else [t for _r, t in refused])
            again = dict(zip([r.req for r, _t in refused], retaken, strict=True))
            taken = [again.get(r.req, t) for r, t in zip(live, taken, strict=True)]
            self._refuse([(r, t) for r, t in zip(live, taken, strict=True)
                          if t.status is TakeStatus.NO_WORKER])
            view = fresh
        if not self.inline:
            for request, got in zip(live, taken, strict=True):
                if got.status is TakeStatus.OK:
                    queue = pool_queue(self.ctx.settings.queue, view.pools[got.pool - 1])
                    self.tasks.enqueue(TaskMessage.for_lease(request, got.token).to_message(queue))
            pipe = self.ctx.client.pipeline(transaction=False)
            self._queue_ack(pipe, [e for e, _r in requests])
            pipe.execute()
        return outcomes + [_outcome(t) for t in taken]

    def _take_all(self, requests: list[ResolveRequest], view: Live, now_ms: float,
                  acks: list[tuple[str, bytes]]) -> list[Taken]:
        ctx = self.ctx
        pipe = ctx.client.pipeline(transaction=False)
        queued = []
        for request in requests:
            token = uuid.uuid4().hex
            # the marker must outlive every redelivery of this request, which stops at its
            # deadline
            marker_ttl = max(ctx.settings.reply_ttl_s,
                             int(request.deadline_ms / 1000 - now_ms / 1000) + 60)
            none = nothing_to_target(request.action, request.reason, request.extra).to_json()
            message = (TaskMessage.for_lease(request, token).to_message(ctx.settings.queue)
                       .encode() if self.inline else None)
            conflict = gone = b""
            if request.expect_id is not None:
                args = (request.action, request.reason, request.extra, request.expect_id)
                conflict, gone = not_the_target(*args).to_json(), expired(*args).to_json()
            queued.append(ctx.scripts.take(
                request.session, request.req, request.action, token, request.reason,
                orjson.dumps(request.extra), marker_ttl, none, view, message,
                request.expect_id or "", request.by or "", conflict, gone).on(pipe))
        if self.inline:
            self._queue_ack(pipe, acks)
        if not len(pipe):
            return []
        replies = pipe.execute()
        return [q.get(replies) for q in queued]

    def _refuse(self, refused: list[tuple[ResolveRequest, Taken]]) -> None:
        """Tell each resolver at once that no live worker has its target's handler; nothing
        was taken, so the action stays where it was (not re-dispatched in a loop)."""
        if not refused:
            return
        ctx = self.ctx
        pipe = ctx.client.pipeline(transaction=False)
        for request, got in refused:
            log.warning("no live worker has handler %r for %s", got.handler, got.id)
            text = texts.no_worker(request.action, got.id, got.handler or None)
            reply = text_result(text, base_details(request.action, request.reason,
                                                   request.extra, got.spec), is_error=True)
            key = ctx.keys.reply(request.session, request.req)
            pipe.rpush(key, reply.to_json())
            pipe.expire(key, ctx.settings.reply_ttl_s)
        pipe.execute()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _outcome(taken: Taken) -> str:
    """What became of a request, for logs and tests: dispatched, none, dup or no-worker."""
    return "dispatched" if taken.status is TakeStatus.OK else taken.status.value
