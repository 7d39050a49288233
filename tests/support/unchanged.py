""""Redis unchanged": every key and every value, read before and after a call that must be
refused, compared. A refusal that writes anything (an index entry, a feed entry, a counter)
shows up as a diff naming the key.

Keys that change on their own while a deployment idles (worker heartbeats, the live-handler
registry, housekeeping's and the sweep's cursors and locks) are left out (``live``); pass
``ignore`` to leave out more. Values are read per type (never DUMP: a stream's DUMP carries its
consumers' seen times, which a blocked reader moves without writing anything)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import redis

from pending_actions.broker.keys import Keys

Snapshot = dict[bytes, tuple[str, Any]]



def live(keys: Keys | None = None) -> Callable[[bytes], bool]:
    """The keys a running deployment rewrites by itself: worker registrations and heartbeats,
    lifecycle events, housekeeping's and the in-flight sweep's cursors and locks, the layout
    mark (of ``keys``, the default prefix's when not given)."""
    keys = keys or Keys()
    exact = {k.encode() for k in (keys.pools, keys.pool_live, keys.workers, keys.beat_procs,
                                  keys.housekeeping, keys.housekeeping_lock, keys.layout,
                                  keys.sweep, keys.sweep_lock)}
    beats = keys.beats("").encode()
    return lambda key: key in exact or key.startswith(beats)


READERS: dict[str, Callable[[Any, bytes], Any]] = {
    "string": lambda p, k: p.get(k),
    "hash": lambda p, k: p.hgetall(k),
    "list": lambda p, k: p.lrange(k, 0, -1),
    "set": lambda p, k: p.smembers(k),
    "zset": lambda p, k: p.zrange(k, 0, -1, withscores=True),
    "stream": lambda p, k: p.xrange(k),
}


def snapshot(rc: redis.Redis, ignore: Callable[[bytes], bool] | None = None) -> Snapshot:
    """Every key (SCAN) with its type and its whole value, ``ignore``d keys left out; read in
    two pipelines (types, then values), so a Redis of thousands of keys takes a moment."""
    client: Any = rc  # replies are bytes of every type below
    ignore = ignore or live()
    keys = [k for k in client.scan_iter(count=1000) if not ignore(k)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    read = [(key, kind) for key, kind in zip(keys, kinds, strict=True) if kind in READERS]
    for key, kind in read:
        READERS[kind](pipe, key)
    values = pipe.execute(raise_on_error=False)  # a key gone or retyped meanwhile: a diff
    return {key: (kind, frozenset(v) if isinstance(v, set) else v)
            for (key, kind), v in zip(read, values, strict=True)}


def diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed, one line a key."""
    lines = [f"added {k!r}: {after[k]!r}"[:300] for k in sorted(after.keys() - before.keys())]
    lines += [f"removed {k!r}" for k in sorted(before.keys() - after.keys())]
    lines += [f"changed {k!r}: {before[k]!r} -> {after[k]!r}"[:300]
              for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]
    return lines


@contextlib.contextmanager
def redis_unchanged(rc: redis.Redis,
                    ignore: Callable[[bytes], bool] | None = None) -> Iterator[Snapshot]:
    """``with redis_unchanged(rc): <a call that must be refused>``: fails, naming every key,
    if anything was written."""
    ignore = ignore or live()
    before = snapshot(rc, ignore)
    yield before
    changes = diff(before, snapshot(rc, ignore))
    assert not changes, "Redis changed:\n" + "\n".join(changes[:30])
