"""Stock dramatiq, the baseline: one no-op actor on dramatiq's own brokers with default settings
and results through dramatiq's Results middleware (Redis backend).

Run by the harness as ``python -m dramatiq pending_actions_harness.bench.stock_actors``; the
broker URL, the queue, the results URL and a readiness stream come from the environment (see
``bench.stock``).
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
import redis
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from pending_actions_harness.bench.stock import (
    ACTOR,
    ENV_BROKER,
    ENV_QUEUE,
    ENV_READY,
    ENV_RESULTS,
    stock_broker,
)

_results_url = os.environ[ENV_RESULTS]


class Ready(dramatiq.Middleware):
    """Says when a worker process has booted, so the harness waits on an event, not a sleep.
    It acts only at boot: the message path is stock."""

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        client = redis.Redis.from_url(_results_url)
        client.xadd(os.environ[ENV_READY], {"pid": os.getpid()})
        client.close()


broker = stock_broker(os.environ[ENV_BROKER])
results: Any = Results  # dramatiq's middleware constructor is untyped
broker.add_middleware(results(backend=RedisBackend(url=_results_url)))
broker.add_middleware(Ready())
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name=ACTOR, queue_name=os.environ[ENV_QUEUE], store_results=True,
                max_retries=0)
def noop() -> str:
    return "ok"
