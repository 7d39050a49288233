"""A worker's connection pool, bounded: the connections its threads use are the pool's, and
one never given back would leave the process, at the bound, with none, for ever."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from redis.exceptions import ConnectionError, MaxConnectionsError


class PoolExhausted(ConnectionError):
    """No connection of a worker's bounded pool came back within ``POOL_WAIT_S``: every one is
    held. Not an outage (the connections of a Redis that is away fail and come back to the
    pool): connections that were never given back. A loop that keeps meeting it ends its
    process, for its supervisor to start afresh (``broker/loops.py``)."""


def is_exhausted(exc: BaseException) -> bool:
    """A pool with no connection to give: ours (``PoolExhausted``), or redis-py's own
    (``MaxConnectionsError``, a cluster node's pool)."""
    return isinstance(exc, PoolExhausted | MaxConnectionsError)


# how long a worker's checkout waits for a connection to come back when all are out
POOL_WAIT_S = 5.0


class BoundedPool(redis.ConnectionPool):
    """redis-py's pool, bounded as before by ``max_connections``, but a checkout while all are
    out waits up to ``timeout`` s for one to come back (a burst), then raises
    ``PoolExhausted`` (connections lost for good), where redis-py's raises at once."""

    def __init__(self, *, timeout: float, **kwargs: Any) -> None:
        self.timeout = timeout
        self._freed = threading.Condition()
        self._released = 0  # releases so far: one between a refusal and the wait is not missed
        super().__init__(**kwargs)

    def get_connection(self, *args: Any, **options: Any) -> Any:
        deadline = time.monotonic() + self.timeout
        while True:
            seen = self._released
            try:
                return super().get_connection(*args, **options)
            except MaxConnectionsError:
                with self._freed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PoolExhausted(f"no free Redis connection within {self.timeout:g}s:"
                                            f" all {self.max_connections} are held") from None
                    if self._released == seen:
                        self._freed.wait(left)

    def release(self, connection: Any) -> None:
        super().release(connection)
        with self._freed:
            self._released += 1
            self._freed.notify()


def bounded(client: redis.Redis, timeout: float, **pool_options: Any) -> redis.Redis:
    """``client`` on a ``BoundedPool`` made with the very options redis-py gave its own, and
    ``pool_options``: those a pool takes for itself rather than keeping among its
    connections' (a redis-py pool keeps no copy of them to read back)."""
    plain = client.connection_pool
    client.connection_pool = BoundedPool(
        timeout=timeout, connection_class=plain.connection_class,
        max_connections=plain.max_connections, **plain.connection_kwargs, **pool_options)
    plain.disconnect()
    return client
