"""Redis clients. Producers fail fast; workers retry with backoff (see ``worker_client``).

One URL picks the client: ``redis://`` / ``rediss://`` / ``unix://`` a single Redis,
``redis+cluster://[user:password@]host1:port1,host2:port2/`` (or ``rediss+cluster://``) a Redis
Cluster, reached through any of the listed startup nodes with redis-py's ``RedisCluster``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

import hiredis
import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    MasterDownError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)
from redis.retry import Retry

from pending_actions.broker.errors import ConfigError

T = TypeVar("T")


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
BLOCK_CHUNK_S = 5.0
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def cluster_client(url: str, **options: Any) -> redis.Redis:
    """A RedisCluster for a ``redis+cluster://`` URL."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    nodes = []
    for hostport in hosts.split(","):
        host, _, port = hostport.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"cluster URL: expected host:port in {hostport!r} ({url!r})")
        nodes.append(ClusterNode(host, int(port)))  # type: ignore[no-untyped-call]
    if parts.username or parts.password:
        options["username"] = unquote(parts.username) if parts.username else None
        options["password"] = unquote(parts.password) if parts.password else None
    if parts.scheme.startswith("rediss"):
        options["ssl"] = True
    # RedisCluster serves every command and pipeline we send on a single Redis (keys of one
    # call in one slot), so the rest of the code types it as a redis.Redis
    return cast(redis.Redis, RedisCluster(startup_nodes=nodes, **options))


def _client(url: str, backoff_cap: float, retries: int, **extra: int) -> redis.Redis:
    if not url.startswith(("redis://", "rediss://", "unix://")) and not is_cluster_url(url):
        raise ConfigError(f"bad Redis URL {url.split('@')[-1]!r}: it must start with "
                          "redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://")
    try:
        return _from_url(url, backoff_cap, retries, **extra)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {url.split('@')[-1]!r}: {exc}") from None


def _from_url(url: str, backoff_cap: float, retries: int, **extra: int) -> redis.Redis:
    options: dict[str, Any] = dict(
        socket_connect_timeout=2.0,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=backoff_cap, base=backoff_cap / 20), retries=retries),
        **extra,
    )
    if is_cluster_url(url):
        return cluster_client(url, **options)
    return redis.Redis.from_url(url, retry_on_error=list(TRANSIENT), **options)


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
    """A client for long-running workers; their loops add their own backoff on top."""
    return _client(url, backoff_cap=1.0, retries=5, max_connections=max_connections)


def acked(client: redis.Redis, key: str, build: Callable[[Any], Callable[[list[Any]], T]],
          replicas: int, timeout_ms: int, raise_on_error: bool = True) -> T:
    """Run the commands ``build`` queues on a pipeline and, with ``replicas`` > 0, ``WAIT`` for
    that many replicas to have them before returning (else ``NotReplicated``). ``build`` returns
    how to read its answer from the pipeline's replies.

    WAIT covers the writes of its own connection, so on a cluster the pipeline goes straight
    to the master of ``key``'s slot over one connection (every command queued must be in that
    slot); a failover in between shows up as a connection error, and the caller's retry finds
    the new master. ``raise_on_error=False``: a command's error is left in its reply, for the
    reader to weigh (some replies matter less than others)."""
    if not replicas:
        pipe = client.pipeline(transaction=False)
        read = build(pipe)
        return read(pipe.execute(raise_on_error=raise_on_error))
    if is_cluster(client):
        cluster = cast(Any, client)
        node = cluster.get_node_from_key(key)
        try:
            pipe = cluster.get_redis_connection(node).pipeline(transaction=False)
            read = build(pipe)
            pipe.execute_command("WAIT", replicas, timeout_ms)
            replies = pipe.execute(raise_on_error=raise_on_error)
        except TRANSIENT:
            cluster.nodes_manager.initialize()  # a dead master: learn the new layout
            raise
        except AskError as exc:  # MOVED too: the slot has a new master; try again there
            cluster.nodes_manager.initialize()
            raise NotReplicated(f"slot moved: {exc}") from exc
    else:
        pipe = client.pipeline(transaction=False)
        read = build(pipe)
        pipe.execute_command("WAIT", replicas, timeout_ms)  # type: ignore[no-untyped-call]
        replies = pipe.execute(raise_on_error=raise_on_error)
    if isinstance(replies[-1], Exception):
        raise replies[-1]
    if int(replies[-1]) < replicas:
        short = NotReplicated(f"{replies[-1]} of {replicas} replicas confirmed in {timeout_ms} ms")
        short.result = read(replies[:-1])
        raise short
    return read(replies[:-1])


