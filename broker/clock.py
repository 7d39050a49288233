"""One clock: Redis's. Every deadline a process writes (a lease's index entry) or checks (a
request's expiry) is in Redis server time, so a machine whose clock is off by minutes costs
nothing. Scripts read ``TIME`` themselves; a process estimates it from its monotonic clock
and an offset it measures with ``TIME`` now and then (a round trip's accuracy)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from pending_actions.broker.connection import TRANSIENT

RESYNC_S = 30.0


class RedisClock:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.offset_ms: float | None = None  # Redis ms minus our monotonic ms
        self.synced = -1e9
        self.lock = threading.Lock()

    def sync(self) -> None:
        before = time.monotonic()
        sec, usec = self.client.time()
        after = time.monotonic()
        server_ms = int(sec) * 1000 + int(usec) / 1000
        with self.lock:
            self.offset_ms = server_ms - (before + after) * 500
            self.synced = after

    def now_ms(self) -> int:
        """Redis server time in ms, as of now. Raises what the client raises when it must
        measure first and Redis is away."""
        if self.offset_ms is None:
            self.sync()
        elif time.monotonic() - self.synced > RESYNC_S:
            # the last offset stays good for a long while: monotonic clocks drift little
            with contextlib.suppress(*TRANSIENT):
                self.sync()
        assert self.offset_ms is not None
        return int(time.monotonic() * 1000 + self.offset_ms)
