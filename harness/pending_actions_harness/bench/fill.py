"""Bulk state for the scaling and memory figures: staging many actions from one producer with
stage.lua pipelined (the same script, spec model and keys as ``PendingActions.stage``), and
reading what they cost in Redis memory."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from pending_actions.broker.context import Context
from pending_actions.producers import PendingActions
from pending_actions_harness.bench import measure
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.progress import Tick

TOOL = "bench"


def payload_of(size: int) -> dict[str, Any]:
    """A JSON object that serialises (orjson, as stored) to exactly ``size`` bytes."""
    empty = len(orjson.dumps({"data": ""}))
    return {"data": "x" * max(0, size - empty)}


def stage_bulk(pa: PendingActions, sessions: Iterator[str], total: int,
               payload: dict[str, Any], batch: int, tick: Tick,
               ttl: float | None = None) -> float:
    """Stage ``total`` actions, the i-th on the i-th session yielded, ``batch`` per call of the
    public ``PendingActions.stage_many`` (one pipeline each), each with ``ttl`` if given.
    Returns actions per second."""
    extra = {} if ttl is None else {"ttl": ttl}
    done = 0
    start = time.perf_counter()
    while done < total:
        n = min(batch, total - done)
        pa.stage_many({"session": next(sessions), "tool": TOOL, "label": "bench action",
                       "apply": NOOP, "payload": payload, **extra} for _ in range(n))
        done += n
        tick(n)
    return total / (time.perf_counter() - start)


def cycle(names: Sequence[str], each: int) -> Iterator[str]:
    """Each name ``each`` times in a row (deep stacks), round after round if asked again."""
    while True:
        for name in names:
            for _ in range(each):
                yield name


def drop_sessions(ctx: Context, sessions: Sequence[str], batch: int = 1000) -> None:
    """Remove everything the harness staged in these sessions (keeps later figures clean)."""
    k = ctx.keys
    for i in range(0, len(sessions), batch):
        chunk = sessions[i:i + batch]
        pipe = ctx.client.pipeline(transaction=False)
        for s in chunk:
            pipe.unlink(k.stack(s), k.actions(s), k.state(s), k.history(s), k.inflight(s))
            pipe.hdel(k.sessions(k.partition(s)), s)
        pipe.execute()
    # and their entries in the expiry indexes (actions staged with a ttl): "<session>/<id>"
    gone = {s.encode() for s in sessions}
    for p in range(k.partitions):
        index = k.expiries(p)
        members = [m for m, _score in ctx.client.zscan_iter(index, count=1000)
                   if m.rpartition(b"/")[0] in gone]
        for i in range(0, len(members), batch):
            ctx.client.zrem(index, *members[i:i + batch])


def used_memory(client: Any) -> int:
    # Let the pipelines' query buffers and the AOF buffer drain before reading the counter.
    time.sleep(0.2)
    client.ping()
    return int(client.info("memory")["used_memory"])


def memory_per_action(pa: PendingActions, prefix: str, sessions: int, per_session: int,
                      payload: dict[str, Any], tick: Tick,
                      ttl: float | None = None) -> dict[str, Any]:
    """Redis memory per staged action beyond its payload: used_memory before and after staging
    ``sessions * per_session`` actions with a payload of known size (and ``ttl``, which adds
    an entry in the expiry index), then cleaned up."""
    names = [f"{prefix}-{i}" for i in range(sessions)]
    total = sessions * per_session
    payload_bytes = len(orjson.dumps(payload))
    before = used_memory(pa.ctx.client)
    stage_bulk(pa, cycle(names, per_session), total, payload, 1000, tick, ttl)
    after = used_memory(pa.ctx.client)
    drop_sessions(pa.ctx, names)
    per_action = (after - before) / total
    return {"sessions": sessions, "per_session": per_session, "actions": total,
            "payload_bytes": payload_bytes, "used_memory_delta": after - before,
            "per_action": per_action, "beyond_payload": per_action - payload_bytes}


def stock_memory_per_message(stock_broker: Any, client: Any, queue: str, actor: str,
                             total: int, payload: dict[str, Any], tick: Tick) -> dict[str, Any]:
    """The same for stock dramatiq: ``total`` messages carrying the payload as their argument,
    enqueued on a RedisBroker queue nobody consumes (``client``'s db is flushed after)."""
    import dramatiq

    payload_bytes = len(dramatiq.JSONEncoder().encode(payload))
    before = used_memory(client)
    for i in range(total):
        stock_broker.enqueue(dramatiq.Message(queue_name=queue, actor_name=actor,
                                              args=(payload,), kwargs={}, options={}))
        if i % 500 == 499:
            tick(500)
    after = used_memory(client)
    client.flushdb()
    per_message = (after - before) / total
    return {"messages": total, "payload_bytes": payload_bytes,
            "used_memory_delta": after - before, "per_message": per_message,
            "beyond_payload": per_message - payload_bytes}


def loaded_callers(pa: PendingActions, names: Sequence[str], each: int, payload_bytes: int,
                   tick: Tick) -> list[measure.Call]:
    """The callers of a loaded run, one per session of ``names``: ``each`` actions and two
    more staged on each, then two resolves of each untimed (scripts load, connections open),
    every stage and resolve counted on ``tick``. Each caller has ``each`` left to resolve."""
    stage_bulk(pa, cycle(names, each + 2), len(names) * (each + 2), payload_of(payload_bytes),
               1000, tick)
    calls = [measure.resolver(pa, name) for name in names]
    measure.loaded("warm-up", calls, 2, tick)
    return calls