def async_producer_client(url: str) -> redis.asyncio.Redis:
    """``producer_client`` for asyncio programs (``AsyncPendingActions``); a
    ``redis+cluster://`` URL gives ``redis.asyncio``'s RedisCluster."""
    options: dict[str, Any] = dict(
        socket_connect_timeout=2.0,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
        retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.025), retries=3),
    )
    if is_cluster_url(url):
        parts = urlsplit(url)
        nodes = [AsyncClusterNode(h.rpartition(":")[0], int(h.rpartition(":")[2]))
                 for h in parts.netloc.rpartition("@")[2].split(",")]
        if parts.password:
            options["password"] = unquote(parts.password)
        if parts.username:
            options["username"] = unquote(parts.username)
        # the rest of the code types it as the single-server client, like the sync one
        return cast(redis.asyncio.Redis,
                    redis.asyncio.RedisCluster(startup_nodes=nodes, **options))
    return redis.asyncio.Redis.from_url(url, health_check_interval=30,
                                        retry_on_error=list(TRANSIENT), **options)


def transactions(client: redis.Redis,
                 queues: Sequence[Callable[[Any], object]]) -> list[list[Any]]:
    """The commands each of ``queues`` queues on a pipeline, as one MULTI/EXEC each, sent one
    after the other over one connection; the replies are read once all are sent, so Redis runs
    (and syncs) a transaction while the next is being built. Returns each one's replies, a
    command's error in its place (a transaction Redis refused whole: that error for each).
    A dropped connection sends again those whose reply was not read, as the client's retry
    would a pipeline."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    done: list[list[Any]] = []
    try:
        conn.retry.call_with_retry(lambda: _transactions(client, conn, queues, done),
                                   lambda _error: conn.disconnect())
        return done
    finally:
        pool.release(conn)


def _transactions(client: redis.Redis, conn: Any, queues: Sequence[Callable[[Any], object]],
                  done: list[list[Any]]) -> None:
    """Send those of ``queues`` that ``done`` has no replies for, and read their replies
    into it."""
    stacks = []
    try:
        for i, queue in enumerate(queues[len(done):]):
            pipe = client.pipeline(transaction=True)  # only collects the commands
            queue(pipe)
            stacks.append(pipe.command_stack)
            # a health check (PING) once replies are due would read one of those instead
            conn.send_packed_command([_packed(pipe.command_stack)], check_health=i == 0)
        for stack in stacks:
            done.append(_exec_replies(client, conn, stack))
    except BaseException:
        conn.disconnect()  # replies left unread would be taken for the next command's
        raise


def _packed(stack: list[Any]) -> bytes:
    """A pipeline's commands as a MULTI/EXEC in RESP, packed by hiredis in one go (redis-py's
    packer looks at every argument in Python first: a stage is thousands of them)."""
    out = [b"*1\r\n$5\r\nMULTI\r\n"]
    for args, _options in stack:
        name = args[0]
        if isinstance(name, str) and " " in name:
            args = (*name.split(), *args[1:])  # two words, as redis-py takes them ("CLIENT ID")
        out.append(hiredis.pack_command(args))
    out.append(b"*1\r\n$4\r\nEXEC\r\n")
    return b"".join(out)


def _exec_replies(client: redis.Redis, conn: Any, stack: list[Any]) -> list[Any]:
    """A MULTI/EXEC's replies, read as redis-py's transaction pipeline reads them."""
    errors: list[tuple[int, Exception]] = []
    try:
        conn.read_response()  # MULTI's OK
    except ResponseError as exc:
        errors.append((-1, exc))
    for i, _command in enumerate(stack):
        try:
            conn.read_response()  # QUEUED, or the command refused before it ran
        except ResponseError as exc:
            errors.append((i, exc))
    try:
        replies = conn.read_response()
    except ResponseError as exc:  # EXECABORT: none ran
        return [errors[0][1] if errors else exc] * len(stack)
    for i, error in errors:
        if i >= 0:
            replies.insert(i, error)
    callbacks = client.response_callbacks
    out = []
    for reply, (args, options) in zip(replies, stack, strict=True):
        if not isinstance(reply, Exception) and args[0] in callbacks:
            options = {k: v for k, v in options.items() if k != "keys"}
            reply = callbacks[args[0]](reply, **options)
        out.append(reply)
    return out
