"""The dramatiq side: broker setup from the environment, the actor that runs handlers, and a
middleware that keeps this worker's pool of handlers live (``broker/routing.py``) and says when
it is ready.

Run with ``python -m dramatiq workers.actors your.handlers`` (``pending-actions worker`` does).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage

from pending_actions.broker import routing, tracing
from pending_actions.broker.connection import is_cluster
from pending_actions.broker.context import Context
from pending_actions.broker.events import WorkerEvent, announce
from pending_actions.broker.loops import PULSE_S, Beats, Loop, process_name
from pending_actions.broker.settings import Settings
from pending_actions.workers import attempt, registry
from pending_actions.workers.early import EarlyClaims, HandBack
from pending_actions.workers.renewer import Renewer
from pending_actions.workers.taskbroker import StreamsBroker
from pending_actions.workers.tasks import (
    ACTOR_NAME,
    TaskMessage,
    pool_queue,
    task_broker,
)

log = logging.getLogger("pending_actions.actors")
ctx = Context.create(Settings(), role="worker")


class Registration(dramatiq.Middleware):
    """Serves the queues of this process's pool (its handler set, known once every handler
    module is imported, at worker boot), keeps the pool live with a heartbeat every third of
    ``POOL_TTL_MS`` (so a process that dies silently drops out within that), and removes it at
    clean shutdown. The heartbeat is a loop of ``broker.loops`` (so a worker that boots while
    Redis is down keeps trying); it also starts this process's lease renewer and its pulse, so
    that every loop beats from the start."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        # the process's one name: its member of its pool in the registry is <pool>/<name>,
        # which `health --worker` looks for beside the process's beats
        self.instance = beats.proc
        self.names: list[str] = []
        self.tenants: dict[str, list[str]] = {}
        self.pool = ""
        self.first = True

    def before_worker_boot(self, broker: Any, worker: Any) -> None:
        self.names = registry.names()
        self.tenants = registry.tenants()
        self.pool = routing.pool_id(self.names, self.tenants)
        serve_pool(broker, self.pool)
        # claims on the consumer thread need the state's Redis, and none of REPLICA_WAIT's
        if (isinstance(broker, StreamsBroker) and broker.client is ctx.client
                and not ctx.settings.replica_wait):
            broker.threads = worker.worker_threads
            broker.early = early_claims

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        every_s = ctx.settings.pool_ttl_ms / 1000
        Loop("registration", self._publish, self.stop, pause_s=every_s / 3, every_s=every_s,
             beats=beats).thread().start()
        Loop("pulse", lambda: beats.beat("pulse", PULSE_S * 3, force=True), self.stop,
             pause_s=PULSE_S, every_s=PULSE_S * 3).thread().start()
        renewer.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self.stop.set()
        try:
            routing.leave(ctx.client, ctx.keys, self.pool, self.instance)
            announce(ctx.client, ctx.keys, "dramatiq", WorkerEvent.STOPPING)
        except redis.RedisError:
            log.warning("could not announce shutdown; Redis is unavailable")
        beats.stopped()  # gone, not a process that stopped beating

    def _publish(self) -> None:
        # register.lua runs while Redis is full (allow-oom): a pool must never look gone then
        ctx.scripts.register(pool=self.pool, names=self.names, instance=self.instance,
                             ttl_ms=ctx.settings.pool_ttl_ms, tenants=self.tenants).run()
        if self.first:
            announce(ctx.client, ctx.keys, "dramatiq", WorkerEvent.READY, pool=self.pool,
                     handlers=",".join(self.names))
        self.first = False


class FlushSpans(dramatiq.Middleware):
    """A dramatiq process ends without running ``atexit`` hooks (multiprocessing's exit), so
    its spans still held are sent here, once its threads have stopped."""

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        tracing.flush()


def serve_pool(broker: StreamsBroker, pool: str) -> None:
    """Consume this pool's tasks: from every partition's stream in the state's Redis (one read
    for all on a single Redis, one per partition on a cluster), from one stream per pool in a
    Redis of its own (``DRAMATIQ_URL``)."""
    base = ctx.settings.queue
    if broker.client is ctx.client:
        every = list(range(ctx.keys.partitions))
        groups = [[p] for p in every] if is_cluster(ctx.client) else [every]
        for n, group in enumerate(groups):
            broker.serve(f"{pool}@{n}", [ctx.keys.task_queue(p, pool) for p in group])
        broker.hide(base)
    else:
        name = pool_queue(base, pool)
        broker.serve(name, [ctx.keys.plain_queue(name)])
        broker.hide(base)


tracing.setup("pending-actions-worker")  # this process's spans; from OTEL_* alone
beats = Beats(ctx, process_name(), "dramatiq", ctx.settings.supervisor or "")
early_claims = EarlyClaims(ctx)
broker = task_broker(ctx)
broker.add_middleware(Registration())
broker.add_middleware(CurrentMessage())
broker.add_middleware(HandBack(early_claims))
broker.add_middleware(FlushSpans())
dramatiq.set_broker(broker)
renewer = Renewer(ctx, beats)


@dramatiq.actor(
    actor_name=ACTOR_NAME,
    queue_name=ctx.settings.queue,
    max_retries=0,  # a failed attempt is re-added by readd.lua, never retried by dramatiq
    time_limit=ctx.settings.handler_time_limit_ms,
)
def run_attempt(**fields: Any) -> None:
    message = CurrentMessage.get_current_message()
    early = early_claims.take(message.message_id) if message is not None else None
    attempt.run_attempt(ctx, renewer, TaskMessage.from_kwargs(fields), _settle(message), early,
                        message.message_timestamp if message is not None else None)


def _settle(message: Any) -> attempt.Settle | None:
    """In the state's Redis, the task's ack joins the outcome's round trip; in a Redis of its
    own, dramatiq acks it as usual."""
    if message is None or broker.client is not ctx.client:
        return None
    return lambda pipe: broker.ack_with(pipe, message)
