"""Helpers of the fault tests: a private Redis and workers per test, and waits on Redis events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions_harness.embedded_cluster import Cluster
from tests.support.procs import Worker
from tests.support.replies import entries
from tests.support.runs import runs
from tests.support.waits import next_entry, wait_until

K = Keys()
# Short leases so that recovery happens within a test's patience.
FAST = {"lease_ms": "1000", "dispatch_timeout_ms": "20000", "recovery_interval_ms": "100",
        "max_stalls": "3", "claim_idle_ms": "3000", "resolve_timeout_s": "30",
        "restart_backoff_max_s": "0.2"}


@contextmanager
def cluster(tmp: Path, workers: int = 1, fsync: str = "always", on_cluster: bool = False,
            **overrides: str) -> Iterator[tuple[Any, list[Worker], PendingActions]]:
    """Redis (a single server, or with ``on_cluster`` a 3-master Redis Cluster), workers and
    a client."""
    server: Any = (Cluster(tmp / "cluster", fsync=fsync).start() if on_cluster
                   else EmbeddedRedis(directory=tmp / "redis", fsync=fsync).start())
    started: list[Worker] = []
    pa = PendingActions.from_url(server.url, resolve_timeout_s=30)
    try:
        for _ in range(workers):
            started.append(Worker(server.url, overrides={**FAST, **overrides}).start())
        yield server, started, pa
    finally:
        pa.close()
        for w in started:
            w.kill()
        if on_cluster:
            server.stop()
        else:
            server.kill()


def wait_for(rc: redis.Redis, stream: str, match: Callable[[dict[bytes, bytes]], bool],
             since: bytes = b"0-0", timeout: float = 20.0) -> dict[bytes, bytes]:
    """Block on a stream until an entry after ``since`` matches."""
    return wait_until(next_entry(rc, stream, match, since), timeout,
                      f"a matching entry on {stream}", interval_s=0)


def wait_history(rc: redis.Redis, session: str, event: str, since: bytes = b"0-0",
                 timeout: float = 20.0) -> dict[bytes, bytes]:
    return wait_for(rc, K.history(session), lambda f: f[b"event"] == event.encode(), since,
                    timeout)


def events(rc: redis.Redis, session: str) -> list[str]:
    return [f[b"event"].decode() for _e, f in entries(rc.xrange(K.history(session)))]


def started_pid(rc: redis.Redis, session: str, timeout: float = 20) -> int:
    """Wait until a t.gate handler of the session has started; return its process id."""
    got = rc.blpop([f"test:started:{session}"], timeout=timeout)
    assert got is not None, "the handler never started"
    return runs(rc, session)[-1]["pid"]
