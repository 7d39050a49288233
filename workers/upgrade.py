"""Keys an older version left in another layout, brought up to this one when a resolve worker
starts:

* each partition's sessions index, a SET (with each session's tenant in a string key of its
  own) before it became the HASH session -> tenant. Until then a stage into that partition is
  refused (POISON type);
* each session's stack, a LIST (head on the left) before it became a ZSET (the head the lowest
  score). Until then a stage or resolve in that session is refused (POISON type);
* each tenant's sessions, a SET across partitions (``Keys.legacy_tenant_sessions``) before each
  partition kept a tenant index (``Keys.tenant_index``): the indexes are built from the owner
  records (the sessions hashes), not from those sets, which older producers wrote whatever the
  stage answered. The sets are left as they are, read by nothing. Until then a tenant's views
  miss its sessions that were claimed by an older version.

So a deployment is upgraded by starting a new resolve worker first. Once every session has been
looked at, ``Keys.layout`` says so and later starts skip the scans; a stack an older producer
still makes as a list after that is moved when a take meets it (``upgrade_stack``)."""

from __future__ import annotations

import logging
from typing import Any

from pending_actions.broker.context import Context
from pending_actions.broker.models import DEFAULT_TENANT

log = logging.getLogger("pending_actions.upgrade")
ATTEMPTS = 10  # reads of a set that a producer of the older version keeps adding to
BATCH = 500  # sessions whose stack types are asked in one round trip
# the layouts (Keys.layout) in order, each saying every session has been brought up to it
ZSET_STACKS = "zset-stacks"  # every stack looked at
TENANT_INDEXES = "tenant-indexes"  # every session of a tenant in its partition's index
LAYOUTS = (ZSET_STACKS, TENANT_INDEXES)


def upgrade(ctx: Context) -> int:
    """Upgrade every partition still in an older layout; returns the sessions moved to the
    sessions hash, plus the stacks moved to zsets, plus the sessions added to tenant
    indexes."""
    return upgrade_sessions(ctx) + upgrade_stacks(ctx) + index_tenants(ctx)


def _reached(ctx: Context, layout: str) -> bool:
    """Whether ``Keys.layout`` says every session is at ``layout`` or later."""
    found = _text(ctx.client.get(ctx.keys.layout) or b"")
    return found in LAYOUTS and LAYOUTS.index(found) >= LAYOUTS.index(layout)


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
    if _reached(ctx, ZSET_STACKS):
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


def index_tenants(ctx: Context) -> int:
    """Every session claimed by a tenant other than the default into its partition's index of
    that tenant, from the owner records; returns the sessions added. Adding one twice is a
    no-op, so workers starting together may both do it. A session retired between the read and
    the add leaves a stray member, which no view shows (they check the owner record)."""
    if _reached(ctx, TENANT_INDEXES):
        return 0
    added = 0
    for partition in range(ctx.keys.partitions):
        key = ctx.keys.sessions(partition)
        if ctx.client.type(key) not in (b"hash", "hash"):
            continue
        cursor: Any = 0
        while True:
            found: Any
            cursor, found = ctx.client.hscan(key, cursor, count=BATCH)
            pipe = ctx.client.pipeline(transaction=False)
            for session, tenant in found.items():
                if _text(tenant) not in ("", DEFAULT_TENANT):
                    pipe.sadd(ctx.keys.tenant_index(partition, _text(tenant)), session)
            added += sum(int(n) for n in pipe.execute()) if len(pipe) else 0
            if int(cursor) == 0:
                break
    if added:
        log.warning("added %d sessions to their partitions' tenant indexes", added)
    ctx.client.set(ctx.keys.layout, TENANT_INDEXES)
    return added


def upgrade_stack(ctx: Context, session: str) -> bool:
    """The session's stack, if still a list, into a zset; whether this call moved it."""
    return ctx.scripts.upgrade_stack(session).run() > 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
