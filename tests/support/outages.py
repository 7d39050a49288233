"""Drive many resolves through an outage and check CONTRACT 4.1/4.2 afterwards."""

from __future__ import annotations

import threading
import time
from collections import Counter

import redis

from pending_actions.broker.errors import RedisUnavailable
from pending_actions.broker.texts import NOTHING_TO_APPLY
from pending_actions.producers import PendingActions
from tests.support.faults import K
from tests.support.replies import byte_list, read, tail_id
from tests.support.runs import runs

TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def drain(pa: PendingActions, rc: redis.Redis, session: str, progress: threading.Semaphore,
          deadline: float) -> None:
    """Resolve until the session has nothing stacked and nothing in flight, riding out
    outages the way an agent runtime would: retry after RedisUnavailable or an error result."""
    while time.monotonic() < deadline:
        try:
            res = pa.resolve(session=session, action="apply", reason="r", timeout=5)
            if not res.is_error:
                progress.release()
                continue
            if res.text != NOTHING_TO_APPLY:
                continue  # interrupted / timed out: the action is pending or in flight
            if not rc.hlen(K.inflight(session)) and not rc.zcard(K.stack(session)):
                return
            # something is in flight: wait for its next history event
            read(rc, K.history(session), tail_id(rc, K.history(session)), 2000)
        except (RedisUnavailable, *TRANSIENT):
            time.sleep(0.05)  # Redis is down; there is nothing to wait on but time
    raise AssertionError(f"{session} not drained in time")


def run_drains(pa: PendingActions, rc: redis.Redis, sessions: list[str],
               during: threading.Event | None = None, after_n: int = 0,
               timeout: float = 120) -> None:
    progress = threading.Semaphore(0)
    errors: list[BaseException] = []
    deadline = time.monotonic() + timeout

    def guarded(s: str) -> None:
        try:
            drain(pa, rc, s, progress, deadline)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    if during is not None:
        for _ in range(after_n):
            assert progress.acquire(timeout=60), "no progress before the fault"
        during.set()
    for t in threads:
        t.join()
    assert not errors, errors


def check_exactly_once(rc: redis.Redis, staged: dict[str, list[str]]) -> dict[str, int]:
    """Every staged action applied once (one effect), none pending, none dead, and no attempt
    run twice by the service."""
    totals = Counter[str]()
    for session, ids in staged.items():
        effects = [x.decode() for x in
                   byte_list(rc.lrange(f"test:effects:{{{session}}}", 0, -1))]
        assert sorted(effects) == sorted(ids), (session, Counter(effects) - Counter(ids))
        ran = runs(rc, session)
        attempts = Counter((r["id"], r["attempt"]) for r in ran)
        assert max(attempts.values()) == 1, [k for k, v in attempts.items() if v > 1]
        assert rc.zcard(K.stack(session)) == 0 and rc.hlen(K.inflight(session)) == 0
        assert rc.llen(K.dead(session)) == 0
        totals["staged"] += len(ids)
        totals["applied"] += len(effects)
        totals["attempts"] += len(ran)
    return dict(totals)
