"""``roundtrips.Batch``, the pipeline of the hot paths, against a real redis-server: replies in
order with each error in its place, a dropped connection retried by the client's Retry, and a
connection with replies left unread never handed to the next caller; on a real cluster, sent to
the master of its slot, a MOVED raised as a dropped connection."""

from __future__ import annotations

import gc
import threading
import time
import uuid
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pending_actions.broker.connection import worker_client
from pending_actions.broker.connection_pool import PoolExhausted
from pending_actions.broker.roundtrips import Batch, own_connection, packed, pipeline, slot_master
from pending_actions.embedded import EmbeddedRedis
from tests.conftest import Deployment
from tests.support.waits import wait_until


def _key() -> str:
    return f"test:batch:{uuid.uuid4().hex}"


def test_replies_in_order_with_errors_in_place(redis_server: EmbeddedRedis) -> None:
    client = worker_client(redis_server.url)
    key = _key()
    batch = Batch(client)
    batch.execute_command("SET", key, "v")
    batch.execute_command("INCR", key)  # not an integer: an error, and the next still runs
    batch.execute_command("GET", key)
    assert len(batch) == 3
    ok, error, value = batch.execute(raise_on_error=False)
    assert ok in (b"OK", "OK") and value == b"v"
    assert isinstance(error, redis.ResponseError) and "not an integer" in str(error)
    assert len(batch) == 0  # emptied for the next use

    batch.execute_command("INCR", key)
    batch.execute_command("SET", key, "w")
    with pytest.raises(redis.ResponseError):
        batch.execute()
    assert client.get(key) == b"w"  # the command after the error ran all the same


def test_commands_are_packed_as_redis_py_packs_them(redis_server: EmbeddedRedis) -> None:
    """``packed`` sends the bytes redis-py's packer would, for every kind of argument: at once
    for bytes, str and int, through redis-py's for the rest (which encodes a float as it does,
    and refuses a bool or None as it does); and what it sends, Redis runs."""
    client = worker_client(redis_server.url)
    conn: Any = client.connection_pool.get_connection()  # redis-py's Connection is untyped
    key = _key()
    try:
        commands: list[tuple[Any, ...]] = [
            ("SET", key, "vé"), ("EVAL", "return ARGV", 0, b"\x00\xff", -5, 2**70, "", b""),
            ("SET", key, 1.5), ("SET", key, memoryview(b"m")), ("CLIENT LIST",),
            ("ECHO", bytearray(b"b"))]
        for i in range(len(commands)):
            for batch in ([commands[i]], commands[:i + 1]):
                assert b"".join(packed(conn, batch)) == b"".join(conn.pack_commands(batch))
        for bad in (True, None, object()):
            with pytest.raises(redis.DataError):
                packed(conn, [("SET", key, bad)])
        conn.send_packed_command(packed(conn, commands[:2]))
        assert conn.read_response() == b"OK"
        assert conn.read_response() == [b"\x00\xff", b"-5", str(2**70).encode(), b"", b""]
        assert client.get(key) == "vé".encode()
    finally:
        client.connection_pool.release(conn)
        client.close()


def test_a_killed_connection_is_retried(redis_server: EmbeddedRedis) -> None:
    client = worker_client(redis_server.url, max_connections=1)
    key = _key()
    client.set(key, 1)
    own = client.client_id()  # the pool's one connection
    killer = redis.Redis.from_url(redis_server.url)
    assert killer.client_kill_filter(_id=str(own)) == 1
    batch = Batch(client)
    batch.execute_command("INCR", key)
    assert batch.execute() == [2]  # sent again on a new connection, once
    assert client.client_id() != own


def test_unread_replies_never_reach_the_next_caller(redis_server: EmbeddedRedis) -> None:
    # a read that times out leaves the BLPOP's reply owed on that connection: it must be
    # dropped, not put back in the pool as it is, or the next command would read that reply as
    # its own. The client retries nothing (no Retry cleanup): the failed read and Batch drop
    # it, and the pool's one connection serves the next batch afresh.
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.3, max_connections=1,
                                  retry=Retry(NoBackoff(), 0, supported_errors=()))
    key = _key()
    batch = Batch(client)
    batch.execute_command("BLPOP", key, 2)
    with pytest.raises(redis.TimeoutError):
        batch.execute()
    redis.Redis.from_url(redis_server.url).rpush(key, "x")
    batch.execute_command("PING")
    assert batch.execute() in ([b"PONG"], ["PONG"], [True])
    assert client.llen(key) == 1  # the abandoned BLPOP took nothing: its connection is gone


def test_a_thread_that_ends_gives_its_kept_connection_back(redis_server: EmbeddedRedis) -> None:
    """A serving thread keeps one connection for its life (own_connection); when it ends, the
    pool has it back to hand out, rather than counting it in use for ever."""
    client = worker_client(redis_server.url)
    pool: Any = client.connection_pool
    kept: list[Any] = []

    def serve() -> None:
        conn = own_connection(client)
        assert own_connection(client) is conn  # kept: the same one at every call
        batch = Batch(client, conn)
        batch.execute_command("PING")
        batch.execute()
        kept.append(conn)

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()
    gc.collect()  # the thread's local data may wait for a collection on other Pythons
    assert kept and kept[0] not in pool._in_use_connections
    assert kept[0] in pool._available_connections
    assert pool.get_connection() is kept[0]  # handed out again, still connected


def test_a_workers_pool_waits_for_a_connection_then_says_it_has_none(
        redis_server: EmbeddedRedis) -> None:
    """A worker's pool is bounded: a checkout while every connection is out waits for one to
    come back and gets it; past its wait, PoolExhausted (never a connection past the bound)."""
    client = worker_client(redis_server.url, max_connections=2)
    pool: Any = client.connection_pool
    held = [pool.get_connection(), pool.get_connection()]
    waited: list[Any] = []
    waiter = threading.Thread(target=lambda: waited.append(pool.get_connection()))
    waiter.start()
    # until the waiter waits (the pool's own condition)
    wait_until(lambda: bool(pool._freed._waiters), 10, "the waiter waiting", interval_s=0.001)
    back = held.pop()
    pool.release(back)
    waiter.join(5)
    assert waited == [back]
    pool.timeout = 0.3
    started = time.monotonic()
    with pytest.raises(PoolExhausted):
        pool.get_connection()
    assert time.monotonic() - started >= 0.3
    assert pool._created_connections == 2


def test_on_a_cluster_a_batch_goes_to_its_slots_master_and_a_move_is_a_dropped_connection(
        clustered: Deployment) -> None:
    """On a cluster, ``pipeline(client, key=...)`` is a Batch on the master of the key's slot;
    a MOVED reply (here: the same commands sent to another master, as after a failover) is
    raised as a dropped connection, which every caller retries, not left as a reply."""
    client: Any = clustered.pa.ctx.client
    key = "test:batch:{moved}"
    right = slot_master(client, key)
    batch = pipeline(client, key=key)
    assert isinstance(batch, Batch) and batch.client is right
    batch.execute_command("SET", key, "v")
    batch.execute_command("GET", key)
    assert batch.execute() == [b"OK", b"v"]

    wrong = next(c for c in (client.get_redis_connection(n) for n in client.get_primaries())
                 if c is not right)
    moved = Batch(wrong, cluster=client)
    moved.execute_command("GET", key)
    with pytest.raises(redis.ConnectionError, match="slot moved"):
        moved.execute(raise_on_error=False)
    again = pipeline(client, key=key)
    again.execute_command("GET", key)
    again.execute_command("DEL", key)
    assert again.execute() == [b"v", 1]
