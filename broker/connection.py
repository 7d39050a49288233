"""Redis clients. Producers fail fast; workers retry with backoff (see ``worker_client``).

One URL picks the client: a single Redis or a Redis Cluster (redis-py's ``RedisCluster``),
blocking or asyncio; what the URL says is read once, for all of them, in ``broker/urls.py``.
The round trips the hot paths send on them are ``broker/roundtrips.py``'s."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    MasterDownError,
    ReadOnlyError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from pending_actions.broker.connection_pool import POOL_WAIT_S, bounded
from pending_actions.broker.errors import ConfigError
from pending_actions.broker.urls import UrlOptions, shown, url_options


class NotReplicated(ConnectionError):
    """A write was made but fewer replicas than ``REPLICA_WAIT`` confirmed it in time: treated
    like a dropped connection (every write we wait on is safe to send again). ``result`` is
    what the master answered, when it did."""

    result: Any = None


# Errors after which the same command may simply be tried again. The cluster ones are what a
# failover looks like from a client: a slot without a master for a moment, a master that turned
# replica (READONLY), a reshard in progress.
TRANSIENT: tuple[type[Exception], ...] = (
    ConnectionError, TimeoutError, BusyLoadingError, ClusterDownError, MasterDownError,
    TryAgainError, SlotNotCoveredError, ReadOnlyError,
)

# A reply slower than this means a dead connection. Every blocking command we send blocks for
# less (BLOCK_CHUNK_S, block_ms), so it never trips this; redis-py 8 defaults to 5 s otherwise.
SOCKET_TIMEOUT_S = 15.0
NO_MAINT_NOTIFICATIONS = MaintNotificationsConfig(enabled=False)
BLOCK_CHUNK_S = 5.0


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is redis-py's cluster client or its pipeline. Asked on every step of
    the hot path: by type, once, since an isinstance check against RedisCluster (whose
    metaclass is typing's protocol one) costs about 1 us every time."""
    kind = type(client)
    found = _CLUSTER_TYPES.get(kind)
    if found is None:
        found = _CLUSTER_TYPES[kind] = issubclass(kind, RedisCluster)
    return found


_CLUSTER_TYPES: dict[type, bool] = {}


@contextlib.contextmanager
def _made_from(url: str) -> Iterator[None]:
    """A constructor's refusal of an option (its value, or one a cluster client lacks) as the
    same one line as a bad URL."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad Redis URL {shown(url)!r}: {exc}") from None


def _given(defaults: dict[str, Any], url: UrlOptions) -> dict[str, Any]:
    # the URL's own options win over ours, as in redis-py's from_url. Neither CLIENT SETINFO
    # nor CLIENT MAINT_NOTIFICATIONS on connect (redis-py 8 sends both, and goes on when they
    # fail): a least-privilege user may not send them (Redis 7.0 knows neither subcommand for
    # `pending-actions acl` to allow), and Redis 6.2 and 7.2+ would log each connection's
    # refusal in ACL LOG, where real refusals must stand out
    return {"driver_info": None, "maint_notifications_config": NO_MAINT_NOTIFICATIONS,
            **defaults, **url.options}


def blocking_client(url: str, **options: Any) -> redis.Redis:
    """The blocking client of ``url`` (a RedisCluster for a cluster URL), ``options`` its
    defaults."""
    read = url_options(url)
    with _made_from(url):
        if not read.cluster:
            return redis.Redis(**_given({"retry_on_error": list(TRANSIENT), **options}, read))
        nodes = [ClusterNode(host, port) for host, port in read.nodes]  # type: ignore[no-untyped-call]
        # RedisCluster serves every command and pipeline we send on a single Redis (keys of one
        # call in one slot), so the rest of the code types it as a redis.Redis
        return cast(redis.Redis, RedisCluster(startup_nodes=nodes, **_given(options, read)))


def _client(url: str, backoff_cap: float, retries: int, **extra: int) -> redis.Redis:
    return blocking_client(
        url, socket_connect_timeout=2.0, socket_timeout=SOCKET_TIMEOUT_S, socket_keepalive=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=backoff_cap, base=backoff_cap / 20), retries=retries),
        **extra)


def server_info(client: Any, section: str) -> dict[str, Any]:
    """INFO ``section``; on a cluster from every node, as node name -> its INFO (a cluster
    client asks one node only unless told)."""
    if is_cluster(client):
        return cast(dict[str, Any], client.info(section, target_nodes=RedisCluster.ALL_NODES))
    return cast(dict[str, Any], client.info(section))


def producer_client(url: str) -> redis.Redis:
    """A client that retries a dropped connection a few times, then raises: producers fail
    fast."""
    return _client(url, backoff_cap=0.5, retries=3)


def worker_client(url: str, max_connections: int = 64) -> redis.Redis:
    """A client for long-running workers; their loops add their own backoff on top. Its pool
    is bounded (``BoundedPool``; on a cluster, each node's pool as redis-py bounds it)."""
    client = _client(url, backoff_cap=1.0, retries=5, max_connections=max_connections)
    if is_cluster(client):
        return client
    return bounded(client, POOL_WAIT_S, maint_notifications_config=NO_MAINT_NOTIFICATIONS)


def async_producer_client(url: str) -> redis.asyncio.Redis:
    """``producer_client`` for asyncio programs (``AsyncPendingActions``); a
    ``redis+cluster://`` URL gives ``redis.asyncio``'s RedisCluster."""
    read = url_options(url)
    options: dict[str, Any] = dict(
        socket_connect_timeout=2.0,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.025), retries=3),
    )
    with _made_from(url):
        if read.cluster:
            nodes = [AsyncClusterNode(host, port) for host, port in read.nodes]
            # the rest of the code types it as the single-server client, like the sync one
            return cast(redis.asyncio.Redis,
                        redis.asyncio.RedisCluster(startup_nodes=nodes, **_given(options, read)))
        return redis.asyncio.Redis(**_given(
            {"health_check_interval": 30, "retry_on_error": list(TRANSIENT), **options}, read))
