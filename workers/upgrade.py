"""Keys an older version left in another layout, brought up to this one when a resolve worker
starts: each partition's sessions index, a SET (with each session's tenant in a string key of
its own) before it became the HASH session -> tenant. Until then a stage into that partition is
refused (POISON type), so a deployment is upgraded by starting a new resolve worker first."""

from __future__ import annotations

import logging
from typing import Any

from pending_actions.broker.context import Context

log = logging.getLogger("pending_actions.upgrade")
ATTEMPTS = 10  # reads of a set that a producer of the older version keeps adding to


def upgrade(ctx: Context) -> int:
    """Upgrade every partition still in the older layout; returns the sessions moved."""
    moved = 0
    for partition in range(ctx.keys.partitions):
        key = ctx.keys.sessions(partition)
        for _ in range(ATTEMPTS):
            if ctx.client.type(key) not in (b"set", "set"):
                break
            members: Any = ctx.client.smembers(key)
            sessions = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
            done = ctx.scripts.upgrade(partition, sessions).run()
            if done >= 0:
                moved += done
                log.warning("upgraded %d sessions of partition %d to the sessions hash",
                            done, partition)
                break
    return moved
