"""The dramatiq side: broker setup from the environment, the actor that runs handlers, and a
middleware that publishes this worker's handler names once it has booted.

Run with ``python -m dramatiq workers.actors your.handlers`` (``pending-actions worker`` does).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import dramatiq
import orjson
import redis
from dramatiq.middleware import CurrentMessage

from pending_actions.broker.context import Context
from pending_actions.broker.events import WorkerEvent
from pending_actions.broker.loops import PULSE_S, Beats, Loop
from pending_actions.broker.settings import Settings
from pending_actions.broker.taskbroker import StreamsBroker
from pending_actions.broker.tasks import ACTOR_NAME, TaskMessage, task_broker
from pending_actions.workers import attempt, registry

log = logging.getLogger("pending_actions.actors")
ctx = Context.create(Settings(), role="worker")


class Registration(dramatiq.Middleware):
    """Tells producers which handler names exist and says when this worker is ready. A loop of
    ``broker.loops`` (so a worker that boots while Redis is down keeps trying), re-registering
    every HEARTBEAT_S in case Redis lost its data; it also starts this process's lease renewer
    and its pulse, so that every loop beats from the start."""

    HEARTBEAT_S = 30.0

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.first = True

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        Loop("registration", self._publish, self.stop, pause_s=self.HEARTBEAT_S,
             every_s=3 * self.HEARTBEAT_S, beats=beats).thread().start()
        Loop("pulse", lambda: beats.beat("pulse", PULSE_S * 3, force=True), self.stop,
             pause_s=PULSE_S, every_s=PULSE_S * 3).thread().start()
        renewer.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self.stop.set()
        try:
            ctx.client.xadd(ctx.keys.workers, {"role": "dramatiq", "event": WorkerEvent.STOPPING,
                                               "pid": os.getpid()}, maxlen=1000,
                            approximate=True)
            ctx.client.delete(ctx.keys.beats(beats.proc))  # gone: not a dead loop
        except redis.RedisError:
            log.warning("could not announce shutdown; Redis is unavailable")

    def _publish(self) -> None:
        names = registry.names()
        info = orjson.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
        pipe = ctx.client.pipeline(transaction=False)
        if names:
            pipe.hset(ctx.keys.handlers, mapping=dict.fromkeys(names, info))
        if self.first:
            pipe.xadd(ctx.keys.workers, {"role": "dramatiq", "event": WorkerEvent.READY,
                                         "pid": os.getpid(),
                                         "handlers": ",".join(names)}, maxlen=1000,
                      approximate=True)
        pipe.execute()
        self.first = False


beats = Beats(ctx, f"{socket.gethostname()}:{os.getpid()}:dramatiq", "dramatiq")
broker = task_broker(ctx)
broker.add_middleware(Registration())
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)
renewer = attempt.Renewer(ctx, beats)


@dramatiq.actor(
    actor_name=ACTOR_NAME,
    queue_name=ctx.settings.queue,
    max_retries=0,  # a failed attempt is re-added by readd.lua, never retried by dramatiq
    time_limit=ctx.settings.handler_time_limit_ms,
)
def run_attempt(**fields: Any) -> None:
    attempt.run_attempt(ctx, renewer, TaskMessage.from_kwargs(fields), _settle())


def _settle() -> attempt.Settle | None:
    """On our streams broker (same Redis as the state), the task's ack joins the outcome's
    round trip; on any other broker dramatiq acks it as usual."""
    message = CurrentMessage.get_current_message()
    if message is None or not isinstance(broker, StreamsBroker) or broker.client is not ctx.client:
        return None
    return lambda pipe: broker.ack_with(pipe, message)
