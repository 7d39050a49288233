"""Redis clients. Producers fail fast; workers retry with backoff (see ``worker_client``)."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

# Errors after which the same command may simply be tried again.
TRANSIENT: tuple[type[Exception], ...] = (ConnectionError, TimeoutError, BusyLoadingError)


def producer_client(url: str) -> redis.Redis:
    """A client that retries a dropped connection a few times, then raises."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=2.0,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=3),
        retry_on_error=list(TRANSIENT),
    )


def worker_client(url: str, max_connections: int = 64) -> redis.Redis:
    """A client for long-running workers; their loops add their own backoff on top."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=2.0,
        socket_keepalive=True,
        health_check_interval=30,
        max_connections=max_connections,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=5),
        retry_on_error=list(TRANSIENT),
    )
