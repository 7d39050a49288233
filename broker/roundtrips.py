"""The round trips of the hot paths: a batch of commands sent as one write and its replies read
in order (``Batch``, ``pipeline``), on a connection its thread keeps (``own_connection``),
packed by hiredis (``packed``); the blocking stream read of the serving loops (``read_group``);
a batch waited on by replicas (``acked``); and, on a cluster, the master of a slot
(``slot_master``, ``relearn``). The clients themselves are made in ``broker/connection.py``."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

import hiredis
import redis
from redis.exceptions import (
    AskError,
    ConnectionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
)

from pending_actions.broker.connection import TRANSIENT, NotReplicated, is_cluster

T = TypeVar("T")


class Batch:
    """A pipeline without a transaction, for the hot paths (a take, a handler run's claim and
    outcome) on a single Redis or on the master of one cluster slot: its commands go in one
    write and their replies come back in order, each error in its place, and a dropped
    connection is retried by the client's Retry, as with redis-py's pipeline; but without that
    pipeline's per-call bookkeeping (response callbacks, metrics, its command stack), which
    cost a worker more CPU than the round trip itself. Commands go through ``execute_command``
    only, and their replies are Redis's own (no callbacks: an EVALSHA, XADD, XACK or XDEL reads
    the same either way).

    ``conn``: a connection the calling thread keeps (``own_connection``), sent on without a
    checkout from the pool. ``cluster``: the cluster client when ``client`` is the master of
    one of its slots (``slot_master``), where every command queued must be in that slot."""

    def __init__(self, client: redis.Redis, conn: Any = None, cluster: Any = None) -> None:
        self.client = client
        self.pool = client.connection_pool
        self.conn = conn
        self.cluster = cluster
        self.commands: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.commands)

    def execute_command(self, *args: Any) -> Batch:
        self.commands.append(args)
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self.commands = self.commands, []
        if not commands:
            return []
        conn: Any = self.conn or self.pool.get_connection()
        try:
            replies: list[Any] = conn.retry.call_with_retry(
                lambda: _exchange(conn, commands), lambda _error: conn.disconnect())
        except BaseException as exc:
            # replies may be left unread on it (an interrupt, an error not retried): a
            # connection used again so would answer the next caller with them (a kept one
            # connects again on its next use)
            conn.disconnect()
            if isinstance(exc, TRANSIENT):
                self._relearn()
            raise
        finally:
            if self.conn is None:
                self.pool.release(conn)
        if self.cluster is not None and (moved := next(
                (r for r in replies if isinstance(r, AskError)), None)) is not None:
            # MOVED (an AskError) or ASK: the slot has, or is getting, another master; its
            # commands did not run there. A dropped connection to the caller, whose retry
            # finds the new master (a slot being migrated answers again once it has moved)
            self._relearn()
            raise ConnectionError(f"slot moved: {moved}") from moved
        if raise_on_error and (error := next(
                (r for r in replies if isinstance(r, ResponseError)), None)) is not None:
            raise error
        return replies

    def _relearn(self) -> None:
        if self.cluster is not None:
            relearn(self.cluster)


def relearn(cluster: Any) -> None:
    """After a failover or a move: the cluster's slot table read again, so that the next
    ``slot_master`` is the slot's new master. A table that cannot be read now is left for the
    next try: the caller raises the error that brought it here."""
    with contextlib.suppress(RedisError, RedisClusterException):
        cluster.nodes_manager.initialize()


_kept = threading.local()


class _Kept:
    """A thread's hold on one pooled connection: when the thread ends, its thread-local data
    goes, and with it this hold, which hands the connection back to its pool."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, pool: Any) -> None:
        self.conn = pool.get_connection()
        # the pool weakly: a hold must not keep alive a client that its owner dropped; and
        # not at exit, when the process's connections go anyway
        weakref.finalize(self, _give_back, weakref.ref(pool), self.conn).atexit = False


def _give_back(pool_ref: weakref.ref[Any], conn: Any) -> None:
    pool = pool_ref()
    if pool is not None:
        pool.release(conn)


def own_connection(client: redis.Redis) -> Any:
    """A connection of ``client``'s pool that the calling thread keeps for the rest of its life
    (taken on its first call, given back when the thread ends), for the round trips of its hot
    path (``Batch(client, conn)``). A checkout and release from the pool (its lock, a poll of
    the socket, its metrics) costs a process woken from idle ~0.15 ms a round trip, as much as
    the round trip's own system calls; for the few threads that serve resolves (one per
    process, or one per dramatiq worker thread), one connection each is no cost. A kept
    connection that failed is disconnected and connects again on its next use. On a
    cluster, a connection to one node (``pipeline`` with a key)."""
    kept: weakref.WeakKeyDictionary[Any, _Kept] | None = getattr(_kept, "conns", None)
    if kept is None:
        # by pool, weakly: a test process makes many clients, each of which may go
        kept = _kept.conns = weakref.WeakKeyDictionary()
    pool = client.connection_pool
    hold = kept.get(pool)
    if hold is None:
        hold = kept[pool] = _Kept(pool)
    return hold.conn


