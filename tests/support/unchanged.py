""""Redis unchanged": every key and every value, read before and after a call that must be refused,
compared. A refusal that writes anything (an index entry, a feed entry, a counter) shows up as
a diff naming the key.

Keys that change on their own while a deployment idles (worker heartbeats, the live-handler
registry, housekeeping's and the sweep's cursors and locks) are left out (``live``); pass
``ignore`` to leave out more. A running attempt's lease is renewed on its own too (renew.lua
moves its deadline, in the session's in-flight record and the partition's lease index): those
are compared without the deadline (``steady``), so a lease made or ended still shows. Values
are read per type (never DUMP: a stream's DUMP carries its consumers' seen times, which a
blocked reader moves without writing anything). A key that is gone after the call because its
TTL ran out meanwhile (an earlier resolve's request marker, say) was not written by the call,
and is no diff; one gone before its time is."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from pending_actions.broker.keys import Keys


@dataclass
class Snapshot:
    """Every key's type and value, and when (``time.monotonic()``) each key with a TTL runs out;
    ``taken``: when the reading ended."""

    values: dict[bytes, tuple[str, Any]] = field(default_factory=dict)
    expires: dict[bytes, float] = field(default_factory=dict)
    taken: float = 0.0


def live(keys: Keys | None = None) -> Callable[[bytes], bool]:
    """The keys a running deployment rewrites by itself: worker registrations and heartbeats,
    lifecycle events, housekeeping's and the in-flight sweep's cursors and locks (of ``keys``,
    the default prefix's when not given)."""
    keys = keys or Keys()
    exact = {k.encode() for k in (keys.pools, keys.pool_live, keys.workers, keys.beat_procs,
                                  keys.housekeeping, keys.housekeeping_lock,
                                  keys.sweep, keys.sweep_lock)}
    beats = keys.beats("").encode()
    return lambda key: key in exact or key.startswith(beats)


def steady(key: bytes, kind: str, value: Any) -> Any:
    """``value`` as a lease renewal leaves it: a lease index without its scores (deadlines), an
    in-flight hash's leases without their deadline (renew.lua re-encodes the whole lease). A
    record that does not parse (a poison test's) is compared as it is."""
    if kind == "zset" and key.endswith(b":leases") and isinstance(value, list):
        return [member for member, _deadline in value]
    if kind == "hash" and key.endswith(b":inflight") and isinstance(value, dict):
        return {token: _without_deadline(lease) for token, lease in value.items()}
    return value


def _without_deadline(lease: bytes) -> Any:
    try:
        record = orjson.loads(lease)
    except orjson.JSONDecodeError:
        return lease
    if not isinstance(record, dict):
        return lease
    record.pop("deadline", None)
    return record


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
        pipe.pttl(key)
    replies = pipe.execute()
    read_at = time.monotonic()  # after the replies: a deadline errs late, never early
    kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in replies[::2]]
    expires = {key: read_at + int(ttl) / 1000 for key, ttl in zip(keys, replies[1::2], strict=True)
               if int(ttl) > 0}
    pipe = client.pipeline(transaction=False)
    read = [(key, kind) for key, kind in zip(keys, kinds, strict=True) if kind in READERS]
    for key, kind in read:
        READERS[kind](pipe, key)
    values = pipe.execute(raise_on_error=False)  # a key retyped meanwhile: a diff
    # a value read as nothing (None, or an empty collection, which Redis never keeps) is of a
    # key gone between the two reads: absent, so that an expiry meanwhile is told as one
    return Snapshot({key: (kind, frozenset(v) if isinstance(v, set) else steady(key, kind, v))
                     for (key, kind), v in zip(read, values, strict=True)
                     if v is not None and v != [] and v != {} and v != set()},
                    expires, time.monotonic())


def diff(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed, one line a key; a key removed once its TTL had run out is no change."""
    old, new = before.values, after.values
    lines = [f"added {k!r}: {new[k]!r}"[:300] for k in sorted(new.keys() - old.keys())]
    lines += [f"removed {k!r}" for k in sorted(old.keys() - new.keys())
              if before.expires.get(k, float("inf")) > after.taken]
    lines += [f"changed {k!r}: {old[k]!r} -> {new[k]!r}"[:300]
              for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
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
