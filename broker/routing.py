"""Routing by handler. A dramatiq worker process serves one *pool*: the set of handler names
it has, named by a short hash of that set, so workers with the same handlers share a pool and
its task streams. Each process keeps its pool live with a heartbeat (an expiry in the
``pool_live`` zset) and removes it at clean shutdown; a process that dies silently drops out
when its expiry passes (``POOL_TTL_MS``).

Producers refuse to stage a handler no live pool has; the resolve worker hands take.lua the
table handler -> pools, so a task goes only to a pool that has its handler."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from pending_actions.broker.atomic.declared import ARGV, KEYS
from pending_actions.broker.atomic.source import source
from pending_actions.broker.keys import Keys


def pool_id(names: list[str] | tuple[str, ...],
            tenants: dict[str, list[str]] | None = None) -> str:
    """A short hash of the handler names (and of the tenants any of them is kept to: workers
    that serve other tenants are another pool)."""
    text = ",".join(sorted(names))
    if tenants:
        text += ";" + ";".join(f"{n}={','.join(sorted(t))}" for n, t in sorted(tenants.items()))
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def record(names: list[str], tenants: dict[str, list[str]] | None = None) -> bytes:
    """What the pools hash holds for a pool (``parse_live`` reads it): the JSON list of its
    handler names, or, where some are kept to tenants (``@handler(name, tenants=...)``),
    ``{"handlers": [...], "tenants": {name: [tenant, ...]}}``."""
    if not tenants:
        return orjson.dumps(sorted(names))
    return orjson.dumps({"handlers": sorted(names), "tenants": tenants})


def heartbeat(client: redis.Redis, keys: Keys, pool: str, names: list[str], instance: str,
              ttl_ms: int) -> None:
    """register.lua, for a pool made live by hand (the tests'): a worker process registers
    through its ``Scripts.register``, which sends the script's flags where Redis reads them.
    Sent without them, as a producer sends scripts: on any Redis, and while it is full."""
    # by name, as Scripts.register builds them (the slots register.lua's header declares)
    slots = KEYS.register(pools=keys.pools, live=keys.pool_live)
    client.eval(source("register", flags=False), len(slots), *slots, *ARGV.register(
        pool=pool, names=record(names), member=Keys.pool_member(pool, instance),
        ttl_ms=ttl_ms))


def leave(client: redis.Redis, keys: Keys, pool: str, instance: str) -> None:
    client.zrem(keys.pool_live, Keys.pool_member(pool, instance))


def registered(client: redis.Redis, keys: Keys, now_ms: int) -> set[str]:
    """The worker processes (by instance name) whose pool is live at ``now_ms`` (Redis time):
    those whose handlers a stage can be routed to now."""
    # ZRANGE, not ZRANGEBYSCORE: the producer's Redis user (the operators' views) has it
    members: Any = client.zrange(keys.pool_live, 0, -1, withscores=True)
    return {_text(m).partition("/")[2] for m, expiry in members if expiry > now_ms}


@dataclass(frozen=True)
class Live:
    """The live pools at one moment: ``pools`` sorted; ``routes`` handler name -> 1-based
    indexes into ``pools`` (the form take.lua reads); ``tenants`` handler name -> the only
    tenants it is staged for (those every live pool that has it serves; absent: every
    tenant)."""

    pools: tuple[str, ...] = ()
    routes: dict[str, list[int]] = field(default_factory=dict)
    tenants: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def routes_json(self) -> bytes:
        # an empty Lua table would encode as [] and decode fine either way
        return orjson.dumps(self.routes)

    def has(self, name: str) -> bool:
        return name in self.routes

    def admits(self, name: str, tenant: str) -> bool:
        kept = self.tenants.get(name)
        return kept is None or tenant in kept


def queue_live(pipe: Any, keys: Keys) -> None:
    """Queue what ``parse_live`` reads: one round trip, any client or pipeline kind."""
    pipe.execute_command("TIME")  # not time(): redis-py's cluster pipeline blocks that name
    pipe.zrange(keys.pool_live, 0, -1, withscores=True)
    pipe.hgetall(keys.pools)


def parse_live(replies: list[Any]) -> Live:
    (sec, usec), members, names = replies[:3]
    now = int(sec) * 1000 + int(usec) // 1000
    live = sorted({_text(m).partition("/")[0] for m, expiry in members if expiry > now})
    routes: dict[str, list[int]] = {}
    kept: dict[str, frozenset[str]] = {}
    for index, pool in enumerate(live, start=1):
        raw = names.get(pool.encode()) or names.get(pool)
        found = orjson.loads(raw) if raw else []
        handlers, tenants = (found, {}) if isinstance(found, list) else \
            (found.get("handlers", []), found.get("tenants", {}))
        for name in handlers:
            routes.setdefault(name, []).append(index)
            if name in tenants:
                # a task may go to any pool that has the name: only what all serve is staged
                here = frozenset(tenants[name])
                kept[name] = kept[name] & here if name in kept else here
    return Live(tuple(live), routes, kept)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def queue_write_check(pipe: Any, keys: Keys) -> None:
    """Queue a write that changes nothing (a score for existing members only: none) and that
    Redis refuses, as every write that may grow memory, while it is full: where no live worker
    has a handler, its reply (OOM) tells a Redis that is full, which is then what to say."""
    pipe.execute_command("ZADD", keys.pool_live, "XX", 0, "")


def read_live(client: redis.Redis, keys: Keys) -> Live:
    pipe = client.pipeline(transaction=False)
    queue_live(pipe, keys)
    return parse_live(pipe.execute())


class LiveView:
    """``read_live`` cached for ``max_age_s``; thread-safe."""

    def __init__(self, client: redis.Redis, keys: Keys, max_age_s: float = 2.0) -> None:
        self.client = client
        self.keys = keys
        self.max_age_s = max_age_s
        self._live = Live()
        self._at = -1e9
        self._lock = threading.Lock()

    def get(self, fresh: bool = False) -> Live:
        with self._lock:
            if fresh or time.monotonic() - self._at > self.max_age_s:
                self._live = read_live(self.client, self.keys)
                self._at = time.monotonic()
            return self._live
