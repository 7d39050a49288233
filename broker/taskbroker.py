"""A dramatiq broker on Redis streams that pushes work to idle workers.

Stock dramatiq's RedisBroker polls: an idle consumer sleeps between fetches, which costs an
interactive resolve hundreds of milliseconds. Here each queue is a stream read through a consumer
group with ``XREADGROUP ... BLOCK``, so a waiting worker wakes the moment a message lands.

Delivery is at least once (a message unacked for ``claim_idle_ms`` is claimed by another
consumer). Correctness never rests on that: every handler run is fenced by its lease token.
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
from typing import Any

import dramatiq
import orjson
import redis
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import current_millis, dq_name
from dramatiq.errors import ConnectionClosed, QueueJoinTimeout
from dramatiq.message import Message

from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.keys import Keys

log = logging.getLogger("pending_actions.taskbroker")

FIELD = b"m"
ACKED = "acked_with_outcome"  # message option: the actor already acked it (see ack_with)


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
        super().__init__(middleware=middleware)
        self.client = client
        self.keys = keys
        self.claim_idle_ms = claim_idle_ms
        self.queues: set[str] = set()
        self._groups: set[str] = set()

    def stream(self, queue_name: str) -> str:
        return self.keys.task_queue(queue_name)

    def ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            self.client.xgroup_create(stream, Keys.TASK_GROUP, id="0", mkstream=True)
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
        delayed = dq_name(queue_name)
        self.delay_queues.add(delayed)
        self.emit_after("declare_delay_queue", delayed)

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        queue_name = message.queue_name
        if delay is not None:
            queue_name = dq_name(queue_name)
            message = message.copy(queue_name=queue_name,
                                   options={"eta": current_millis() + delay})
        self.emit_before("enqueue", message, delay)
        try:
            self.client.xadd(self.stream(queue_name), {FIELD: message.encode()})
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        self.emit_after("enqueue", message, delay)
        return message

    def enqueue_on(self, pipe: Any, message: Message[Any]) -> None:
        """Queue ``message`` on the caller's pipeline (of this broker's client), to go out in
        the same round trip as the caller's own writes (the resolve worker sends a take and its
        task together). The caller emits ``after_enqueue`` once the pipeline has run."""
        self.emit_before("enqueue", message, None)
        pipe.xadd(self.stream(message.queue_name), {FIELD: message.encode()})

    def ack_with(self, pipe: Any, message: Message[Any] | MessageProxy) -> None:
        """Queue the ack of ``message`` on the caller's pipeline, so that a task's outcome and
        its ack are one round trip; the consumer then skips its own ack. Should that pipeline
        fail, the entry stays pending and is redelivered, which the lease token fences."""
        entry = message.options.get("stream_entry")
        if not entry:
            return
        stream = self.stream(message.queue_name)
        pipe.xack(stream, Keys.TASK_GROUP, entry)
        pipe.xdel(stream, entry)
        message.options[ACKED] = True

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 1000) -> Consumer:
        return StreamConsumer(self, queue_name, prefetch, timeout)

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def flush(self, queue_name: str) -> None:
        for name in (queue_name, dq_name(queue_name)):
            stream = self.stream(name)
            self.client.delete(stream)
            self._groups.discard(stream)

    def flush_all(self) -> None:
        for queue_name in self.queues:
            self.flush(queue_name)

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        """Wait until both the queue and its delay queue are empty (for tests and scripts)."""
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        streams = [self.stream(queue_name), self.stream(dq_name(queue_name))]
        while sum(int(self.client.xlen(s)) for s in streams):
            if deadline is not None and time.monotonic() > deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(0.01)


class StreamConsumer(Consumer):
    """Reads one queue's stream. ``ack`` runs on worker threads, so the bookkeeping is locked."""

    def __init__(self, broker: StreamsBroker, queue_name: str, prefetch: int,
                 timeout: int) -> None:
        self.broker = broker
        self.client = broker.client
        self.stream = broker.stream(queue_name)
        self.dead = broker.keys.task_dead(queue_name)
        self.prefetch = max(1, prefetch)
        self.timeout = max(1, int(timeout))
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.cache: deque[tuple[bytes, bytes]] = deque()
        self.outstanding = 0
        self.room = threading.Condition()
        self.next_claim = 0.0

    def _entry_id(self, message: MessageProxy) -> bytes:
        entry: bytes = message.options["stream_entry"].encode()
        return entry

    def _done(self) -> None:
        with self.room:
            self.outstanding -= 1
            self.room.notify()

    def _remove(self, entry: bytes, park: dict[bytes, bytes] | None = None) -> None:
        """Drop an entry from the stream (acked), first copying it to the dead stream."""
        pipe = self.client.pipeline(transaction=True)
        if park is not None:
            fields: dict[Any, Any] = {**park, b"entry": entry}
            pipe.xadd(self.dead, fields, maxlen=10_000, approximate=True)  # capped
        pipe.xack(self.stream, Keys.TASK_GROUP, entry)
        pipe.xdel(self.stream, entry)
        pipe.execute()

    def ack(self, message: MessageProxy) -> None:
        try:
            if not message.options.get(ACKED):
                self._remove(self._entry_id(message))
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        except redis.RedisError as exc:  # Redis full: the entry is claimed again later, and
            # its second delivery is fenced off by the lease token (begin.lua: stale)
            log.warning("ack of %s refused (%s); it will be redelivered", message, exc)
        finally:
            self._done()

    def nack(self, message: MessageProxy) -> None:
        try:
            self._remove(self._entry_id(message), {FIELD: message.encode()})
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        except redis.RedisError as exc:
            log.warning("nack of %s refused (%s); it will be redelivered", message, exc)
        finally:
            self._done()

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Hand messages back at once (on shutdown) rather than waiting for a claim."""
        pipe = self.client.pipeline(transaction=True)
        count = 0
        for message in messages:
            entry = self._entry_id(message)
            data = message._message.copy(options={"stream_entry": None}).encode()
            pipe.xadd(self.stream, {FIELD: data})
            pipe.xack(self.stream, Keys.TASK_GROUP, entry)
            pipe.xdel(self.stream, entry)
            count += 1
        if count:
            try:
                pipe.execute()
            except TRANSIENT as exc:
                raise ConnectionClosed(exc) from None

    def _fetch(self, count: int) -> None:
        now = time.monotonic()
        if now >= self.next_claim:
            self.next_claim = now + self.broker.claim_idle_ms / 2000
            claimed: Any = self.client.xautoclaim(
                self.stream, Keys.TASK_GROUP, self.name, self.broker.claim_idle_ms,
                start_id="0-0", count=count,
            )
            self.cache.extend((e, f[FIELD]) for e, f in claimed[1] if f and FIELD in f)
            if self.cache:
                return
        reply: Any = self.client.xreadgroup(
            Keys.TASK_GROUP, self.name, {self.stream: ">"}, count=count, block=self.timeout
        )
        for _stream, entries in reply or ():
            self.cache.extend((e, f.get(FIELD, b"")) for e, f in entries)

    def _proxy(self, entry: bytes, data: bytes) -> MessageProxy | None:
        try:
            message = Message.decode(data)
        except Exception as exc:  # malformed entry: park it in the dead stream, keep serving
            self._remove(entry, {FIELD: data, b"reason": str(exc)[:500].encode()})
            return None
        message = message.copy(options={"stream_entry": entry.decode()})
        with self.room:
            self.outstanding += 1
        return MessageProxy(message)

    def __next__(self) -> MessageProxy | None:
        try:
            if not self.cache:
                with self.room:
                    if self.outstanding >= self.prefetch:
                        self.room.wait(self.timeout / 1000)
                    room = self.prefetch - self.outstanding
                if room <= 0:
                    return None
                self.broker.ensure_group(self.stream)
                self._fetch(room)
            if not self.cache:
                return None
            entry, data = self.cache.popleft()
            return self._proxy(entry, data)
        except TRANSIENT as exc:
            raise ConnectionClosed(exc) from None
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):  # stream deleted (flush) or Redis restarted empty
                self.broker._groups.discard(self.stream)
                return None
            raise
