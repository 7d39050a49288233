"""The steps a plan yields. The client's logic (``producers/core.py``, ``producers/staging.py``)
has no I/O: each operation is a generator (a ``Plan``) that validates its input, yields what it
needs from Redis, a ``Batch`` of commands for one pipeline, ``Chunks`` of them, a ``Run`` of one
script or a ``Wait`` on a reply list, gets the answer sent back, and returns the value the
caller sees. The two clients only drive plans, one with redis-py's blocking client, one with
``redis.asyncio``: validation, request building and result building exist once."""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from pending_actions.broker.atomic.scripts import Call, Queued
from pending_actions.broker.failures import translate

T = TypeVar("T")


@dataclass(frozen=True)
class Batch:
    """Commands queued by ``queue(pipe)`` and sent as one pipeline; the driver sends back the
    list of replies."""

    queue: Callable[[Any], object]
    # MULTI/EXEC: Redis runs the batch in one go and, under appendfsync always, syncs its
    # writes to disk once, not once for every 16 KB it reads of a long pipeline
    transaction: bool = False
    # with REPLICA_WAIT: acknowledged once that many replicas of this key's master have it
    # (every command queued then in this key's slot when on a cluster)
    wait_on: str | None = None
    # False: a command's error comes back in its place among the replies, for the plan to
    # weigh (a script Redis does not have is sent again), instead of being raised
    raise_on_error: bool = True


@dataclass(frozen=True)
class Chunks:
    """Batches sent as MULTI/EXEC each, over one connection, the next one sent before the
    previous one's reply is read: Redis runs and syncs one while the client builds and packs
    the next, and serves other clients in between. ``queues[i](pipe)`` queues the i-th, called
    once its turn comes (again if it is sent again after a dropped connection). The driver
    sends back each one's replies, a command's error left in its place. On a cluster (no
    transaction across slots) and with REPLICA_WAIT the driver sends them as ``Batch``es one
    by one, acknowledged on ``wait_on`` as a ``Batch`` is."""

    queues: list[Callable[[Any], object]]
    wait_on: str | None = None


@dataclass(frozen=True)
class Wait:
    """Block on the list ``key`` for up to ``seconds``; the driver sends back its first item,
    or None when the time ran out. ``first`` queues commands that go in the same round trip
    as the first wait (the request that the wait is for); an error of theirs is raised."""

    key: str
    seconds: float
    first: Callable[[Any], object] | None = None


@dataclass(frozen=True)
class Run:
    """One script on its own, sent as EVALSHA (its body only when Redis lacks it); the driver
    sends back its decoded reply. Cheaper than a ``Batch`` of one EVAL, which sends the body."""

    call: Call[Any]


Plan = Generator[Batch | Chunks | Wait | Run, Any, T]


def _noscript(reply: object) -> bool:
    """Whether a pipeline's reply (errors left in place) says Redis lacked the script."""
    return isinstance(reply, redis.exceptions.NoScriptError)


def send_scripts(parts: list[Callable[[], list[Call[Any]]]],
                 wait_on: str | None) -> Plan[list[list[Any]]]:
    """Each part's calls by digest in a MULTI/EXEC (but on a cluster, whose slots it would
    span) each, built when its turn comes (``Chunks``); then, by body, those Redis lacked
    the script for (none ran: sending a stage again is safe anyway, its id stages once).
    Returns each part's calls' decoded replies."""
    built: dict[int, list[Call[Any]]] = {}
    queued: dict[int, list[Queued[Any]]] = {}

    def queue(i: int, pipe: Any) -> None:
        if i not in built:
            built[i] = parts[i]()
        # queued anew when sent again (a dropped connection, REPLICA_WAIT through a failover)
        queued[i] = [c.on(pipe, by_digest=True) for c in built[i]]

    replies = yield Chunks([functools.partial(queue, i) for i in range(len(parts))], wait_on)
    failed = next((r for rs in replies for r in rs
                   if isinstance(r, Exception) and not _noscript(r)), None)
    if failed is not None:
        raise translate(failed) from failed
    missing = [(i, j) for i in range(len(parts)) for j, q in enumerate(queued[i])
               if _noscript(replies[i][q.index])]
    again: dict[tuple[int, int], Any] = {}
    if missing:
        resent: list[Queued[Any]] = []

        def resend(pipe: Any) -> None:
            resent.clear()
            resent.extend(built[i][j].on(pipe) for i, j in missing)

        more = yield Batch(resend, wait_on=wait_on)
        again = {m: q.get(more) for m, q in zip(missing, resent, strict=True)}
    return [[again[(i, j)] if (i, j) in again else q.get(replies[i])
             for j, q in enumerate(queued[i])] for i in range(len(parts))]
