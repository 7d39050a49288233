"""Nothing grows for ever: the recovery loop retires, a page at a time, what finished sessions
leave. retire.lua sets a finished session's history to expire after ``retention_s`` (never
touching a session with anything pending, in flight, in a slot or dead-lettered), and drops a
session with no keys left from its partition's sessions hash (its tenant claim with it); the
tenants' sessions sets follow. The dead streams are capped where they are written; markers and
replies have their own ttl."""

from __future__ import annotations

import time
from typing import Any

from pending_actions.broker.context import Context


class Retirement:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.next_at = 0.0
        self.cursors: dict[str, int] = {}  # sessions hash or set -> scan cursor

    def step(self) -> int:
        """One page of each sessions hash and set, at most every ``housekeeping_s``, by one
        worker at a time. Returns how many sessions were dropped."""
        s = self.ctx.settings
        if time.monotonic() < self.next_at:
            return 0
        self.next_at = time.monotonic() + s.housekeeping_s
        if not self.ctx.client.set(self.ctx.keys.housekeeping_lock, "1", nx=True,
                                   px=int(s.housekeeping_s * 1000)):
            return 0
        k = self.ctx.keys
        return (sum(self.page(k.sessions(p), hashed=True) for p in range(k.partitions))
                + sum(self.page(key) for key in self.tenant_sets()))

    def tenant_sets(self) -> list[str]:
        found: Any = self.ctx.client.scan_iter(match=self.ctx.keys.tenant_sessions("*"),
                                               count=1000, _type="set")
        return [x.decode() if isinstance(x, bytes) else x for x in found]

    def page(self, key: str, count: int = 200, retention_ms: int | None = None,
             hashed: bool = False) -> int:
        """One page of a partition's sessions hash (``hashed``: retire.lua drops the sessions
        it finds gone) or of a tenant's sessions set (dropped here)."""
        ctx = self.ctx
        retention = ctx.settings.retention_s * 1000 if retention_ms is None else retention_ms
        cursor = self.cursors.get(key, 0)
        scanned: Any = (ctx.client.hscan(key, cursor, count=count) if hashed
                        else ctx.client.sscan(key, cursor, count=count))
        self.cursors[key] = int(scanned[0])
        sessions = [m.decode() for m in scanned[1]]  # a hash's fields, a set's members
        if not sessions:
            return 0
        pipe = ctx.client.pipeline(transaction=False)
        for session in sessions:
            ctx.scripts.retire(session, retention).on(pipe)
        gone = [x for x, code in zip(sessions, pipe.execute(), strict=True) if int(code) == 2]
        if not gone or hashed:
            return len(gone)
        ctx.client.srem(key, *gone)
        # a stage may have come in between the look and the SREM (its producer adds the
        # session to its tenant's set), so whatever has keys again now goes back
        pipe = ctx.client.pipeline(transaction=False)
        for session in gone:
            pipe.exists(ctx.keys.actions(session), ctx.keys.history(session),
                        ctx.keys.dead(session))
        back = [x for x, n in zip(gone, pipe.execute(), strict=True) if n]
        if back:
            ctx.client.sadd(key, *back)
        return len(gone) - len(back)
