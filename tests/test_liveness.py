"""Liveness you can see (issue 29 items 6, 11 and "health"): a worker whose Redis connections
are cut over and over recovers, one that has none left ends for its supervisor to restart, a
Redis at its memory limit for longer than a pool's registration lasts never makes workers look
gone, and ``health`` reports a process whose pulse stopped as unhealthy, not as gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pending_actions.broker.errors import RedisFull
from pending_actions.broker.loops import PROC_TTL_MS
from pending_actions.broker.routing import read_live
from pending_actions.procs import ROOT, StreamWatch
from tests.support.faults import FAST, K, cluster
from tests.support.load import (
    Load,
    health,
    others_resolve,
    redis_ms,
    still_healthy,
    wait_healthy,
)
from tests.support.procs import Worker, worker_env
from tests.support.waits import wait_until

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2


def live_until(rc: redis.Redis) -> dict[str, float]:
    """Each live pool member and its expiry, ms (server clock)."""
    got: Any = rc.zrange(K.pool_live, 0, -1, withscores=True)
    return {member.decode(): float(score) for member, score in got}


def test_a_client_kill_storm_under_six_callers_leaves_every_process_serving(
        tmp_path: Path) -> None:
    """CLIENT KILL TYPE normal every 0.2 s for 15 s under 6 callers. Each kill that cut a
    connection carrying early claims used to lose it from the dramatiq process's pool for good:
    past 64, "Too many connections" for ever, its registration expired and every stage was
    refused "no live worker". (The storm of test_hardening, 30 kills in 3 s, stayed under 64.)
    Now: the load runs on, fresh sessions resolve within 20 s, every loop beats, and the
    process that served before the storm is the one registered after it."""
    with cluster(tmp_path) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        [before] = live_until(rc)
        with Load(pa, sessions=6) as load:
            end = time.monotonic() + 15.0
            while time.monotonic() < end:
                rc.client_kill_filter(_type="normal", skipme=True)
                time.sleep(0.2)  # the storm's pace: a fault, not a wait
            fault_ms = redis_ms(rc)
            load.wait_resolved(20)
        others_resolve(pa, rc, n=6, within=20)
        load.check(rc)
        still_healthy(server.url, fault_ms)
        assert list(live_until(rc)) == [before]  # the same process, not a restarted one
        assert live_until(rc)[before] > redis_ms(rc)
        assert workers[0].dramatiq_pids[0] in workers[0].tree()


def next_ready(watch: StreamWatch, within: float) -> int:
    """The pid of the next dramatiq process that says it is ready."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for fields in watch.read(1.0):
            if fields[b"role"] == b"dramatiq" and fields.get(b"event") == b"ready":
                return int(fields[b"pid"])
    raise AssertionError(f"no dramatiq process ready within {within}s")


def test_a_process_left_without_connections_ends_and_is_restarted(tmp_path: Path) -> None:
    """A handler takes every connection of its process's pool and keeps them (a leak). The
    process's loops find none for EXHAUSTED_GIVE_UP_S and it ends; ``worker`` starts dramatiq
    again, whose new process registers and serves."""
    with cluster(tmp_path, workers=0) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        worker = Worker(server.url, "tests.support.starve", overrides=FAST).start()
        watch = StreamWatch(server.url, K.workers)
        try:
            [first] = worker.dramatiq_pids
            pa.stage(session="starved", tool="t", label="L", apply="t.starve")
            done = pa.resolve(session="starved", action="apply", reason="r", timeout=30)
            assert not done.is_error and done.text.startswith("holding "), done.text
            again = next_ready(watch, within=60)  # the process ends within ~20 s
            assert again != first and again in worker.tree() and first not in worker.tree()
            others_resolve(pa, rc, within=20)
            assert read_live(rc, K).has("t.starve")
            # it never said it stops, but its supervisor restarted it: no longer news
            wait_healthy(server.url)
        finally:
            watch.close()
            worker.kill()


def fill(rc: redis.Redis) -> None:
    """Past maxmemory (noeviction): every write that may grow memory is refused."""
    for n in range(40):
        rc.set(f"junk:{n}", b"x" * 50_000)
    rc.config_set("maxmemory", int(rc.info("memory")["used_memory"]) - 1_000_000)


