"""Keys an older version left in another layout, brought up to this one when a resolve worker
starts:

* each partition's sessions index, a SET (with each session's tenant in a string key of its
  own) before it became the HASH session -> tenant. Until then a stage into that partition is
  refused (POISON type);
* each session's stack, a LIST (head on the left) before it became a ZSET (the head the lowest
  score). Until then a stage or resolve in that session is refused (POISON type).

So a deployment is upgraded by starting a new resolve worker first. Once every stack has been
looked at, ``Keys.layout`` says so and later starts skip the scan (one read of each session's
stack type); a stack an older producer still makes as a list after that is moved when a take
meets it (``upgrade_stack``)."""

from __future__ import annotations

import logging
from typing import Any

from pending_actions.broker.context import Context

log = logging.getLogger("pending_actions.upgrade")
ATTEMPTS = 10  # reads of a set that a producer of the older version keeps adding to
BATCH = 500  # sessions whose stack types are asked in one round trip
ZSET_STACKS = "zset-stacks"  # the layout (Keys.layout) once every stack has been looked at


def upgrade(ctx: Context) -> int:
    """Upgrade every partition still in an older layout; returns the sessions moved to the
    sessions hash plus the stacks moved to zsets."""
    return upgrade_sessions(ctx) + upgrade_stacks(ctx)


def upgrade_sessions(ctx: Context) -> int:
    """Every partition's sessions set into the sessions hash; returns the sessions moved."""
    moved = 0
    for partition in range(ctx.keys.partitions):
        key = ctx.keys.sessions(partition)
        for _ in range(ATTEMPTS):
            if ctx.client.type(key) not in (b"set", "set"):
                break
            members: Any = ctx.client.smembers(key)
            sessions = sorted(_text(m) for m in members)
            done = ctx.scripts.upgrade(partition, sessions).run()
            if done >= 0:
                moved += done
                log.warning("upgraded %d sessions of partition %d to the sessions hash",
                            done, partition)
                break
    return moved


def upgrade_stacks(ctx: Context) -> int:
    """Every session's stack that is still a list into a zset; returns the stacks moved. Only
    those found to be lists are sent to the script, which looks again itself (another worker
    may be at it too)."""
    if _text(ctx.client.get(ctx.keys.layout) or b"") == ZSET_STACKS:
        return 0  # every session looked at by an earlier start; a take moves a later list
    moved = 0
    for partition in range(ctx.keys.partitions):
        key = ctx.keys.sessions(partition)
        if ctx.client.type(key) not in (b"hash", "hash"):
            continue
        cursor: Any = 0
        while True:
            cursor, found = ctx.client.hscan(key, cursor, count=BATCH)
            sessions = [_text(s) for s in found]
            pipe = ctx.client.pipeline(transaction=False)
            for session in sessions:
                pipe.type(ctx.keys.stack(session))
            lists = [s for s, t in zip(sessions, pipe.execute(), strict=True)
                     if t in (b"list", "list")]
            for session in lists:
                if upgrade_stack(ctx, session):
                    moved += 1
            if int(cursor) == 0:
                break
    if moved:
        log.warning("upgraded %d stacks from lists to zsets", moved)
    ctx.client.set(ctx.keys.layout, ZSET_STACKS)
    return moved


def upgrade_stack(ctx: Context, session: str) -> bool:
    """The session's stack, if still a list, into a zset; whether this call moved it."""
    return ctx.scripts.upgrade_stack(session).run() > 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
