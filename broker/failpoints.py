"""Named points where a process can be told to stop dead, so fault tests can SIGKILL it at an
exact moment (as FoundationDB and TiKV do with failpoints).

Off unless ``PENDING_ACTIONS_FAILPOINT`` names the point. When hit, the process announces it on
the ``workers`` stream and then blocks for ever, waiting for the test's SIGKILL."""

from __future__ import annotations

import os
import threading

import redis

from pending_actions.broker.events import announce
from pending_actions.broker.keys import Keys

ENV = "PENDING_ACTIONS_FAILPOINT"
# read once: a process is told at its start, and hit() is on every resolve's path (the
# environment's lookup was 3% of an idle resolve worker's CPU in its flame graph)
ARMED = os.environ.get(ENV)


def hit(name: str, client: redis.Redis, keys: Keys) -> None:
    if name != ARMED:
        return
    announce(client, keys, "failpoint", name)
    threading.Event().wait()