def test_full_for_longer_than_a_registration_lasts(tmp_path: Path) -> None:
    """Redis full for three times POOL_TTL_MS: the pools stay live all along (register.lua
    runs while full), so a stage is told "Redis is full" while it is, and goes through the
    moment memory is back, its resolve applied."""
    with cluster(tmp_path, pool_ttl_ms="1000") as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        pa.stage(session="before", tool="t", label="L", apply="t.idem")
        fill(rc)
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            try:
                pa.stage(session="during", tool="t", label="L", apply="t.idem")
                raise AssertionError("a stage went through while Redis was full")
            except RedisFull:
                pass
            assert read_live(rc, K).has("t.idem")
            time.sleep(0.2)  # a caller trying again, not a wait on an event
        rc.delete(*(f"junk:{n}" for n in range(40)))
        staged = pa.stage(session="after", tool="t", label="L", apply="t.idem")
        done = pa.resolve(session="after", action="apply", reason="r", timeout=20)
        assert not done.is_error and done.details["label"] == "L", done.text
        assert pa.history("after")[0]["id"] == staged


def rows_of(url: str, pid: int) -> list[dict[str, Any]]:
    """``health``'s rows of the process ``pid`` (its name holds its pid)."""
    got = health(url)
    return [r for r in orjson.loads(got.stdout)["loops"] if r["process"].split(":")[1] == str(pid)]


def test_health_reports_a_process_whose_pulse_stopped_as_stopped(tmp_path: Path) -> None:
    """Of two workers, one hangs (SIGSTOP): ``health`` exits 1 and lists it STOPPED, not
    gone; it comes back (SIGCONT) and health is 0 again. Then it is SIGKILLed: stopped, and
    its beats kept for PROC_TTL_MS only, after which it is gone."""
    with cluster(tmp_path, workers=2) as (server, workers, _pa):
        rc = redis.Redis.from_url(server.url)
        wait_healthy(server.url)
        doomed = workers[1]
        os.kill(doomed.pid, signal.SIGSTOP)
        try:
            # a CLI: polled, no event to await. Its own rows, not the exit code: a loop beating
            # faster than the pulse (recover, every 2.3 s) reads LATE before the pulse's 3 s run
            # out, and only then is the process stopped
            wait_until(lambda: any(r["state"] == "stopped"
                                   for r in rows_of(server.url, doomed.pid)),
                       20, "health seeing the hung process", interval_s=0.5)
            text = subprocess.run([sys.executable, "-m", "pending_actions", "health"],
                                  env=worker_env(server.url), cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
            assert text.returncode == 1 and "STOPPED" in text.stdout, text.stdout
            stopped = rows_of(server.url, doomed.pid)
            assert stopped and all(r["state"] == "stopped" and not r["ok"] for r in stopped)
            assert all(r["state"] == "live" for r in rows_of(server.url, workers[0].pid))
        finally:
            os.kill(doomed.pid, signal.SIGCONT)
        wait_healthy(server.url)
        os.kill(doomed.pid, signal.SIGKILL)
        [name] = {r["process"] for r in rows_of(server.url, doomed.pid)}
        wait_until(lambda: rows_of(server.url, doomed.pid)[0]["state"] == "stopped", 20,
                   "health listing the killed process as stopped", interval_s=0.5)
        assert health(server.url).returncode == 1
        assert 0 < rc.pttl(K.beats(name)) <= PROC_TTL_MS


def test_health_counts_a_cleanly_stopped_worker_as_gone(tmp_path: Path) -> None:
    """SIGTERM (a service manager's stop): the worker and its dramatiq processes say they
    stop; ``health`` lists none of them and, another worker live, exits 0."""
    with cluster(tmp_path, workers=2) as (server, workers, _pa):
        wait_healthy(server.url)
        stopping = workers[1]
        tree = stopping.tree()
        assert stopping.stop(30) == 0
        got = health(server.url)
        assert got.returncode == 0, got.stdout + got.stderr
        shown = {int(r["process"].split(":")[1]) for r in orjson.loads(got.stdout)["loops"]}
        assert shown and not shown & set(tree)
