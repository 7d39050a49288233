"""The dramatiq side: broker setup from the environment, the actor that runs handlers, and a
middleware that publishes this worker's handler names once it has booted.

Run with ``python -m dramatiq workers.actors your.handlers`` (``pending-actions worker`` does).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import dramatiq
import orjson

from broker.context import ACTOR_NAME, Context, task_broker
from broker.settings import Settings
from workers import attempt, registry

ctx = Context.create(Settings(), role="worker")


class Registration(dramatiq.Middleware):
    """Tells producers which handler names exist, and says when this worker is ready."""

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        info = orjson.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                             "at": time.time()})
        names = registry.names()
        pipe = ctx.client.pipeline(transaction=False)
        if names:
            pipe.hset(ctx.keys.handlers, mapping=dict.fromkeys(names, info))
        pipe.xadd(ctx.keys.workers, {"role": "dramatiq", "event": "ready", "pid": os.getpid(),
                                     "handlers": ",".join(names)}, maxlen=1000,
                  approximate=True)
        pipe.execute()


broker = task_broker(ctx)
broker.add_middleware(Registration())
dramatiq.set_broker(broker)
renewer = attempt.Renewer(ctx)


@dramatiq.actor(
    actor_name=ACTOR_NAME,
    queue_name=ctx.settings.queue,
    max_retries=0,  # a failed attempt is re-added by readd.lua, never retried by dramatiq
    time_limit=ctx.settings.handler_time_limit_ms,
)
def run_attempt(session: str, token: str, req: str, action: str, reason: str,
                extra: dict[str, Any] | None = None) -> None:
    attempt.run_attempt(ctx, renewer, session, token, req, action, reason, extra)
