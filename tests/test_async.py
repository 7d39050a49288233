"""AsyncPendingActions and ``async def`` handlers, against the real worker processes: the event
loop stays free while resolves wait, and async handlers are awaited on the worker's loop."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import redis
from redis.asyncio.connection import Connection as AsyncConnection

from pending_actions import AsyncPendingActions, InvalidInput
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.conftest import Deployment
from tests.support.runs import runs

CONCURRENT = 20
TICK_S = 0.010
MAX_LATE_S = 0.200


async def _ticker(stop: asyncio.Event, ticking: asyncio.Event, lateness: list[float]) -> None:
    """Sleeps 10 ms at a time and records how late each wake-up is; sets ``ticking`` after
    its first."""
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lateness.append(time.perf_counter() - start - TICK_S)
        ticking.set()


def test_twenty_concurrent_resolves_never_hold_up_the_loop(
        redis_server: EmbeddedRedis, pa: PendingActions, rc: redis.Redis) -> None:
    sessions = [f"aio-{os.getpid()}-{i}-{time.monotonic_ns()}" for i in range(CONCURRENT)]

    async def main() -> tuple[list[float], list[object], float]:
        async with AsyncPendingActions.from_url(redis_server.url, resolve_timeout_s=60) as apa:
            ids = [await apa.stage(session=s, tool="edit", label=f"slow {i}", apply="t.async",
                                   payload={"sleep": 0.3})
                   for i, s in enumerate(sessions)]
            stop, ticking, lateness = asyncio.Event(), asyncio.Event(), list[float]()
            ticker = asyncio.create_task(_ticker(stop, ticking, lateness))
            await ticking.wait()  # the ticker is running before the load starts
            started = time.perf_counter()
            results = await asyncio.gather(*(
                apa.resolve(session=s, action="apply", reason="go", expect_id=i)
                for s, i in zip(sessions, ids, strict=True)))
            took = time.perf_counter() - started
            stop.set()
            await ticker
            return lateness, list(results), took

    lateness, results, took = asyncio.run(main())
    ordered = sorted(lateness)
    worst, p99 = ordered[-1], ordered[int(len(ordered) * 0.99)]
    print(f"\n{CONCURRENT} concurrent resolves ({took:.2f}s, 8 handler threads, 0.3 s each): "
          f"{len(lateness)} ticks, ticker lateness max {worst * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms")
    assert worst < MAX_LATE_S
    # the resolves overlapped: 20 x 0.3 s on 8 threads is ~0.9 s, one after another 6 s
    assert took < CONCURRENT * 0.3 / 2
    for session, result in zip(sessions, results, strict=True):
        assert not result.is_error, result  # type: ignore[attr-defined]
        assert len(runs(rc, session)) == 1


def test_async_client_has_the_same_methods(redis_server: EmbeddedRedis, pa: PendingActions,
                                           session: str) -> None:
    public = {n for n in dir(PendingActions) if not n.startswith("_")} - {"client", "ctx"}
    assert public <= set(dir(AsyncPendingActions))

    async def main() -> None:
        apa = AsyncPendingActions.from_url(redis_server.url)
        try:
            with pytest.raises(InvalidInput) as err:
                await apa.resolve(session=session, action="commit", reason="r")
            assert err.value.field == "action"
            action_id = await apa.stage(session=session, tool="edit", label="L", apply="t.ok")
            assert (await apa.next_tool_choice(session))["id"] == action_id  # type: ignore[index]
            assert [a.id for a in await apa.pending(session)] == [action_id]
            assert pa.pending(session)[0].id == action_id  # the same state as the sync client
            directive = await apa.set_directive(session, tool="plan", label="P", apply="t.ok")
            assert (await apa.show(session, directive)) is not None
            res = await apa.resolve(session=session, action="apply", reason="r")
            assert res.details["label"] == "P"
            res = await apa.resolve(session=session, action="discard", reason="no")
            assert res.text == "Discarded: L. Reason: no"
            assert [e["event"] for e in await apa.history(session)][-1] == "discarded"
            assert "t.ok" in (await apa.stats())["handlers"]
        finally:
            await apa.close()

    asyncio.run(main())


def test_async_handlers_are_awaited(pa: PendingActions, rc: redis.Redis, session: str) -> None:
    first = pa.stage(session=session, tool="edit", label="A", apply="t.async",
                     payload={"sleep": 0.01})
    res = pa.resolve(session=session, action="apply", reason="r")
    assert (res.is_error, res.text) == (False, f"async {first}")
    assert res.details["sourceResultDetails"]["loop"]
    # a raised ToolError from an async handler keeps the action pending as usual
    second = pa.stage(session=session, tool="edit", label="B", apply="t.async_toolerror")
    res = pa.resolve(session=session, action="apply", reason="r")
    assert (res.is_error, res.text) == (True, "async refused")
    assert [(a.id, a.attempts) for a in pa.pending(session)] == [(second, 1)]
    assert [r["handler"] for r in runs(rc, session)] == ["t.async", "t.async_toolerror"]


def test_one_loop_per_worker_thread(pa: PendingActions, session: str) -> None:
    """The same thread reuses its loop: over many runs, each thread id maps to one loop."""
    loops: dict[int, set[int]] = {}
    for _ in range(12):
        pa.stage(session=session, tool="edit", label="A", apply="t.async")
        seen = pa.resolve(session=session, action="apply", reason="r").details[
            "sourceResultDetails"]
        loops.setdefault(seen["thread"], set()).add(seen["loop"])
    assert all(len(ids) == 1 for ids in loops.values()), loops


def test_on_a_cluster_a_request_and_its_first_wait_go_together_and_a_stale_table_heals(
        clustered: Deployment, session: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster, as on one Redis, a resolve's request and the first wait for its reply
    leave in one write to the slot's master (redis-py's asyncio cluster pipeline cannot block:
    the wait would be a round trip of its own). A slot table gone stale (as after a failover:
    the request sent to another master, which answers MOVED) is read again, and the request
    sent again to the slot's master."""
    writes: list[bytes] = []
    real = AsyncConnection.send_packed_command

    async def spy(self: AsyncConnection, command: Any, check_health: bool = True) -> None:
        parts = command if isinstance(command, list) else [command]
        writes.append(b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts))
        await real(self, command, check_health)

    keys = clustered.pa.ctx.keys
    requests = keys.requests(keys.partition(session))

    async def main() -> tuple[list[str], list[Any], bool]:
        async with AsyncPendingActions.from_url(clustered.url, resolve_timeout_s=30) as apa:
            cluster: Any = apa.client
            first = await apa.stage(session=session, tool="edit", label="A", apply="t.ok")
            with monkeypatch.context() as m:
                m.setattr(AsyncConnection, "send_packed_command", spy)
                applied = await apa.resolve(session=session, action="apply", reason="r")
            second = await apa.stage(session=session, tool="edit", label="B", apply="t.ok")
            right = cluster.get_node_from_key(requests)
            wrong = next(n for n in cluster.get_primaries() if n is not right)
            cluster.nodes_manager.slots_cache[cluster.keyslot(requests)] = [wrong]
            discarded = await apa.resolve(session=session, action="discard", reason="moved")
            return [first, second], [applied, discarded], (
                cluster.get_node_from_key(requests) is right)

    ids, results, relearned = asyncio.run(main())
    assert [r.is_error for r in results] == [False, False], results
    request = next(w for w in writes if b"XADD" in w)  # (a health check's PING may go first)
    assert b"BLPOP" in request, request[:200]
    assert relearned
    ended = [(e["event"], e.get("id")) for e in clustered.pa.history(session)
             if e["event"] in ("applied", "discarded")]
    assert ended == [("applied", ids[0]), ("discarded", ids[1])]