def read_group(client: Any, group: str, consumer: str, streams: list[str],
               count: int, block_ms: int) -> Any:
    """``client.xreadgroup(group, consumer, {stream: ">"}, count, block_ms)``, on a single
    Redis on the calling thread's own connection (``own_connection``): for the loops that wait
    on a stream for the next resolve, whose wake-up is on its path. The reply as redis-py's
    ``xreadgroup`` gives it; an error raised as it raises it. On a cluster the same, on the
    master of the streams' slot (all of them must share one): ``slot_master``."""
    pipe = pipeline(client, own=True, key=streams[0])
    pipe.execute_command("XREADGROUP", "GROUP", group, consumer, "COUNT", count,
                         "BLOCK", block_ms, "STREAMS", *streams, *[">"] * len(streams))
    raw, = pipe.execute()
    return pipe.client.response_callbacks["XREADGROUP"](raw)


def slot_master(client: Any, key: str) -> redis.Redis:
    """On a cluster, the plain client of the master that serves ``key``'s slot. A slot the
    client's table lacks (it was read while the slot had no master, mid-failover) makes it read
    the table again before raising: redis-py does that only for a call it routes itself."""
    cluster = cast(Any, client)
    try:
        node = cluster.get_node_from_key(key)
    except SlotNotCoveredError:
        relearn(cluster)
        raise
    return cast(redis.Redis, cluster.get_redis_connection(node))


_PLAIN = (bytes, str, int)


def packed(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """What ``conn.pack_commands(commands)`` gives, in one piece: packed by hiredis at once
    where every argument is bytes, str or int and the command's name one word (every command
    of ours). redis-py's own packer checks and encodes each argument in Python first: ~40 us
    for a take's 57 arguments against ~9 us here, and under load 40% of the resolve worker's
    CPU in its flame graph (docs/benchmarks.md). Anything else (a float, a bool, a memoryview,
    a name of two words) goes through redis-py's packer, which encodes or refuses it as
    before."""
    pieces = []
    for command in commands:
        name = command[0]
        if type(name) is not str or " " in name or not all(type(a) in _PLAIN for a in command):
            return cast(list[bytes], conn.pack_commands(commands))
        pieces.append(hiredis.pack_command(command))
    return [b"".join(pieces)]  # one send, as redis-py joins small commands


def _exchange(conn: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    conn.send_packed_command(packed(conn, commands))
    return read_replies(conn, len(commands))


def read_replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn``, each error in its place, not raised."""
    replies: list[Any] = []
    for _ in range(n):
        try:
            replies.append(conn.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


def pipeline(client: Any, own: bool = False, key: str | None = None) -> Any:
    """A ``Batch`` on a single Redis (``own``: on the calling thread's own connection, see
    ``own_connection``). On a cluster, given ``key``, whose slot every command queued is in:
    a ``Batch`` on that slot's master; without: redis-py's pipeline (no transaction), which
    sends each command to the node of its key, but first asks a server which keys each command
    with movable keys has (COMMAND GETKEYS: every EVALSHA, every XREADGROUP), one round trip
    for each, all to the same node."""
    if not is_cluster(client):
        return Batch(client, own_connection(client) if own else None)
    if key is None:
        return client.pipeline(transaction=False)
    node = slot_master(client, key)
    return Batch(node, own_connection(node) if own else None, cluster=client)


def acked(client: redis.Redis, key: str, build: Callable[[Any], Callable[[list[Any]], T]],
          replicas: int, timeout_ms: int, raise_on_error: bool = True, own: bool = False) -> T:
    """Run the commands ``build`` queues on a pipeline and, with ``replicas`` > 0, ``WAIT`` for
    that many replicas to have them before returning (else ``NotReplicated``). ``build`` returns
    how to read its answer from the pipeline's replies.

    WAIT covers the writes of its own connection, so on a cluster the pipeline goes straight
    to the master of ``key``'s slot over one connection (every command queued must be in that
    slot); a failover in between shows up as a connection error, and the caller's retry finds
    the new master. ``raise_on_error=False``: a command's error is left in its reply, for the
    reader to weigh (some replies matter less than others). ``own``: as for ``pipeline``."""
    if not replicas:
        pipe = pipeline(client, own, key)
        read = build(pipe)
        return read(pipe.execute(raise_on_error=raise_on_error))
    if is_cluster(client):
        node_client: Any = slot_master(client, key)
        try:
            pipe = node_client.pipeline(transaction=False)
            read = build(pipe)
            pipe.execute_command("WAIT", replicas, timeout_ms)
            replies = pipe.execute(raise_on_error=raise_on_error)
        except TRANSIENT:
            relearn(client)  # a dead master: learn the new layout
            raise
        except AskError as exc:  # MOVED too: the slot has a new master; try again there
            relearn(client)
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
