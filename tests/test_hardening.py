"""Issue 13 faults, each with real worker processes and a real Redis: global keys deleted under
load, CLIENT KILL storms, SCRIPT FLUSH, a corrupt session, Redis full then freed, a worker
clock two minutes off either way. After each: every other session resolves within 20 s,
nothing staged is lost, nothing is applied twice, and every loop still beats (``health``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pending_actions.broker.errors import RedisFull, Unowned
from pending_actions.broker.routing import heartbeat
from pending_actions.procs import ROOT
from pending_actions_harness.supervise import WorkerProcess
from tests.support.faults import FAST, K, cluster
from tests.support.load import (
    Load,
    effects,
    gated,
    others_resolve,
    pool,
    redis_ms,
    still_healthy,
    wait_healthy,
)
from tests.support.procs import TEST_ENV, worker_env
from tests.support.replies import byte_list, entries
from tests.support.waits import wait_until

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2


def test_global_keys_deleted_under_load(tmp_path: Path) -> None:
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        wait_healthy(server.url)
        with Load(pa) as load:
            load.wait_resolved(20)
            # every partition's request stream, task streams and sessions hash: not its lease
            # index, which a lease and its entry share a script to write (see below)
            for p in range(K.partitions):
                tasks = list(rc.scan_iter(match=K.task_queue(p, "*"), _type="stream"))
                rc.delete(K.requests(p), K.sessions(p), *tasks)
            rc.delete(K.workers, K.beat_procs)
            fault_ms = redis_ms(rc)
            # the owner records went with the sessions hashes: a stage into a session that has
            # keys but no record is refused (no tenant may take it over) until an operator
            # restores the records from the sessions' own keys
            with pytest.raises(Unowned):
                pa.stage(session=load.sessions[0], tool="t", label="L", apply="t.idem")
            mended = subprocess.run(
                [sys.executable, "-m", "pending_actions", "--json", "repair", "--tenant",
                 "default"], env=worker_env(server.url), cwd=ROOT, capture_output=True,
                text=True, timeout=60)
            assert mended.returncode == 0, mended.stdout + mended.stderr
            restored = {r["session"] for r in orjson.loads(mended.stdout)
                        if r["outcome"] == "restored"}
            assert set(load.sessions) <= restored
            load.wait_resolved(20)  # the load runs on without the rest
        others_resolve(pa, rc)
        load.check(rc)
        still_healthy(server.url, fault_ms)


def test_lease_index_and_sessions_deleted_then_worker_killed(tmp_path: Path) -> None:
    """The lease index and the sessions set deleted while a handler runs, then its process
    killed. No sweep: every script that keeps a lease keeps its index entry, so the running
    attempt's next renewal (renew.lua) writes the entry back, and once its process is killed
    the lease is recovered as usual."""
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        with gated(pa, rc, "lost"):
            pid = int(orjson.loads(byte_list(rc.lrange("test:runs:lost", -1, -1))[0])["pid"])
            index = K.leases(K.partition("lost"))
            rc.delete(index, K.sessions(K.partition("lost")))
            wait_until(lambda: rc.zcard(index), 20,  # the renewal writes it back
                       "the renewal indexing its lease")
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not rc.hlen(K.inflight("lost")), 20, "the lease recovered",
                       interval_s=0.2)
        assert [a.label for a in pa.pending("lost")] == ["gated"]
        others_resolve(pa, rc)
        wait_healthy(server.url)


def test_client_kill_storm_and_script_flush(tmp_path: Path) -> None:
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        with Load(pa) as load:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                rc.client_kill_filter(_type="normal", skipme=True)
                rc.script_flush()
                time.sleep(0.1)  # the storm's pace: a fault of 3 s, not a wait
            fault_ms = redis_ms(rc)
            load.wait_resolved(20)  # the load runs on after it
        others_resolve(pa, rc)
        load.check(rc)
        still_healthy(server.url, fault_ms)


def test_take_by_digest_after_script_flush(tmp_path: Path) -> None:
    """The resolve worker sends take.lua by its digest, the dramatiq worker begin and finalize;
    a Redis that lost its scripts answers NOSCRIPT, and each is sent again once loaded: the
    action served once, its request acked."""
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        first = pa.stage(session="flush", tool="t", label="one", apply="t.idem")
        assert not pa.resolve(session="flush", action="apply", reason="r").is_error
        second = pa.stage(session="flush", tool="t", label="two", apply="t.idem")
        rc.script_flush()
        done = pa.resolve(session="flush", action="apply", reason="r", timeout=20)
        assert not done.is_error, done.text
        assert effects(rc, "flush") == [first, second]
        stream = K.requests(K.partition("flush"))
        assert rc.xpending(stream, "resolvers")["pending"] == 0 and rc.xlen(stream) == 0


CORRUPT: dict[str, Callable[[redis.Redis, str, str], object]] = {
    "spec": lambda rc, s, i: rc.hset(K.actions(s), i, b"{not json\xff"),
    "spec-shape": lambda rc, s, i: rc.hset(K.actions(s), i, b'{"id": 5}'),
    "state": lambda rc, s, i: rc.hset(K.state(s), i, b"\x00garbage"),
    "stack": lambda rc, s, i: (rc.delete(K.stack(s)), rc.hset(K.stack(s), "x", "y")),
    "history": lambda rc, s, i: (rc.delete(K.history(s)), rc.set(K.history(s), "junk")),
}


@pytest.mark.parametrize("field", sorted(CORRUPT))
def test_corrupt_field_of_one_session(tmp_path: Path, field: str) -> None:
    """The corrupt session's resolve is answered with an error (nothing hangs, nothing half
    done); a record that does not parse is parked with its raw bytes; every loop lives."""
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        below = pa.stage(session="bad", tool="t", label="below", apply="t.idem")
        head = pa.stage(session="bad", tool="t", label="head", apply="t.idem")
        CORRUPT[field](rc, "bad", head)
        result = pa.resolve(session="bad", action="apply", reason="r", timeout=20)
        assert result.is_error, result.text
        others_resolve(pa, rc)
        wait_healthy(server.url)
        dead = [orjson.loads(x) for x in byte_list(rc.lrange(K.dead("bad"), 0, -1))]
        if field in ("spec", "spec-shape", "state"):
            assert "moved to the session's dead letters" in result.text
            assert [d["field"] for d in dead] == [head]  # the raw bytes kept, with the reason
            assert dead[0]["raw"]
        if field in ("spec", "spec-shape", "state"):
            # the action under it is served next, the parked one never: parked is its one
            # outcome (with unreadable counters too, kept raw beside its spec), not pending
            assert [a.id for a in pa.pending("bad")] == [below]
            again = pa.resolve(session="bad", action="apply", reason="r", timeout=20)
            assert not again.is_error, again.text
            assert effects(rc, "bad") == [below]
        if field == "state":
            assert dead[0]["raw"] == "\x00garbage" and dead[0]["spec"]["label"] == "head"
        if field in ("stack", "history"):  # a key of another type: refused, nothing changed
            assert "type" in result.text
            assert rc.hlen(K.actions("bad")) == 2 and not rc.hlen(K.inflight("bad"))


def test_corrupt_lease_is_parked_and_its_action_returns(tmp_path: Path) -> None:
    with cluster(tmp_path) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        with gated(pa, rc, "bad") as token:
            rc.hset(K.inflight("bad"), token, b"[1, 2")
            # the renewer stops renewing it, recovery parks it once due, and the action
            # goes back on the stack (its handler may still finish: fenced, late-refused)
            wait_until(lambda: rc.llen(K.dead("bad")), 20, "the corrupt lease parked",
                       interval_s=0.2)
        [parked] = [orjson.loads(x) for x in byte_list(rc.lrange(K.dead("bad"), 0, -1))]
        assert parked["poison"] == "lease" and parked["raw"] == "[1, 2"
        assert [a.label for a in pa.pending("bad")] == ["gated"]
        others_resolve(pa, rc)
        wait_healthy(server.url)


def test_ls_skips_an_unreadable_spec(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        heartbeat(rc, K, "p", ["t.idem"], "by-hand", 60_000)  # t.idem live, no worker
        ok = pa.stage(session="s", tool="t", label="ok", apply="t.idem")
        bad = pa.stage(session="s", tool="t", label="bad", apply="t.idem")
        rc.hset(K.actions("s"), bad, "nope")
        assert [a.id for a in pa.pending("s")] == [ok]
        # a spec from a newer producer, with a field this version does not know, is served
        newer = pa.stage(session="s", tool="t", label="newer", apply="t.idem")
        spec = orjson.loads(rc.hget(K.actions("s"), newer) or b"")
        rc.hset(K.actions("s"), newer, orjson.dumps({**spec, "from_the_future": 1}))
        assert [a.id for a in pa.pending("s")] == [newer, ok]


def fill(rc: redis.Redis) -> None:
    """Write 4 MB of junk, then set maxmemory 2 MB below what is used: Redis refuses every
    write that may grow memory until the junk is deleted."""
    for n in range(80):
        rc.set(f"junk:{n}", b"x" * 50_000)
    rc.config_set("maxmemory", int(rc.info("memory")["used_memory"]) - 2_000_000)


def refused_scripts(rc: redis.Redis) -> int:
    """Script calls Redis refused: Redis 7 refuses one for memory before it runs (our flags:
    rejected), 6.2, which reads no flags, at its first write that may grow memory (failed)."""
    stats = rc.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("rejected_calls", 0)) + int(stats.get("failed_calls", 0))


def test_redis_full_then_freed(tmp_path: Path) -> None:
    """Full: a new stage or resolve raises RedisFull; requests already queued are read but
    their takes refused up front (nothing popped, nothing in flight that recovery cannot see,
    the requests left unacked); the attempt in flight still ends; once memory is freed the
    queued resolves go through, each action applied once."""
    with cluster(tmp_path) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        sessions = [f"full-{i}" for i in range(4)]
        staged = {s: pa.stage(session=s, tool="t", label="L", apply="t.idem") for s in sessions}
        resolver = workers[0].pid
        with gated(pa, rc, "running"):
            os.kill(resolver, signal.SIGSTOP)  # requests queue up unread
            waiting = [pool.submit(pa.resolve, session=s, action="apply", reason="r",
                                   timeout=60) for s in sessions]
            wait_until(lambda: sum(rc.xlen(K.requests(p)) for p in range(K.partitions))
                       >= len(sessions), 10, "every resolve's request queued")
            fill(rc)
            refused = refused_scripts(rc)
            os.kill(resolver, signal.SIGCONT)
            with pytest.raises(RedisFull):
                pa.stage(session="x", tool="t", label="L", apply="t.idem")
            with pytest.raises(RedisFull):
                pa.resolve(session="x", action="apply", reason="r")
        def settled() -> bool:
            # the resolver has read the queued requests and Redis has refused their takes, and
            # the stage above; and the gated attempt has ended
            last = entries(rc.xrange(K.history("running")))[-1][1][b"event"]
            return refused_scripts(rc) >= refused + len(sessions) + 1 and last == b"failed"

        wait_until(settled, 20, "the takes tried and refused, and the gated attempt ended")
        pending: Any = [rc.xpending(K.requests(p), K.RESOLVER_GROUP)
                        for p in {K.partition(s) for s in sessions}]
        assert sum(x["pending"] for x in pending) == len(sessions)  # read, refused, not acked
        assert all(rc.zcard(K.stack(s)) == 1 for s in sessions)  # nothing popped
        assert not any(rc.hlen(K.inflight(s)) for s in sessions)
        # the attempt in flight ended while full: t.gate's own record (an RPUSH to this
        # Redis) was refused, so it raised, and readd.lua (allow-oom) put it back at the head
        assert [f[b"event"] for _e, f in entries(rc.xrange(K.history("running")))][-1] == \
            b"failed"
        assert not rc.hlen(K.inflight("running")) and rc.zcard(K.stack("running")) == 1
        rc.delete(*(f"junk:{n}" for n in range(80)))
        for s, fut in zip(sessions, waiting, strict=True):
            result = fut.result(timeout=60)
            assert not result.is_error, result.text
            assert effects(rc, s) == [staged[s]]
        others_resolve(pa, rc)
        wait_healthy(server.url)


def test_evicting_policy_is_refused(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0) as (server, _w, _pa):
        rc = redis.Redis.from_url(server.url)
        rc.config_set("maxmemory-policy", "allkeys-lru")
        proc = subprocess.run([sys.executable, "-m", "pending_actions", "worker", "--handlers",
                               "tests.support.handlers"], env=worker_env(server.url), cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert "maxmemory-policy is allkeys-lru" in proc.stderr
        assert "Traceback" not in proc.stderr


SITE = '''import os, time
_shift = float(os.environ.get("TEST_CLOCK_SHIFT_S", "0"))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _shift
time.time_ns = lambda: _time_ns() + int(_shift * 1e9)
'''


@pytest.mark.parametrize("shift", [120, -120])
def test_worker_clock_off_by_two_minutes(tmp_path: Path, shift: int) -> None:
    """A worker (resolver and handlers) whose wall clock is 120 s off: a resolve with a 20 s
    timeout is served, and a crashed handler is recovered after its lease (1 s), not 120 s
    later or sooner."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    with cluster(tmp_path, workers=0) as (server, workers, pa):
        rc = redis.Redis.from_url(server.url)
        env = {**TEST_ENV, "PYTHONPATH": f"{site}:{ROOT}", "TEST_CLOCK_SHIFT_S": str(shift)}
        skewed = WorkerProcess(server.url, "tests.support.handlers", FAST, env=env).start()
        try:
            probe = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                                   env={**worker_env(server.url), **env}, cwd=ROOT,
                                   capture_output=True, text=True, check=True)
            assert abs(float(probe.stdout) - time.time() - shift) < 5  # the shift is real
            others_resolve(pa, rc)
            pa.stage(session="crash", tool="t", label="L", apply="t.crash")
            started = time.monotonic()
            result = pa.resolve(session="crash", action="apply", reason="r", timeout=20)
            assert result.is_error and "worker" in result.text.lower(), result.text
            assert time.monotonic() - started < 10
        finally:
            skewed.kill()
        del workers
