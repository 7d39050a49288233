"""What a Redis URL says, read here once for every client made from one: the blocking and the
asyncio client, of a single Redis or of a cluster. TLS, the user and password, the database and
the query string's options (timeouts and the like) come out the same for all four, as the
keyword arguments redis-py's constructors take.

``redis://`` / ``rediss://`` / ``unix://`` name a single Redis and read as redis-py reads them.
``redis+cluster://[user:password@]host1:port1,host2:port2/`` (or ``rediss+cluster://``) names a
Redis Cluster through any of its listed startup nodes; what follows the node list reads as in
a single Redis's URL (a cluster has database 0 only)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from pending_actions.broker.errors import ConfigError

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
# the query string's options a client takes: those of redis-py's own client, but what the URL
# itself says (host, port, ...) and what is no option of a connection
_OPTIONS = frozenset(inspect.signature(redis.Redis.__init__).parameters) - {
    "self", "host", "port", "unix_socket_path", "connection_pool", "single_connection_client",
    "redis_connect_func", "event_dispatcher", "cache", "cache_config",
}


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def shown(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


@dataclass(frozen=True)
class UrlOptions:
    nodes: tuple[tuple[str, int], ...]  # a cluster's startup nodes; () for a single Redis
    # keyword arguments of every client: host and port or unix_socket_path (a single Redis),
    # ssl, username, password, db (a single Redis) and the query string's options
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def cluster(self) -> bool:
        return bool(self.nodes)

    @property
    def tls(self) -> bool:
        return bool(self.options.get("ssl"))


def url_options(url: str) -> UrlOptions:
    """What ``url`` says; ``ConfigError`` (one line, without the password) when it is not a
    Redis URL we take."""
    scheme, sep, _rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ConfigError(f"bad Redis URL {shown(url)!r}: it must start with redis://, rediss://, "
                          "unix://, redis+cluster:// or rediss+cluster://")
    try:
        return _read(url, scheme)
    except ValueError as exc:  # redis-py's parser: a query option that does not parse
        raise ConfigError(f"bad Redis URL {shown(url)!r}: {exc}") from None


def _read(url: str, scheme: str) -> UrlOptions:
    nodes: tuple[tuple[str, int], ...] = ()
    single = url
    if scheme in CLUSTER_SCHEMES:
        parts = urlsplit(url)
        credentials, at, hosts = parts.netloc.rpartition("@")
        nodes = tuple(_node(hostport, url) for hostport in hosts.split(","))
        # the rest reads as the URL of one node would
        single = urlunsplit((scheme.removesuffix("+cluster"),
                             credentials + at + hosts.split(",")[0], parts.path, parts.query,
                             parts.fragment))
    options: dict[str, Any] = parse_url(single)  # type: ignore[no-untyped-call]
    unknown = sorted(set(options) - _OPTIONS - {"host", "port", "path", "connection_class"})
    if unknown:
        raise ConfigError(f"bad Redis URL {shown(url)!r}: unknown option {unknown[0]!r}")
    connection = options.pop("connection_class", None)
    if connection is SSLConnection:
        options["ssl"] = True
    elif connection is UnixDomainSocketConnection:
        if not options.get("path"):
            raise ConfigError(f"bad Redis URL {shown(url)!r}: no socket path")
        options["unix_socket_path"] = options.pop("path")
    if nodes:
        del options["host"]
        options.pop("port", None)
        if options.pop("db", 0) != 0:
            raise ConfigError(f"bad Redis URL {shown(url)!r}: a Redis Cluster has database 0 "
                              "only")
    return UrlOptions(nodes, options)


def _node(hostport: str, url: str) -> tuple[str, int]:
    host, _, port = hostport.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"bad Redis URL {shown(url)!r}: expected host:port in {hostport!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)
