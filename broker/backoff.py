"""The one backoff: every loop that waits out a Redis outage or a crashed process waits
first x 2^n seconds after its n-th failure in a row, at most ``cap``, drawn between half that
and all of it so that processes that lost Redis together do not come back in step.

(Not tenacity or backoff: most of these loops run for ever and start counting afresh after
each success, which is a counter rather than a decorated call.)"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from pending_actions.broker.connection import TRANSIENT

T = TypeVar("T")
log = logging.getLogger("pending_actions")
# how long a step that must reach a replica (REPLICA_WAIT) is sent again through a failover: a
# replica's promotion takes seconds (the producer's stage and resolve, a worker's claim and
# outcome)
FAILOVER_WAIT_S = 10.0


def delay(failures: int, first: float, cap: float) -> float:
    """The wait after ``failures`` failures in a row before this one (0 for the first)."""
    return min(first * 2.0 ** min(failures, 32), cap) * random.uniform(0.5, 1.0)


class Backoff:
    """The failures in a row of one loop, and the waits they earn."""

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        wait = delay(self.failures, self.first, self.cap)
        self.failures += 1
        return wait

    def reset(self) -> None:
        self.failures = 0

    def wait(self, stop: threading.Event, exc: BaseException, what: str) -> None:
        """Log why, then wait the next delay or until ``stop`` is set."""
        wait = self.next()
        log.warning("%s (%s); retrying in %.2fs", what, exc, wait)
        stop.wait(wait)


def retry(fn: Callable[[], T], budget_s: float, *, first: float = 0.05,
          cap: float = 1.0) -> T:
    """Call ``fn`` through a Redis outage for up to ``budget_s``; past it, the last error."""
    deadline = time.monotonic() + budget_s
    backoff = Backoff(first, cap)
    while True:
        try:
            return fn()
        except TRANSIENT:
            wait = backoff.next()
            if time.monotonic() + wait > deadline:
                raise
            time.sleep(wait)
