"""Redis killed and restarted under load, and connections cut mid-command: nothing lost,
nothing applied twice."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import RedisClusterException

from pending_actions.broker.connection import producer_client
from pending_actions.broker.errors import RedisUnavailable
from pending_actions.broker.loops import is_outage
from pending_actions.procs import ROOT
from pending_actions.producers import AsyncPendingActions, PendingActions
from pending_actions_harness.embedded_cluster import Cluster
from tests.support.faults import K, cluster
from tests.support.outages import check_exactly_once, run_drains
from tests.support.procs import Worker, worker_env
from tests.support.proxy import ChaosProxy
from tests.support.replies import byte_list, entries

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2


def cli_run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args], env=worker_env(url),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def stage_all(pa: PendingActions, sessions: list[str], n: int) -> dict[str, list[str]]:
    return {s: [pa.stage(session=s, tool="edit", label=f"{s}#{i}", apply="t.idem")
                for i in range(n)] for s in sessions}


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_redis_sigkill_and_restart_with_aof(tmp_path: Path, fsync: str) -> None:
    """A SIGKILL of redis-server loses nothing even with everysec: the AOF write() has reached
    the kernel before the reply is sent; everysec only delays the fsync. What everysec can lose
    is the last second or two of acknowledged writes on a kernel crash or power cut, which a
    test on one machine cannot cause (see docs/durability.md)."""
    with cluster(tmp_path, fsync=fsync, max_stalls="50") as (server, _w, pa):
        rc = redis.Redis.from_url(server.url)
        sessions = [f"r{i}" for i in range(4)]
        staged = stage_all(pa, sessions, 15)
        crash = threading.Event()

        def crasher() -> None:
            crash.wait()
            server.kill()  # SIGKILL: no shutdown, no final fsync beyond "always"
            server.start()

        t = threading.Thread(target=crasher)
        t.start()
        run_drains(pa, rc, sessions, during=crash, after_n=10)
        t.join()
        totals = check_exactly_once(rc, staged)
        assert totals["applied"] == 60


def test_connections_cut_mid_operation(tmp_path: Path) -> None:
    with cluster(tmp_path, workers=0, max_stalls="50") as (server, workers, _pa):
        proxy = ChaosProxy(server.port)
        workers.append(Worker(proxy.url, overrides={
            "lease_ms": "1000", "recovery_interval_ms": "100", "claim_idle_ms": "2000",
            "max_stalls": "50"}).start())
        pa = PendingActions.from_url(proxy.url)
        rc = redis.Redis.from_url(server.url)  # the checker talks to Redis directly
        sessions = [f"c{i}" for i in range(4)]
        staged = stage_all(pa, sessions, 25)
        stop = threading.Event()
        rng = random.Random(7)

        def chaos() -> None:
            # by traffic, not by time: however fast the service drains, cuts land mid-work
            while not stop.is_set():
                if proxy.wait_traffic(rng.randint(60, 300), timeout=0.5):
                    proxy.cut()

        chaos_thread = threading.Thread(target=chaos)
        chaos_thread.start()
        try:
            run_drains(pa, rc, sessions, timeout=150)
        finally:
            stop.set()
            chaos_thread.join()
            proxy.close()
        totals = check_exactly_once(rc, staged)
        assert totals["applied"] == 100
        print(f"cuts={proxy.cuts} totals={totals}")
        assert proxy.cuts > 5


@pytest.mark.parametrize("client", ["sync", "async"])
def test_batches_through_connections_cut_mid_way(tmp_path: Path, client: str) -> None:
    """stage_many sends its transactions one after the other before reading their replies;
    connections cut meanwhile send again those whose reply was not read. What a call returned
    is staged, and no id is on a stack, or in a history, twice."""
    with cluster(tmp_path, workers=1) as (server, _workers, _pa):
        proxy = ChaosProxy(server.port)
        rc = redis.Redis.from_url(server.url)
        sessions = [f"b{i}" for i in range(4)]
        batch = [{"session": sessions[i % 4], "tool": "edit", "label": f"#{i}",
                  "apply": "t.idem"} for i in range(40)]  # with a chunk of 3: 14 transactions
        PendingActions.from_url(proxy.url).stage(session=sessions[0], tool="edit",
                                                 label="first", apply="t.idem")
        stop = threading.Event()
        rng = random.Random(11)

        def chaos() -> None:
            while not stop.is_set():
                if proxy.wait_traffic(rng.randint(2, 40), timeout=0.5):
                    proxy.cut()

        returned: list[str] = []
        failed = 0

        async def stage_async() -> None:
            nonlocal failed, returned
            async with AsyncPendingActions.from_url(proxy.url) as apa:
                apa.core.CHUNK = 3
                for _ in range(30):
                    try:
                        returned += await apa.stage_many(batch)
                    except RedisUnavailable:
                        failed += 1

        chaos_thread = threading.Thread(target=chaos)
        chaos_thread.start()
        try:
            if client == "async":
                asyncio.run(stage_async())
            else:
                pa = PendingActions.from_url(proxy.url)
                pa.core.CHUNK = 3
                for _ in range(30):
                    try:
                        returned += pa.stage_many(batch)
                    except RedisUnavailable:
                        failed += 1
        finally:
            stop.set()
            chaos_thread.join()
            proxy.close()
        stacked = [x.decode() for s in sessions for x in byte_list(rc.zrange(K.stack(s), 0, -1))]
        history = [f[b"id"].decode() for s in sessions
                   for _e, f in entries(rc.xrange(K.history(s))) if f[b"event"] == b"staged"]
        assert len(set(stacked)) == len(stacked)
        assert len(set(history)) == len(history)
        assert set(returned) <= set(stacked) & set(history)
        print(f"cuts={proxy.cuts} returned={len(returned)} failed calls={failed}")
        assert proxy.cuts > 5 and returned


def test_a_cluster_that_leaves_slots_unserved_is_unavailable_to_every_client(
        tmp_path: Path) -> None:
    """A cluster whose slot table has a hole (every node forgot one master's slots, as an
    operator's DELSLOTS or a failover caught half-way leaves it): redis-py's cluster client
    refuses to read such a table with its own RedisClusterException, which is no RedisError.
    The blocking client (which reads the table as it is made), the asyncio client and the CLI
    all say Redis is unavailable, and a worker loop waits it out as an outage."""
    nodes = Cluster(tmp_path / "cluster", masters=3).start()
    try:
        port = nodes.master_ports()[0]
        first: Any = redis.Redis(port=port)
        lo, hi = next((s[0], s[1]) for s in first.execute_command("CLUSTER", "SLOTS")
                      if s[2][1] == port)
        for p in nodes.master_ports():
            node: Any = redis.Redis(port=p)
            node.execute_command("CLUSTER", "DELSLOTSRANGE", lo, hi)

        with pytest.raises(RedisUnavailable, match="not covered"):
            PendingActions.from_url(nodes.url)

        async def stage() -> None:
            async with AsyncPendingActions.from_url(nodes.url) as apa:
                await apa.stage(session="s", tool="t", label="l", apply="t.ok")

        with pytest.raises(RedisUnavailable, match="not covered"):
            asyncio.run(stage())

        res = cli_run(nodes.url, "ls", "--session", "s")
        assert res.returncode == 1, res
        assert res.stderr.count("\n") == 1 and "unavailable" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr

        with pytest.raises(RedisClusterException) as raised:
            producer_client(nodes.url)
        assert is_outage(raised.value)
    finally:
        nodes.stop()
