"""Handler tasks go through our Redis streams broker, the one task broker there is: in the
state's Redis by default (``take.lua`` then enqueues a task in the same step as its lease), in
a Redis of its own with ``DRAMATIQ_URL``; a URL of another broker is refused, not served
(docs/benchmarks.md says why there is no RabbitMQ task broker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis

from pending_actions.broker.context import Context
from pending_actions.broker.errors import ConfigError
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.workers.taskbroker import StreamsBroker
from pending_actions.workers.tasks import task_broker
from tests.support.faults import FAST
from tests.support.procs import Worker

STATE = "redis://127.0.0.1:1/0"  # never connected to: building a broker sends nothing


@pytest.fixture(autouse=True)
def encoder() -> Iterator[None]:
    before = dramatiq.get_encoder()  # task_broker sets the process's encoder
    yield
    dramatiq.set_encoder(before)


def broker_for(dramatiq_url: str | None = None) -> tuple[Context, Any]:
    ctx = Context.create(Settings(redis_url=STATE, dramatiq_url=dramatiq_url), role="worker")
    return ctx, task_broker(ctx)


def test_default_is_the_streams_broker_in_the_state_redis() -> None:
    ctx, broker = broker_for()
    assert type(broker) is StreamsBroker
    assert broker.client is ctx.client  # the take enqueues its task itself


def test_a_redis_of_its_own_is_the_streams_broker_there() -> None:
    ctx, broker = broker_for(dramatiq_url="redis://127.0.0.1:2/0")
    assert type(broker) is StreamsBroker
    assert broker.client is not ctx.client
    assert broker.client.connection_pool.connection_kwargs["port"] == 2


@pytest.mark.parametrize("url", ["amqp://guest:guest@127.0.0.1:5672/",
                                 "amqps://guest:guest@127.0.0.1:5671/"])
def test_another_broker_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="redis://"):
        broker_for(dramatiq_url=url)


def test_tasks_in_a_redis_of_their_own(tmp_path: Path) -> None:
    """``DRAMATIQ_URL`` naming another Redis: the resolve worker sends each task there, to its
    pool's stream, and the handler's outcome comes back as on the default path."""
    server = EmbeddedRedis(directory=tmp_path / "redis").start()
    state, tasks = (f"redis://127.0.0.1:{server.port}/{db}" for db in (0, 1))
    worker = Worker(state, overrides={**FAST, "dramatiq_url": tasks})
    pa = PendingActions.from_url(state, resolve_timeout_s=30)
    try:
        worker.start()
        first = pa.stage(session="s", tool="edit", label="A", apply="t.ok")
        done = pa.resolve(session="s", action="apply", reason="r")
        assert (done.is_error, done.text) == (False, f"applied {first}")
        # the task went through its pool's stream in the other database, none through the
        # partitions' task streams in the state's
        other = redis.Redis.from_url(tasks)
        try:
            there = {k: other.type(k) for k in other.scan_iter(match="pa:dq:pending-actions.*")}
        finally:
            other.close()
        assert there and set(there.values()) == {b"stream"}, there
        assert list(pa.client.scan_iter(match="pa:{*}:dq:*")) == []
    finally:
        pa.close()
        worker.kill()
        server.kill()
