"""One reading of a Redis URL (``broker/urls.py``) for every client: the blocking and the asyncio
one, on a single Redis and on a cluster. TLS asked for is never dropped (a ``rediss`` URL to a
plaintext server fails, its first bytes a TLS handshake); the credentials, the database and the
timeouts of the URL reach each client. Against real plaintext redis-servers, behind a proxy
that keeps each connection's first bytes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from pending_actions import AsyncPendingActions, ConfigError, PendingActions, RedisUnavailable
from pending_actions.broker.connection import producer_client
from pending_actions.broker.errors import Forbidden
from pending_actions.broker.keys import Keys
from pending_actions.broker.urls import url_options
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from pending_actions_harness.embedded_cluster import Cluster
from tests.support.procs import worker_env
from tests.support.proxy import ChaosProxy

pytestmark = pytest.mark.redis62  # .ci/run runs it again on Redis 6.2

K = Keys()
TLS_RECORD = b"\x16\x03"  # a TLS handshake record: what a ClientHello starts with


def sync_pending(url: str, session: str = "") -> Any:
    pa = PendingActions.from_url(url)  # (a cluster client reads its slot table here)
    try:
        return pa.pending(session or f"s-{uuid.uuid4().hex[:8]}")
    finally:
        pa.close()


def async_pending(url: str) -> Any:
    async def main() -> Any:
        async with AsyncPendingActions.from_url(url) as apa:
            return await apa.pending(f"s-{uuid.uuid4().hex[:8]}")

    return asyncio.run(main())


CLIENTS = {"sync": sync_pending, "async": async_pending}


@pytest.fixture(params=["single", "cluster"])
def behind_proxy(request: pytest.FixtureRequest) -> Iterator[tuple[str, ChaosProxy]]:
    """("redis" or "redis+cluster", a proxy to a real plaintext server or cluster node)."""
    if request.param == "single":
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        scheme, port = "redis", server.port
    else:
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        scheme, port = "redis+cluster", cluster.master_ports()[0]
    proxy = ChaosProxy(port)
    yield scheme, proxy
    proxy.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_tls_asked_for_is_never_dropped(behind_proxy: tuple[str, ChaosProxy],
                                        client: str) -> None:
    scheme, proxy = behind_proxy
    # a server without TLS never answers a handshake: each try of the client's waits it out
    # (redis-py's blocking client for its socket timeout, 15 s by default, its asyncio one for
    # its connect timeout)
    plain = f"{scheme}://127.0.0.1:{proxy.port}/?socket_connect_timeout=0.2&socket_timeout=0.5"
    tls = plain.replace("redis", "rediss", 1)
    with pytest.raises(RedisUnavailable) as refused:
        CLIENTS[client](tls)
    text = str(refused.value)
    assert "\n" not in text and "TLS" in text, text
    assert proxy.openings, "no connection was made"
    assert all(first.startswith(TLS_RECORD) for first in proxy.openings), proxy.openings

    # the same server, asked in plaintext, answers; the proxy tells the two apart
    proxy.openings.clear()
    assert CLIENTS[client](plain) == []
    assert proxy.openings and proxy.openings[0].startswith(b"*"), proxy.openings


@pytest.fixture(params=["single", "cluster"])
def with_user(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    """(a URL with a fresh ACL user's credentials, the same with a wrong password, its host
    list), the user made on every node."""
    if request.param == "single":
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        clients, scheme = [redis.Redis(port=server.port)], "redis"
        hosts = f"127.0.0.1:{server.port}"
    else:
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        clients = [node.client() for node in cluster.live_nodes()]
        scheme = "redis+cluster"
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in cluster.live_nodes())
    user, password = f"u-{uuid.uuid4().hex[:8]}", "p@ss:w/rd"  # percent-encoded in the URL
    for c in clients:
        c.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                      channels=["*"], commands=["+@all"])
    yield (f"{scheme}://{user}:p%40ss%3Aw%2Frd@{hosts}/",
           f"{scheme}://{user}:wrong@{hosts}/", hosts)
    for c in clients:
        c.acl_deluser(user)
        c.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_credentials_reach_every_client(with_user: tuple[str, str, str], client: str) -> None:
    good, wrong, _hosts = with_user
    assert CLIENTS[client](good) == []
    with pytest.raises(Forbidden) as refused:  # on a cluster too: no node took them
        CLIENTS[client](wrong)
    text = str(refused.value)
    assert "\n" not in text and "refused the credentials" in text and "wrong" not in text, text


def test_database_and_timeouts_reach_every_client(redis_server: EmbeddedRedis,
                                                  redis_cluster: Cluster) -> None:
    single = f"redis://127.0.0.1:{redis_server.port}/3?socket_timeout=7"
    nodes = ",".join(f"127.0.0.1:{p}" for p in redis_cluster.master_ports())
    cluster = f"redis+cluster://{nodes}/?socket_timeout=7"

    pa = PendingActions.from_url(single)
    assert pa.client.client_info()["db"] == 3
    assert pa.client.connection_pool.connection_kwargs["socket_timeout"] == 7.0
    pa.close()
    pa = PendingActions.from_url(cluster)
    assert pa.client.ping()
    assert pa.client.nodes_manager.connection_kwargs["socket_timeout"] == 7.0  # type: ignore[attr-defined]
    pa.close()

    async def main() -> None:
        async with AsyncPendingActions.from_url(single) as apa:
            assert (await apa.client.client_info())["db"] == 3
            assert apa.client.connection_pool.connection_kwargs["socket_timeout"] == 7.0
        async with AsyncPendingActions.from_url(cluster) as apa:
            assert await apa.client.ping()
            assert apa.client.connection_kwargs["socket_timeout"] == 7.0  # type: ignore[attr-defined]

    asyncio.run(main())

    # a cluster has database 0 only: a URL that names another is refused, by both clients
    for make in (PendingActions.from_url, AsyncPendingActions.from_url):
        with pytest.raises(ConfigError, match="database 0"):
            make(f"redis+cluster://{nodes}/3")


@pytest.mark.parametrize(("url", "nodes", "options"), [
    ("redis://h:1/2", (), {"host": "h", "port": 1, "db": 2}),
    ("rediss://u:p%40w@h:1", (), {"host": "h", "port": 1, "ssl": True, "username": "u",
                                  "password": "p@w"}),
    ("unix:///tmp/r.sock?db=1", (), {"unix_socket_path": "/tmp/r.sock", "db": 1}),
    ("redis+cluster://a:1,b:2/", (("a", 1), ("b", 2)), {}),
    ("rediss+cluster://u:p@a:1,[::1]:2/0?socket_timeout=3&ssl_cert_reqs=none",
     (("a", 1), ("::1", 2)),
     {"ssl": True, "username": "u", "password": "p", "socket_timeout": 3.0,
      "ssl_cert_reqs": "none"}),
])
def test_what_a_url_says(url: str, nodes: tuple[tuple[str, int], ...],
                         options: dict[str, Any]) -> None:
    read = url_options(url)
    assert read.nodes == nodes and read.options == options


@pytest.mark.parametrize(("url", "says"), [
    ("http://h:1", "must start with"),
    ("h:6379", "must start with"),
    ("redis+cluster://u:secret@a:1,b/", "expected host:port in 'b'"),
    ("rediss+cluster://u:secret@a:1/5", "database 0"),
    ("unix://", "socket path"),
    ("redis://h:1/?socket_timout=3", "unknown option 'socket_timout'"),
    ("redis://h:1/?socket_timeout=soon", "socket_timeout"),
])
def test_a_bad_url_is_one_clear_line_without_its_password(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as bad:
        url_options(url)
    text = str(bad.value)
    assert says in text and "secret" not in text and "\n" not in text, text
    # and both clients refuse it the same way, before any connection
    for make in (PendingActions.from_url, AsyncPendingActions.from_url):
        with pytest.raises(ConfigError) as again:
            make(url)
        assert str(again.value) == text


def _owned_elsewhere(node: Any, keys: Keys) -> str:
    """A session whose keys live in a slot this node does not serve (it answers MOVED)."""
    me = node.execute_command("CLUSTER", "MYID")
    mine = [range(int(lo), int(hi) + 1) for lo, hi, (_h, _p, owner, *_r), *_replicas
            in node.execute_command("CLUSTER", "SLOTS") if owner == me]
    for n in range(1000):
        session = f"elsewhere-{n}"
        slot = node.execute_command("CLUSTER", "KEYSLOT", keys.stack(session))
        if not any(slot in r for r in mine):
            return session
    raise AssertionError("every session hashed to one node")


def test_a_cluster_node_under_a_plain_url_is_named_in_one_line(redis_cluster: Cluster,
                                                               redis_server: EmbeddedRedis) -> None:
    """A plain redis:// URL to a node of a cluster: a worker refuses to start (it would have
    served nothing, its consumer restarting on MOVED for ever), and a client's call that meets
    another node's key says what URL to use; both in one line, exit 2, nothing written."""
    port = redis_cluster.master_ports()[0]
    plain = f"redis://127.0.0.1:{port}/0"
    node = redis_cluster.node(port).client()
    # what a worker that started would have written first: its lifecycle event and its beats
    whole: Any = producer_client(redis_cluster.url)
    workers_before = (whole.xlen(K.workers), set(whole.zrange(K.beat_procs, 0, -1)))
    whole.close()

    started = subprocess.run([sys.executable, "-m", "pending_actions", "worker",
                              "--redis-url", plain], env=worker_env(redis_cluster.url),
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert started.returncode == 2, started
    assert started.stderr.count("\n") == 1 and "redis+cluster://127.0.0.1:" in started.stderr, \
        started.stderr
    assert "node of a Redis Cluster" in started.stderr, started.stderr
    # the same for the Redis of the handler tasks, when it is another
    started = subprocess.run(
        [sys.executable, "-m", "pending_actions", "worker", "--redis-url", redis_server.url],
        env={**worker_env(redis_server.url), "PENDING_ACTIONS_DRAMATIQ_URL": plain}, cwd=ROOT,
        capture_output=True, text=True, timeout=60)
    assert started.returncode == 2, started
    assert started.stderr.count("\n") == 1, started.stderr
    assert f"the Redis at {plain} is a node of a Redis Cluster" in started.stderr, \
        started.stderr

    session = _owned_elsewhere(node, K)
    listed = subprocess.run([sys.executable, "-m", "pending_actions", "ls", "--redis-url",
                             plain, "--session", session], env=worker_env(redis_cluster.url),
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 2, listed
    assert listed.stderr.count("\n") == 1 and "redis+cluster://" in listed.stderr, listed.stderr
    with pytest.raises(ConfigError, match=r"redis\+cluster://"):
        sync_pending(plain, session)
    node.close()
    whole = producer_client(redis_cluster.url)
    assert (whole.xlen(K.workers), set(whole.zrange(K.beat_procs, 0, -1))) == workers_before
    whole.close()
