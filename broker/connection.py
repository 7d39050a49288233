"""Redis clients. Producers fail fast; workers retry with backoff (see ``worker_client``)."""

from __future__ import annotations

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry

# Errors after which the same command may simply be tried again.
TRANSIENT: tuple[type[Exception], ...] = (ConnectionError, TimeoutError, BusyLoadingError)

# A reply slower than this means a dead connection. Every blocking command we send blocks for
# less (BLOCK_CHUNK_S, block_ms), so it never trips this; redis-py 8 defaults to 5 s otherwise.
SOCKET_TIMEOUT_S = 15.0
BLOCK_CHUNK_S = 5.0


def _client(url: str, backoff_cap: float, retries: int, **extra: int) -> redis.Redis:
    from pending_actions.broker.errors import ConfigError

    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"bad Redis URL {url.split('@')[-1]!r}: it must start with "
                          "redis://, rediss:// or unix://")
    try:
        return _from_url(url, backoff_cap, retries, **extra)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {url.split('@')[-1]!r}: {exc}") from None


def _from_url(url: str, backoff_cap: float, retries: int, **extra: int) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=2.0,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=backoff_cap, base=backoff_cap / 20), retries=retries),
        retry_on_error=list(TRANSIENT),
        **extra,
    )


def producer_client(url: str) -> redis.Redis:
    """A client that retries a dropped connection a few times, then raises: producers fail
    fast."""
    return _client(url, backoff_cap=0.5, retries=3)


def worker_client(url: str, max_connections: int = 64) -> redis.Redis:
    """A client for long-running workers; their loops add their own backoff on top."""
    return _client(url, backoff_cap=1.0, retries=5, max_connections=max_connections)


def async_producer_client(url: str) -> redis.asyncio.Redis:
    """``producer_client`` for asyncio programs (``AsyncPendingActions``)."""
    return redis.asyncio.Redis.from_url(
        url,
        socket_connect_timeout=2.0,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        health_check_interval=30,
        retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.025), retries=3),
        retry_on_error=list(TRANSIENT),
    )
