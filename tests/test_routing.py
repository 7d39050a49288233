"""Routing by handler (a mixed fleet): a task reaches only a worker that has its handler; a
worker's handlers live only while it does; a handler that went away is refused at stage and
fails a pending action's resolve at once, leaving it pending."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pending_actions.broker.errors import UnknownHandler
from pending_actions.broker.routing import read_live
from pending_actions.producers import PendingActions
from tests.support.faults import K, cluster, events
from tests.support.procs import Worker
from tests.support.replies import byte_list
from tests.support.waits import wait_until


def test_two_fleets_with_disjoint_handlers_and_one_that_goes_away(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        a = Worker(server.url, handlers="tests.support.mix_a").start()
        b = Worker(server.url, handlers="tests.support.mix_b").start()
        workers += [a, b]
        rc = pa.client
        assert len(read_live(rc, K).pools) == 2
        sessions = [f"mix-{i}" for i in range(200)]
        wanted = {}
        for i, s in enumerate(sessions):
            name = "mix.a" if i % 2 else "mix.b"
            wanted[s] = (name[-1], pa.stage(session=s, tool="t", label="l", apply=name))
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(
                lambda s: pa.resolve(session=s, action="apply", reason="r"), sessions))
        failed = [r.text for r in results if r.is_error]
        assert failed == []
        ran = {s: [x.decode() for x in byte_list(rc.lrange(f"test:mix:{s}", 0, -1))]
               for s in sessions}
        misrouted = [s for s in sessions if ran[s] != [f"{wanted[s][0]}:{wanted[s][1]}"]]
        assert misrouted == []

        # an action of B's staged while B lives, then B dies without a word (SIGKILL)
        kept = pa.stage(session="orphan", tool="t", label="l", apply="mix.b")
        b.kill()
        gone_at = time.monotonic()
        def refused() -> UnknownHandler | None:  # at stage once B's registration expired
            try:
                pa.stage(session="late", tool="t", label="l", apply="mix.b")
            except UnknownHandler as exc:
                return exc
            return None

        assert wait_until(refused, 30, "a dead worker's handler refused at stage",
                          interval_s=0.2).name == "mix.b"
        refused_after = time.monotonic() - gone_at
        assert refused_after < 30
        started = time.monotonic()
        res = pa.resolve(session="orphan", action="apply", reason="r", timeout=20)
        assert res.is_error and "no live worker has its handler 'mix.b'" in res.text, res.text
        assert time.monotonic() - started < 5
        [still] = pa.pending("orphan")
        assert (still.id, still.state, still.attempts) == (kept, "pending", 0)
        assert "taken" not in events(rc, "orphan")  # never taken, so never re-dispatched
        # A still serves its own
        pa.stage(session="mix-a-again", tool="t", label="l", apply="mix.a")
        assert not pa.resolve(session="mix-a-again", action="apply", reason="r").is_error


def test_a_clean_stop_removes_the_workers_handlers_at_once(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        b = Worker(server.url, handlers="tests.support.mix_b").start()
        workers.append(b)
        pa.stage(session="s", tool="t", label="l", apply="mix.b")
        assert b.stop() == 0
        # a client of its own, whose view of the live workers is read now (``pa``'s stages
        # trust theirs for up to LIVE_MAX_AGE_S, which a quick stop can fall inside)
        fresh = PendingActions.from_url(server.url)
        try:
            with pytest.raises(UnknownHandler):
                fresh.stage(session="s", tool="t", label="l", apply="mix.b")
        finally:
            fresh.close()
