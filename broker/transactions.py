"""Transactions sent back to back: each of a list of pipelines' commands as one MULTI/EXEC, all
sent over one connection before their replies are read, so that Redis runs (and, under
``appendfsync always``, syncs) one while the client builds the next. A stage batch's chunks go
this way (``producers/plans.Chunks``); each stays its own transaction, so Redis serves other
clients between them. Single server only: a cluster's slots would split a transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis
import redis.asyncio
from redis.exceptions import ResponseError

from pending_actions.broker.roundtrips import read_replies

Queue = Callable[[Any], object]


def transactions(client: redis.Redis, queues: Sequence[Queue]) -> list[list[Any]]:
    """The commands each of ``queues`` queues on a pipeline, a MULTI/EXEC each. Returns each
    one's replies, a command's error in its place (a transaction Redis refused whole: that
    error for each). A dropped connection sends again those whose replies were not read, as
    the client's retry would a pipeline."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    done: list[list[Any]] = []
    try:
        conn.retry.call_with_retry(lambda: _send_and_read(client, conn, queues, done),
                                   lambda _error: conn.disconnect())
        return done
    finally:
        pool.release(conn)


async def transactions_async(client: redis.asyncio.Redis,
                             queues: Sequence[Queue]) -> list[list[Any]]:
    """``transactions`` over ``redis.asyncio``."""
    pool: Any = client.connection_pool
    conn: Any = await pool.get_connection()
    done: list[list[Any]] = []

    async def attempt() -> None:
        await _send_and_read_async(client, conn, queues, done)

    async def fail(_error: Exception) -> None:
        await conn.disconnect()

    try:
        await conn.retry.call_with_retry(attempt, fail)
        return done
    finally:
        await pool.release(conn)


def _send_and_read(client: redis.Redis, conn: Any, queues: Sequence[Queue],
                   done: list[list[Any]]) -> None:
    """Send those of ``queues`` that ``done`` has no replies for, and read theirs into it."""
    try:
        stacks = []
        for i, queue in enumerate(queues[len(done):]):
            stack = _stack(client, queue)
            stacks.append(stack)
            # a health check (PING) once replies are due would read one of those instead
            conn.send_packed_command([_packed(stack)], check_health=i == 0)
        for stack in stacks:
            # MULTI's, each command's QUEUED, EXEC's
            raw = read_replies(conn, len(stack) + 2)
            done.append(_replies(client.response_callbacks, stack, raw))
    except BaseException:
        conn.disconnect()  # replies left unread would be taken for the next command's
        raise


async def _send_and_read_async(client: redis.asyncio.Redis, conn: Any, queues: Sequence[Queue],
                               done: list[list[Any]]) -> None:
    try:
        stacks = []
        for i, queue in enumerate(queues[len(done):]):
            stack = _stack(client, queue)
            stacks.append(stack)
            await conn.send_packed_command([_packed(stack)], check_health=i == 0)
        for stack in stacks:
            raw = []
            for _ in range(len(stack) + 2):
                try:
                    raw.append(await conn.read_response())
                except ResponseError as exc:
                    raw.append(exc)
            done.append(_replies(client.response_callbacks, stack, raw))
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


def _stack(client: Any, queue: Queue) -> list[Any]:
    pipe = client.pipeline(transaction=True)  # only collects the commands
    queue(pipe)
    return list(pipe.command_stack)


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


def _replies(callbacks: Any, stack: list[Any], raw: list[Any]) -> list[Any]:
    """A MULTI/EXEC's replies from Redis's answers to MULTI, to each command (QUEUED, or its
    refusal before it ran) and to EXEC, as redis-py's transaction pipeline makes them."""
    errors = [(i - 1, r) for i, r in enumerate(raw[:-1]) if isinstance(r, Exception)]
    if isinstance(raw[-1], Exception):  # EXECABORT: none ran
        return [errors[0][1] if errors else raw[-1]] * len(stack)
    replies = list(raw[-1])
    for i, error in errors:
        if i >= 0:
            replies.insert(i, error)
    out = []
    for reply, (args, options) in zip(replies, stack, strict=True):
        if not isinstance(reply, Exception) and args[0] in callbacks:
            options = {k: v for k, v in options.items() if k != "keys"}
            reply = callbacks[args[0]](reply, **options)
        out.append(reply)
    return out
