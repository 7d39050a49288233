"""The stock dramatiq baseline, sender side: send the no-op actor's message and wait for its
result through dramatiq's own Results backend (``get_result(block=True)``, a BRPOPLPUSH), the
honest send-to-result round trip of stock dramatiq. Also: is RabbitMQ there to compare with?"""

from __future__ import annotations

import contextlib
import importlib
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlparse

import dramatiq
from dramatiq.results.backends import RedisBackend

ACTOR = "bench_noop"
ENV_QUEUE = "BENCH_STOCK_QUEUE"  # one queue per run: runs sharing a RabbitMQ stay apart
ENV_BROKER = "BENCH_STOCK_BROKER_URL"
ENV_RESULTS = "BENCH_STOCK_RESULTS_URL"
ENV_READY = "BENCH_STOCK_READY_STREAM"  # where each stock worker process says it has booted
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def stock_broker(url: str, **options: Any) -> Any:
    """dramatiq's own broker for ``url`` with its default settings."""
    # Held as Any: dramatiq's broker constructors are untyped.
    cls: Any
    if url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker as cls
    else:
        from dramatiq.brokers.redis import RedisBroker as cls
    return cls(url=url, **options)


def rabbitmq_unavailable(url: str = RABBITMQ_URL) -> str | None:
    """Why the RabbitMQ baseline cannot run, or None when it can."""
    try:
        pika: Any = importlib.import_module("pika")
    except ImportError:
        return "pika is not installed (pip install pika)"
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5672),
                                      timeout=1.0):
            pass
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.close()
    except Exception as exc:  # any refusal (network, auth, vhost) means: no baseline
        return f"RabbitMQ not reachable at {parsed.hostname}:{parsed.port}: {exc!r}"[:200]
    return None


def new_queue_name() -> str:
    return f"pending-actions-bench-{uuid.uuid4().hex[:10]}"


def delete_rabbitmq_queues(queue: str, url: str = RABBITMQ_URL) -> None:
    """Remove the queues this run declared (main, delay and dead-letter), best effort."""
    with contextlib.suppress(Exception):
        pika: Any = importlib.import_module("pika")
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = conn.channel()
            for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                channel.queue_delete(queue=name)
        finally:
            conn.close()


class StockClient:
    """Sends the no-op and waits for its result. Thread-safe: both dramatiq brokers keep
    per-thread connections and the results backend uses a connection pool."""

    def __init__(self, broker_url: str, results_url: str, queue: str) -> None:
        dramatiq.set_encoder(dramatiq.JSONEncoder())  # what the stock worker decodes
        self.queue = queue
        self.broker = stock_broker(broker_url)
        self.broker.declare_queue(queue)
        self.backend = RedisBackend(url=results_url)

    def message(self, *args: Any) -> dramatiq.Message[Any]:
        return dramatiq.Message(queue_name=self.queue, actor_name=ACTOR, args=args, kwargs={},
                                options={})

    def roundtrip(self, timeout_s: float = 30.0) -> float:
        """Seconds from send to result."""
        message = self.message()
        start = time.perf_counter()
        self.broker.enqueue(message)
        value = self.backend.get_result(message, block=True, timeout=int(timeout_s * 1000))
        elapsed = time.perf_counter() - start
        if value != "ok":
            raise RuntimeError(f"unexpected stock result {value!r}")
        return elapsed

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.close()
        with contextlib.suppress(Exception):
            self.backend.client.close()
