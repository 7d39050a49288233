"""A dramatiq broker on Redis streams that pushes work to idle workers.

Stock dramatiq's RedisBroker polls: an idle consumer sleeps between fetches, which costs an
interactive resolve hundreds of milliseconds. Here each queue is read from one or more streams
through a consumer group with ``XREADGROUP ... BLOCK``, so a waiting worker wakes the moment a
message lands.

Handler tasks live in the partitions beside the state (``pa:{tag}:dq:<pool>``, see
``broker/keys.py``): take.lua enqueues a task in the same atomic step as its lease. A worker
process serves its pool (``broker/routing.py``) through queues named ``<pool>@<n>``, each reading
a group of partition streams: all of them in one read on a single Redis, one per queue on a
cluster (a blocking read's keys must share a slot). Whatever queue a message was sent under,
the consumer that read it renames it to its own queue, which dramatiq's worker uses to ack.

Delivery is at least once (a message unacked for ``claim_idle_ms`` is claimed by another
consumer). Correctness never rests on that: every handler run is fenced by its lease token.

A worker process may plug in ``Early`` (``workers/early.py``): the consumer thread then gives it
the messages it is about to hand on while a worker thread is free for each, so that their
claims are on their way while the worker threads wake, not sent after.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

import dramatiq
import orjson
import redis
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import current_millis, dq_name
from dramatiq.errors import ConnectionClosed, QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.middleware import Retries, TimeLimit

from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.keys import TASK_GROUP, Keys
from pending_actions.broker.roundtrips import read_group

log = logging.getLogger("pending_actions.taskbroker")

FIELD = b"m"  # take.lua writes the same field name
ACKED = "acked_with_outcome"  # message option: the actor already acked it (see ack_with)
STREAM = "stream"  # message option: the stream the message was read from
ENTRY = "stream_entry"  # message option: its entry id there


class Early(Protocol):
    """Called on a consumer thread, never raises. ``claim``: messages about to be handed to
    worker threads, each with a thread free for it. ``release``: messages of those that will
    not run here after all (a worker shutting down)."""

    def claim(self, messages: list[MessageProxy]) -> None: ...

    def release(self, messages: list[MessageProxy]) -> None: ...


class OrjsonEncoder(dramatiq.Encoder):
    """dramatiq message encoder using orjson (never pickle)."""

    def encode(self, data: dict[str, Any]) -> bytes:
        return orjson.dumps(data)

    def decode(self, data: bytes) -> dict[str, Any]:
        try:
            out = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise dramatiq.DecodeError(f"not JSON: {data[:80]!r}", data, exc) from None
        if not isinstance(out, dict):
            raise dramatiq.DecodeError("message is not a JSON object", data, None)
        return out


class StreamsBroker(dramatiq.Broker):
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        middleware: list[Any] | None = None,
        claim_idle_ms: int = 60_000,
    ) -> None:
        self.serving: dict[str, list[str]] = {}  # queue -> its streams, once serve() is called
        self.hidden: set[str] = set()
        if middleware is None:
            # dramatiq's defaults but those no actor here uses (max_age, callbacks, pipelines,
            # notify_shutdown): each middleware is called several times per message
            middleware = [TimeLimit(), Retries()]
        super().__init__(middleware=middleware)
        self.client = client
        self.keys = keys
        self.claim_idle_ms = claim_idle_ms
        self.queues: set[str] = set()
        self._groups: set[str] = set()
        self.early: Early | None = None
        self.threads = 0  # the worker threads that run this broker's messages (set at boot)
        # messages handed out by every consumer and not yet acked or nacked (dramatiq acks on
        # the worker thread, once it is done): fewer than ``threads`` means one is free
        self._handed = 0
        self._handed_lock = threading.Lock()

    def hand_out(self, n: int) -> int:
        """Count ``n`` more messages handed out; returns how many worker threads were free for
        them (0 while ``threads`` is unknown)."""
        with self._handed_lock:
            free = self._free(n)
            self._handed += n
        return free

    def _free(self, n: int) -> int:
        # (under _handed_lock) how many of n a worker thread is free for; 0 while unknown
        return max(0, min(self.threads - self._handed, n)) if self.threads else 0

    def handed_back(self, n: int = 1) -> None:
        with self._handed_lock:
            self._handed -= n

    def streams(self, queue_name: str) -> list[str]:
        return self.serving.get(queue_name) or [self.keys.plain_queue(queue_name)]

    def serve(self, queue_name: str, streams: list[str]) -> None:
        """Consume ``queue_name`` from ``streams``."""
        self.serving[queue_name] = streams
        self.declare_queue(queue_name)

    def hide(self, queue_name: str) -> None:
        """Do not consume ``queue_name`` (the handler actor's own queue: its tasks come through
        the pool's queues instead)."""
        self.hidden.add(queue_name)

    def ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            self.client.xgroup_create(stream, TASK_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(stream)

    def declare_queue(self, queue_name: str) -> None:
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self.queues.add(queue_name)
        self.emit_after("declare_queue", queue_name)
        if queue_name not in self.serving:  # pool queues: handler tasks are never delayed
            delayed = dq_name(queue_name)
            self.delay_queues.add(delayed)
            self.emit_after("declare_delay_queue", delayed)

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        if delay is not None:  # dramatiq's own retries (of other actors than handler runs)
            message = message.copy(queue_name=dq_name(message.queue_name),
                                   options={"eta": current_millis() + delay})
        self.emit_before("enqueue", message, delay)
        try:
            self.client.xadd(self.streams(message.queue_name)[0], {FIELD: message.encode()})
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        self.emit_after("enqueue", message, delay)
        return message

    def ack_with(self, pipe: Any, message: Message[Any] | MessageProxy) -> None:
        """Queue the ack of ``message`` on the caller's pipeline, so that a task's outcome and
        its ack are one round trip; the consumer then skips its own ack. Should that pipeline
        fail, the entry stays pending and is redelivered, which the lease token fences."""
        entry, stream = message.options.get(ENTRY), message.options.get(STREAM)
        if not entry or not stream:
            return
        # as plain commands: the outcome's pipeline may be a roundtrips.Batch
        pipe.execute_command("XACK", stream, TASK_GROUP, entry)
        pipe.execute_command("XDEL", stream, entry)
        message.options[ACKED] = True

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 1000) -> Consumer:
        return StreamConsumer(self, queue_name, prefetch, timeout)

    def get_declared_queues(self) -> set[str]:
        queues = set(self.queues) if isinstance(self.queues, set) else set()
        return queues - self.hidden

    def get_declared_delay_queues(self) -> set[str]:
        return self.delay_queues - {dq_name(q) for q in self.hidden}

    def flush(self, queue_name: str) -> None:
        for stream in self.streams(queue_name):
            self.client.delete(stream)
            self._groups.discard(stream)

    def flush_all(self) -> None:
        for queue_name in self.queues:
            self.flush(queue_name)

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        """Wait until the queue's streams are empty (for tests and scripts)."""
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while sum(int(self.client.xlen(s)) for s in self.streams(queue_name)):
            if deadline is not None and time.monotonic() > deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(0.01)


class StreamConsumer(Consumer):
    """Reads one queue's streams. ``ack`` runs on worker threads, so the bookkeeping is
    locked."""

    def __init__(self, broker: StreamsBroker, queue_name: str, prefetch: int,
                 timeout: int) -> None:
        self.broker = broker
        self.client = broker.client
        self.queue_name = queue_name
        self.streams = broker.streams(queue_name)
        self.prefetch = max(1, prefetch)
        self.refill = max(1, self.prefetch // 4)
        self.timeout = max(1, int(timeout))
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.cache: deque[tuple[str, bytes, bytes]] = deque()  # read, not yet decoded
        self.ready: deque[MessageProxy] = deque()  # decoded and counted, not yet handed on
        self.outstanding = 0
        self.room = threading.Condition()
        self.next_claim = 0.0

    @staticmethod
    def _where(message: MessageProxy) -> tuple[str, bytes]:
        return message.options[STREAM], message.options[ENTRY].encode()

    def _done(self) -> None:
        self.broker.handed_back()
        with self.room:
            self.outstanding -= 1
            # a consumer waiting for room is woken once a few messages fit, not for each one:
            # one read then fetches several (each wake-up and read costs every process CPU)
            if self.prefetch - self.outstanding >= self.refill:
                self.room.notify()

    def _remove(self, stream: str, entry: bytes, park: dict[bytes, bytes] | None = None) -> None:
        """Drop an entry from its stream (acked), first copying it to the dead stream."""
        pipe = self.client.pipeline(transaction=False)
        if park is not None:
            fields: dict[Any, Any] = {**park, b"entry": entry}
            pipe.xadd(self.broker.keys.stream_dead(stream), fields, maxlen=10_000,
                      approximate=True)  # capped
        pipe.xack(stream, TASK_GROUP, entry)
        pipe.xdel(stream, entry)
        pipe.execute()

    def ack(self, message: MessageProxy) -> None:
        try:
            if not message.options.get(ACKED):
                self._remove(*self._where(message))
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        except redis.RedisError as exc:  # Redis full: the entry is claimed again later, and
            # its second delivery is fenced off by the lease token (begin.lua: stale)
            log.warning("ack of %s refused (%s); it will be redelivered", message, exc)
        finally:
            self._done()

    def nack(self, message: MessageProxy) -> None:
        try:
            self._remove(*self._where(message), {FIELD: message.encode()})
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        except redis.RedisError as exc:
            log.warning("nack of %s refused (%s); it will be redelivered", message, exc)
        finally:
            self._done()

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Hand messages back at once (on shutdown) rather than waiting for a claim."""
        messages = list(messages)
        if self.broker.early is not None:
            self.broker.early.release(messages)  # their claims handed back
        pipe = self.client.pipeline(transaction=False)
        for message in messages:
            stream, entry = self._where(message)
            data = message._message.copy(options={}).encode()
            pipe.xadd(stream, {FIELD: data})
            pipe.xack(stream, TASK_GROUP, entry)
            pipe.xdel(stream, entry)
        if len(pipe):
            try:
                pipe.execute()
            except TRANSIENT as exc:
                raise ConnectionClosed(exc) from None

    def _fetch(self, count: int) -> None:
        now = time.monotonic()
        if now >= self.next_claim:
            self.next_claim = now + self.broker.claim_idle_ms / 2000
            for stream in self.streams:
                claimed: Any = self.client.xautoclaim(
                    stream, TASK_GROUP, self.name, self.broker.claim_idle_ms, start_id="0-0",
                    count=count)
                self.cache.extend((stream, e, f[FIELD]) for e, f in claimed[1] if f and FIELD in f)
            if self.cache:
                return
        # on a single Redis, on the consumer thread's own connection
        reply: Any = read_group(self.client, TASK_GROUP, self.name, self.streams, count,
                                self.timeout)
        for stream, entries in reply or ():
            name = stream.decode() if isinstance(stream, bytes) else stream
            self.cache.extend((name, e, f.get(FIELD, b"")) for e, f in entries)

    def _proxy(self, stream: str, entry: bytes, data: bytes) -> MessageProxy | None:
        # decoded as dramatiq's Message.decode does, but straight into the message this
        # consumer hands on (its own queue, where it was read): decode() and then copy() built
        # it twice, which an idle worker pays for on the path of each resolve
        try:
            fields = dramatiq.get_encoder().decode(data)
            fields["args"] = tuple(fields["args"])
            fields["queue_name"] = self.queue_name
            fields["options"] = {**fields.get("options", {}), STREAM: stream,
                                 ENTRY: entry.decode()}
            message: Message[Any] = Message(**fields)
        except Exception as exc:  # malformed entry: park it in the dead stream, keep serving
            self._remove(stream, entry, {FIELD: data, b"reason": str(exc)[:500].encode()})
            return None
        return MessageProxy(message)

    def _decode(self) -> None:
        """Decode every message read; those a free worker thread will run at once go to
        ``early`` first."""
        fresh: list[MessageProxy] = []
        try:
            while self.cache:
                message = self._proxy(*self.cache.popleft())
                if message is not None:
                    fresh.append(message)
        finally:  # (parking a malformed one may fail: those decoded before it are handed on)
            with self.room:
                self.outstanding += len(fresh)
            free = self.broker.hand_out(len(fresh))
            self.ready.extend(fresh)
        if free and self.broker.early is not None:
            self.broker.early.claim(fresh[:free])

    def close(self) -> None:
        # messages read but never handed on (the consumer thread stopped, or restarts after an
        # error) stay pending in their stream, for another consumer to claim; an early claim of
        # theirs is handed back
        if self.ready and self.broker.early is not None:
            self.broker.early.release(list(self.ready))
        self.broker.handed_back(len(self.ready))
        self.ready.clear()

    def __next__(self) -> MessageProxy | None:
        try:
            if not self.ready and not self.cache:
                with self.room:
                    if self.outstanding >= self.prefetch:
                        self.room.wait(self.timeout / 1000)
                    room = self.prefetch - self.outstanding
                if room <= 0:
                    return None
                for stream in self.streams:
                    self.broker.ensure_group(stream)
                self._fetch(room)
            if self.cache:
                self._decode()
            return self.ready.popleft() if self.ready else None
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        except redis.ResponseError as exc:
            # stream deleted (flush), or Redis restarted empty; UNBLOCKED: while we were
            # blocked on it
            if "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc):
                self.broker._groups.difference_update(self.streams)
                return None
            raise
