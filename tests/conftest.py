"""Fixtures against real services: a private redis-server on a free port (AOF, fsync always)
and real worker processes started through the CLI."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from tests.support.procs import Worker


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
def pa(redis_server: EmbeddedRedis, worker: Worker) -> Iterator[PendingActions]:
    client = PendingActions.from_url(redis_server.url, resolve_timeout_s=30)
    yield client
    client.close()


@pytest.fixture
def rc(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"
