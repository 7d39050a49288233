"""Nothing grows for ever: the recovery loop retires, a page at a time, what finished sessions
leave. retire.lua sets a finished session's history to expire after ``retention_s`` (never
touching a session with anything pending, in flight, in a slot or dead-lettered), and drops a
session with no keys left from its partition's sessions hash (its owner record) and its
tenant's index, in one step. The dead streams are capped where they are written; markers and
replies have their own ttl.

The pages are paced by the retention, not by the number of sessions: a pass over each hash
takes ``retention_s / PASSES`` (never less than one round), so an idle worker beside many
stored sessions sends a few commands a minute, not hundreds a second. The pace is set by the
clock, not by counting rounds: each round looks at the members of each hash that its pass
should have reached by the next round, so a late round, a scan that returned fewer than
asked or a hash that grew is caught up with at the next one, and the last round before a pass's
end finishes it. A page of any size is looked at in steps of at most ``MAX_PAGE`` sessions, one
short script call each, so a pass keeps its time however many sessions there are. Every session
stored when a pass begins is looked at before it ends; one finished is looked at within two
passes, and its history is gone ``retention_s`` after that."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import redis

from pending_actions.broker.context import Context

log = logging.getLogger("pending_actions.resolver")


@dataclass
class Walk:
    """One pass over a sessions hash, as kept in ``Keys.housekeeping`` (one field each):
    when it began (Redis ms), the size it had then, the scan cursor, how many members were
    looked at so far, and whether the scan came round (the pass is over once its time is)."""

    began: int
    size: int
    cursor: int = 0
    seen: int = 0
    done: bool = False

    def encode(self) -> str:
        return f"{self.began} {self.size} {self.cursor} {self.seen} {int(self.done)}"

    @classmethod
    def decode(cls, raw: bytes) -> Walk:
        """Raises ValueError for what is not one (a garbled field, an older version's)."""
        began, size, cursor, seen, done = (int(x) for x in raw.decode().split(" "))
        return cls(began, size, cursor, seen, bool(done))

    def due(self, now_ms: int, pass_ms: int, round_ms: int) -> int | None:
        """How many members should have been looked at by the end of a round at ``now_ms``:
        its share of the pass by the next round, so the last round before the pass ends is
        the one that finishes it; None: every one left (the pass ends before the next round)."""
        ahead = now_ms - self.began + round_ms
        if ahead >= pass_ms:
            return None
        return math.ceil(self.size * ahead / pass_ms)


class Retirement:
    PASSES = 24  # passes over the sessions per retention (7 h each at the default 7 days)
    MAX_PAGE = 200  # sessions per scan and per retire.lua call, at most
    MIN_PAGE = 50  # sessions a hash waits to have due before a round pages it

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.next_at = 0.0
        # the passes as this worker last left them: carried on alone while the shared record
        # is of another type (an operator's doing), rather than stopping the recovery loop
        self.own: dict[str, Walk] = {}
        self.warned = False

    @property
    def round_s(self) -> float:
        """The longest wait for the next round: ``housekeeping_s``, and up to a recovery loop
        interval more (the loop calls ``step`` once an interval)."""
        s = self.ctx.settings
        return s.housekeeping_s + s.recovery_interval_ms / 1000

    @property
    def pass_s(self) -> float:
        s = self.ctx.settings
        return max(s.housekeeping_s, s.retention_s / self.PASSES)

    def step(self) -> int:
        """At most every ``housekeeping_s``, by one worker at a time: for each sessions hash,
        the page of it that its pass has come to. Where each pass stands is kept in
        Redis (``Keys.housekeeping``), so whichever worker holds the round carries it on.
        Returns how many sessions were dropped."""
        s = self.ctx.settings
        now = time.monotonic()
        if now < self.next_at:
            return 0
        self.next_at = now + s.housekeeping_s
        k = self.ctx.keys
        if not self.ctx.client.set(k.housekeeping_lock, "1", nx=True,
                                   px=int(s.housekeeping_s * 1000)):
            return 0
        keys = [k.sessions(p) for p in range(k.partitions)]
        walks, stray = self.load()
        clock = self.ctx.clock.now_ms()
        pass_ms, round_ms = int(self.pass_s * 1000), int(self.round_s * 1000)
        # a pass begins where none is going on: the last one over and its time up
        started = self.measure(
            [key for key in keys if key not in walks
             or (walks[key].done and clock >= walks[key].began + pass_ms)], clock)
        walks.update(started)
        dropped, moved = 0, []
        for key in keys:
            walk = walks[key]
            due = walk.due(clock, pass_ms, round_ms)
            if walk.done or (due is not None and due - walk.seen < self.MIN_PAGE):
                continue
            while not walk.done and (due is None or walk.seen < due):
                count = self.MAX_PAGE if due is None else min(self.MAX_PAGE, due - walk.seen)
                gone, walk.cursor, looked = self.page(key, walk.cursor, count)
                dropped += gone
                walk.seen += looked
                walk.done = walk.cursor == 0
            moved.append(key)
        # what is no pass over a sessions hash leaves the record: an older version's passes
        # over the tenants' sets (read by nothing now), a garbled field
        vanished = (set(walks) | stray) - set(keys)
        for key in vanished:
            walks.pop(key, None)
        self.own = walks
        changed: dict[Any, str] = {key: walks[key].encode() for key in {*moved, *started}}
        if not changed and not vanished:
            return dropped
        try:
            pipe = self.ctx.client.pipeline(transaction=False)
            if changed:
                pipe.hset(k.housekeeping, mapping=changed)
            if vanished:
                pipe.hdel(k.housekeeping, *vanished)
            pipe.execute()
        except redis.ResponseError as exc:
            self._unshared(exc)
        return dropped

    def _unshared(self, exc: redis.ResponseError) -> None:
        if "WRONGTYPE" not in str(exc):
            raise exc
        if not self.warned:
            self.warned = True
            log.warning("%s is not a hash (%s): each resolve worker retires sessions at its "
                        "own pace until it is deleted", self.ctx.keys.housekeeping, exc)

    def load(self) -> tuple[dict[str, Walk], set[str]]:
        """Where each pass stands, and the fields of the record that are not one (they go)."""
        try:
            raw: Any = self.ctx.client.hgetall(self.ctx.keys.housekeeping)
        except redis.ResponseError as exc:
            self._unshared(exc)
            return {key: Walk(**vars(w)) for key, w in self.own.items()}, set()
        walks, stray = {}, set()
        for field, value in raw.items():
            try:
                walks[field.decode()] = Walk.decode(value)
            except ValueError:
                stray.add(field.decode())
        return walks, stray

    def measure(self, starting: list[str], now_ms: int) -> dict[str, Walk]:
        """A pass beginning now over each of these hashes: its size sets its pace (and spares
        the scan of one that is empty)."""
        if not starting:
            return {}
        pipe = self.ctx.client.pipeline(transaction=False)
        for key in starting:
            pipe.hlen(key)
        return {key: Walk(now_ms, int(size), done=not int(size))
                for key, size in zip(starting, pipe.execute(), strict=True)}

    def page(self, key: str, cursor: int, count: int) -> tuple[int, int, int]:
        """A page of about ``count`` sessions of a partition's sessions hash from ``cursor``:
        retire.lua drops the sessions it finds gone. Returns how many were dropped, the cursor
        after, and how many were looked at."""
        scanned: Any = self.ctx.client.hscan(key, cursor, count=count)
        # each session with its tenant as read: retire.lua takes it out of that tenant's index
        sessions = [(s.decode(), t.decode()) for s, t in scanned[1].items()]
        return len(self.retire(sessions)) if sessions else 0, int(scanned[0]), len(sessions)

    def retire(self, sessions: list[tuple[str, str]]) -> list[str]:
        """retire.lua on these sessions (each with the tenant its record held), one call per
        partition; returns those gone."""
        ctx = self.ctx
        by_partition: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for session, tenant in sessions:
            by_partition[ctx.keys.partition(session)].append((session, tenant))
        retention = ctx.settings.retention_s * 1000
        gone: list[str] = []
        for partition, group in by_partition.items():
            codes = ctx.scripts.retire(partition, sessions=group,
                                        retention_ms=retention).run()
            gone += [x for (x, _t), code in zip(group, codes, strict=True) if code == 2]
        return gone
