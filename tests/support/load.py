"""Helpers of the tests that fault a running service: a load of callers staging and resolving
until stopped (and the check that each action staged ended applied once), fresh sessions that
must resolve within a bound, ``health`` run as an operator runs it, and an action held in flight
by a handler that waits on a gate."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import orjson
import redis

from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from tests.support.faults import K, started_pid
from tests.support.procs import worker_env
from tests.support.replies import byte_list
from tests.support.waits import wait_until

pool = ThreadPoolExecutor(max_workers=8)


def health(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", "--json", "health"],
                          env=worker_env(url), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def wait_healthy(url: str, timeout: float = 20.0) -> dict[str, Any]:
    """Poll ``health`` (a CLI: there is no event to await) until it passes."""
    last: list[subprocess.CompletedProcess[str]] = []

    def healthy() -> dict[str, Any] | None:
        last[:] = [got := health(url)]
        return dict(orjson.loads(got.stdout)) if got.returncode == 0 else None

    return wait_until(healthy, timeout, lambda: f"healthy: {last[0].stdout}{last[0].stderr}",
                      interval_s=0.5)


def still_healthy(url: str, since_ms: int, within: float = 20.0) -> None:
    """Every loop of every live worker has beaten since ``since_ms`` (Redis time, taken after
    the fault), and all are on time: each went round after the fault. A loop that died never
    beats again, so this fails for it at ``within``."""
    from pending_actions.cli.health import beats

    pa = PendingActions.from_url(url)
    seen: list[Any] = []

    def round_since() -> bool:
        now, rows = beats(pa)
        behind = [r for r in rows if now - r["age_ms"] <= since_ms or not r["ok"]]
        seen[:] = [behind or rows]
        return bool(rows) and not behind

    wait_until(round_since, within, lambda: f"loops round since the fault: {seen[0]}",
               interval_s=0.2)
    got = health(url)
    assert got.returncode == 0, got.stdout + got.stderr


def redis_ms(rc: redis.Redis) -> int:
    sec, usec = rc.time()
    return int(sec) * 1000 + int(usec) // 1000


def effects(rc: redis.Redis, session: str) -> list[str]:
    return [x.decode() for x in byte_list(rc.lrange(f"test:effects:{{{session}}}", 0, -1))]


def others_resolve(pa: PendingActions, rc: redis.Redis, n: int = 4,
                   within: float = 20.0) -> None:
    """Fresh sessions stage and resolve, each within ``within`` s, each applied once."""
    sessions = [f"other-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    ids = {s: pa.stage(session=s, tool="t", label="L", apply="t.idem") for s in sessions}
    started = time.monotonic()
    results = [pool.submit(pa.resolve, session=s, action="apply", reason="r", timeout=within)
               for s in sessions]
    for s, fut in zip(sessions, results, strict=True):
        result = fut.result(timeout=within + 5)
        assert not result.is_error, result.text
        assert effects(rc, s) == [ids[s]]
    assert time.monotonic() - started < within


class Load:
    """Sessions staging t.idem actions and resolving them in a loop, until stopped; then
    ``check`` says every action staged ended applied once or is still pending."""

    def __init__(self, pa: PendingActions, sessions: int = 4) -> None:
        self.pa = pa
        self.sessions = [f"load-{uuid.uuid4().hex[:8]}" for _ in range(sessions)]
        self.staged: dict[str, list[str]] = {s: [] for s in self.sessions}
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(s,)) for s in self.sessions]
        self.resolved = 0
        self.progress = threading.Condition()

    def _run(self, session: str) -> None:
        while not self.stop.is_set():
            try:
                self.staged[session].append(
                    self.pa.stage(session=session, tool="t", label="L", apply="t.idem"))
                self.pa.resolve(session=session, action="apply", reason="r", timeout=5)
                with self.progress:
                    self.resolved += 1
                    self.progress.notify_all()
            except Exception as exc:
                self.errors.append(repr(exc))
                self.stop.wait(0.05)

    def wait_resolved(self, more: int, within: float = 30.0) -> None:
        """Return once ``more`` resolves than now have come back."""
        with self.progress:
            goal = self.resolved + more
            assert self.progress.wait_for(lambda: self.resolved >= goal, within), (
                f"the load stalled at {self.resolved} of {goal}: {self.errors[-3:]}")

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def check(self, rc: redis.Redis, within: float = 20.0) -> None:
        """Drain: resolve what is left; every staged id applied exactly once."""
        for s in self.sessions:
            deadline = time.monotonic() + within
            while self.pa.pending(s):
                assert time.monotonic() < deadline, f"{s} still has {self.pa.pending(s)}"
                self.pa.resolve(session=s, action="apply", reason="drain", timeout=within)
            done = effects(rc, s)
            assert sorted(done) == sorted(self.staged[s]), s  # none lost, none twice
            assert len(set(done)) == len(done)


@contextmanager
def gated(pa: PendingActions, rc: redis.Redis, session: str) -> Iterator[str]:
    """An action of ``session`` in flight (t.gate started); yields its lease token."""
    gate = f"gate:{uuid.uuid4().hex}"
    pa.stage(session=session, tool="t", label="gated", apply="t.gate", payload={"gate": gate})
    pool.submit(pa.resolve, session=session, action="apply", reason="r", timeout=30)
    started_pid(rc, session)
    [token] = byte_list(rc.hkeys(K.inflight(session)))
    yield token.decode()
    # opens the gate even while Redis is full, on any Redis: a first write that cannot grow
    # memory (no member removed) lets the script's next ones through (see broker/atomic/source.py)
    rc.eval("redis.pcall('ZREM', KEYS[1], '')\nreturn redis.call('RPUSH', KEYS[1], 'open')", 1,
            gate)
