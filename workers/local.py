"""Serving resolve requests in a dramatiq worker process, and running there what it takes.

An idle resolve wakes three processes in turn: the resolve worker takes the target and
enqueues its task, a dramatiq worker's consumer thread reads the task and claims it
(begin.lua), and a worker thread runs it; each step a round trip to Redis (an fsync under
``appendfsync always``) and a process woken from sleep. With ``LOCAL_DISPATCH`` (off by
default, and only where ``workers.tasks.serves_locally`` allows it) each dramatiq process runs
the resolve worker's serve loop itself: for each request it reads while one of its worker
threads is free, take.lua claims the attempt for that thread in the same atomic step as the
take (the lease written running, with its claimant, as begin.lua would write it) and enqueues
no task. The serve thread hands the task to dramatiq's work queue while the take is still on
its way; the thread runs it only once the take's answer says it claimed. The handler still
runs as a dramatiq task, on a dramatiq worker thread, through its middleware (time limit,
current message); its outcome is fenced by the lease token as before. The price: the serve
loop's Python shares the process's interpreter lock with its worker threads (docs/design.md
has the figures).

What it does not change: requests beyond the free threads (under load), and targets whose
handler this process does not have, are enqueued to a pool's task stream as before, for any
worker. A process that dies with such a task claimed but not yet started loses its lease like
one that died mid-handler: recovery returns the action with a stall counted. One that stops
cleanly with the task still queued in memory hands the claim back and puts the task in its
stream (``StreamConsumer.requeue``), so that another worker runs it without a stall."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from dramatiq.broker import MessageProxy
from dramatiq.message import Message

from pending_actions.broker.atomic.replies import Taken
from pending_actions.broker.context import Context
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.routing import Live
from pending_actions.workers.early import Claimed, EarlyClaims, Verdict
from pending_actions.workers.taskbroker import ACKED, STREAM, StreamConsumer, StreamsBroker
from pending_actions.workers.tasks import task_fields


class LocalDispatch:
    """The resolve worker's hook (``ResolveWorker(local=...)``) in a dramatiq process serving
    ``pool``: how many takes may claim for this process, and handing over what they claim.
    ``worker`` is dramatiq's Worker of this process (its consumer threads and work queue)."""

    def __init__(self, ctx: Context, broker: StreamsBroker, worker: Any, pool: str,
                 claims: EarlyClaims) -> None:
        self.ctx, self.broker, self.worker, self.pool = ctx, broker, worker, pool
        self.claims = claims
        self.queue = f"{pool}@0"  # the one queue of a pool on a single Redis (actors.serve_pool)
        self.closing = False
        self._consumer: tuple[Any, StreamConsumer] | None = None

    def here(self, live: Live) -> int:
        """This process's pool number in ``live`` (1-based, as take.lua counts), 0 if absent."""
        return live.pools.index(self.pool) + 1 if self.pool in live.pools else 0

    def reserve(self, n: int) -> int:
        """How many of ``n`` takes may claim for a worker thread of this process: each is then
        counted as handed out, until its task's ack or ``release``."""
        thread = self.worker.consumers.get(self.queue)
        consumer = getattr(thread, "consumer", None)
        if self.closing or not isinstance(consumer, StreamConsumer):
            return 0
        self._consumer = thread, consumer  # the one its acks come back to
        return self.broker.reserve(n)

    def release(self, n: int) -> None:
        if n:
            self.broker.handed_back(n)

    def hand(self, request: ResolveRequest, token: str, claimant: str) -> Verdict:
        """Hand a worker thread of this process the attempt that a take sent for ``claimant``
        is claiming, while the take is on its way: the thread wakes and reads the task
        meanwhile, then waits for the verdict (``Verdict.tell``, once the take's answer is
        read) and runs nothing unless the take claimed for it. A reserved thread each."""
        assert self._consumer is not None
        thread, consumer = self._consumer
        session, keys = request.session, self.ctx.keys
        message_id = str(uuid.UUID(hex=token))
        # the message take.lua would have enqueued; it names the stream it would have been in,
        # where a shutdown puts it back, and has no entry there to ack
        fields = task_fields(request, token, self.queue, message_id)
        fields["options"] = {STREAM: keys.task_queue(keys.partition(session), self.pool),
                             ACKED: True}
        message: Message[Any] = Message(**fields)
        verdict = Verdict()
        # told within a round trip and its retries, which stop well within a third of a lease
        self.claims.add(message_id, Claimed(
            session, token, claimant,
            self.ctx.scripts.begin(session, token=token, claimant=claimant),
            verdict=verdict, wait_s=self.ctx.settings.lease_ms / 3000))
        consumer.adopt(1)
        thread.handle_message(MessageProxy(message))  # dramatiq's own hand-over
        return verdict


class Claims:
    """The claiming takes of one batch of requests: the first ``free`` of them, one reserved
    thread each, claim for this process (``claimant(i)``); their tasks are handed over once
    the takes are sent (``sent``) and told the takes' answers once read (``done``)."""

    def __init__(self, local: LocalDispatch | None, live: Live, n: int) -> None:
        self.local = local
        self.here = local.here(live) if local is not None else 0
        self.free = local.reserve(n) if local is not None and self.here else 0
        self.claimants = [uuid.uuid4().hex for _ in range(self.free)]
        self.handing: list[tuple[ResolveRequest, str, str]] = []
        self.verdicts: list[Verdict] = []

    def claimant(self, i: int, request: ResolveRequest, token: str) -> str:
        """The claimant of the i-th take of the batch ("" for a take that claims nothing)."""
        if i >= self.free:
            return ""
        self.handing.append((request, token, self.claimants[i]))
        return self.claimants[i]

    def sent(self) -> None:
        if self.local is not None and not self.verdicts:  # once, also when a batch is resent
            self.verdicts = [self.local.hand(*h) for h in self.handing]

    def done(self, out: list[Taken | Exception]) -> None:
        """Every thread told, whatever became of its take: what it claimed, else nothing to
        run (an answer never read: a claim the take made is recovered when its lease runs
        out); threads reserved for tasks never handed over are free again."""
        if self.local is not None:
            self.local.release(self.free - len(self.verdicts))
        for verdict, got in itertools.zip_longest(self.verdicts, out[:len(self.verdicts)]):
            verdict.tell(got.claimed if isinstance(got, Taken) else None)
