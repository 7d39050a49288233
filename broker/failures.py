"""What redis-py raises, turned into this package's errors (``broker/errors.py``), so that no
raw redis-py exception reaches a caller of the library or a user of the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis
from redis import exceptions as rx

from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.errors import (
    ConfigError,
    Forbidden,
    PendingActionsError,
    Poison,
    RedisFull,
    RedisUnavailable,
)
from pending_actions.broker.urls import shown

POISON_PREFIX = "POISON "
# what redis-py raises: its cluster client also raises RedisClusterException, which is not a
# RedisError (a slot table it cannot complete mid-failover: "All slots are not covered")
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, rx.RedisClusterException)


def poison_of(exc: BaseException) -> Poison | None:
    """The Poison a script stopped with (prelude's ``poison()``), if that is what ``exc`` is.
    A script's error reply is the same on every Redis (``broker/atomic/source.py`` runs each inside
    pcall): ``POISON <what> <key> <field>`` for a record that does not parse, a command's own
    error with its code (``OOM ...``: redis-py's OutOfMemoryError, RedisFull below), ``ERR``
    and Lua's message for anything else."""
    text = str(exc)
    if not isinstance(exc, rx.ResponseError) or POISON_PREFIX not in text:
        return None
    # a cluster pipeline of an older redis-py puts the command before it, a script's body (and
    # its poison()) included
    parts = text[text.rindex(POISON_PREFIX) + len(POISON_PREFIX):].split(" ")
    what, key, field = [*parts, "", "", ""][:3]
    return Poison(what, key, field)


def cluster_node(url: str = "") -> ConfigError:
    """A single-node client reached a node of a Redis Cluster: it can reach only the keys of
    that node's slots, and every other key answers MOVED. Never worked around (by following
    the redirect): the URL says which topology is meant, and a cluster needs its own URL."""
    where = f" at {shown(url)}" if url else ""
    parts = urlsplit(url)
    # the same node and credentials as a cluster's startup node (a cluster has database 0 only)
    example = (f", e.g. {shown(f'{parts.scheme}+cluster://{parts.netloc}/')}"
               if parts.scheme in ("redis", "rediss") and parts.netloc else "")
    return ConfigError(f"the Redis{where} is a node of a Redis Cluster: name the cluster with "
                       f"a redis+cluster:// URL (rediss+cluster:// for TLS){example}")


def translate(exc: BaseException, url: str = "", tls: bool = False) -> PendingActionsError:
    """The package error for a redis-py (or URL parsing) error. ``tls``: the client was asked
    for TLS (so is any client of a ``rediss`` ``url``)."""
    where = f" at {shown(url)}" if url else ""
    tls = tls or url.startswith("rediss")
    if isinstance(exc, PendingActionsError):
        return exc
    if isinstance(exc, rx.RedisClusterException) and isinstance(
            exc.__cause__, rx.AuthenticationError | rx.AuthenticationWrongNumberOfArgsError):
        exc = exc.__cause__  # no startup node took the credentials
    if isinstance(exc, rx.OutOfMemoryError) or str(exc).startswith("OOM "):
        return RedisFull(f"Redis{where} is full (maxmemory reached); nothing was changed")
    if isinstance(exc, rx.AuthenticationError | rx.AuthenticationWrongNumberOfArgsError):
        return Forbidden(f"Redis{where} refused the credentials: {exc}")
    if isinstance(exc, rx.NoPermissionError) or "can't run this command" in str(exc):
        return Forbidden(f"the Redis user lacks a permission: {exc} "
                         "(see `pending-actions acl --role ...`)")
    # (a cluster client follows these itself: one reaches here from a single-node client only)
    if isinstance(exc, rx.MovedError | rx.AskError):
        return cluster_node(url)
    if isinstance(exc, rx.InvalidResponse) or "Protocol error" in str(exc):
        return RedisUnavailable(f"the server{where} does not speak the Redis protocol ({exc})")
    if isinstance(exc, TRANSIENT):
        return RedisUnavailable(f"Redis{where} is unavailable: {exc}{_over_tls(exc, tls)}")
    if isinstance(exc, rx.RedisClusterException):
        return RedisUnavailable(f"the Redis Cluster{where} is unavailable: {exc}"
                                f"{_over_tls(exc, tls)}")
    if "DB index is out of range" in str(exc) or "invalid DB index" in str(exc):
        return ConfigError(f"the database number in the Redis URL{where} does not exist "
                           f"on that server ({exc})")
    if isinstance(exc, ValueError):  # redis-py's URL parser
        return ConfigError(f"bad Redis URL {shown(url)!r}: {exc}")
    found = poison_of(exc)
    if found is not None:
        return found
    return RedisUnavailable(f"Redis{where} answered with an error: {exc}")


def _over_tls(exc: BaseException, tls: bool) -> str:
    # TLS is never dropped for a server that lacks it (broker/urls.py): such a server takes
    # the handshake for a command that has not ended, and the connection times out
    if tls and "connecting to" in str(exc):
        return " (over TLS: a server that does not speak TLS never completes the handshake)"
    return ""


@contextmanager
def redis_errors(url: str = "", tls: bool = False) -> Iterator[None]:
    """Raise every redis-py error inside as the package error ``translate`` gives."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise translate(exc, url, tls) from exc
