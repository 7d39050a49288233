"""The loop runner itself: every kind of error a step can raise is survived (logged, backed
off, gone round again) or ends the process through ``on_fatal``; never a dead loop in a live
process. Beats go to a real Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis import exceptions as rx

from pending_actions.broker.connection_pool import PoolExhausted
from pending_actions.broker.context import Context
from pending_actions.broker.errors import ConfigError
from pending_actions.broker.loops import PROC_TTL_MS, Beats, Loop
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2

SURVIVED = [rx.ConnectionError("gone"), rx.TimeoutError("slow"),
            rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
            rx.ResponseError("UNBLOCKED the stream key no longer exists"),
            rx.ResponseError("POISON state pa:{s}:state x"), ValueError("a bug"),
            KeyError("x")]
FATAL = [rx.AuthenticationError("invalid username-password pair"),
         rx.NoPermissionError("this user has no permissions to run the 'info' command"),
         ConfigError("maxmemory-policy is allkeys-lru")]


@pytest.fixture
def ctx(redis_server: EmbeddedRedis) -> Iterator[Context]:
    c = Context.create(Settings(redis_url=redis_server.url), role="worker")
    yield c
    c.client.close()


def run_steps(ctx: Context, raises: list[BaseException]) -> tuple[Loop, list[str]]:
    """A loop whose step raises each of ``raises`` in turn, then stops the loop."""
    stop = threading.Event()
    fatal: list[str] = []
    left = list(raises)

    def step() -> None:
        if left:
            raise left.pop(0)
        stop.set()

    def on_fatal(_name: str, exc: BaseException) -> None:
        fatal.append(repr(exc))
        stop.set()

    loop = Loop("test", step, stop, every_s=5, beats=Beats(ctx, "proc-test", "test"),
                on_fatal=on_fatal)
    loop.backoff.first = loop.backoff.cap = 0.001
    thread = loop.thread()
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return loop, fatal


def test_every_handled_error_is_survived(ctx: Context) -> None:
    loop, fatal = run_steps(ctx, list(SURVIVED))
    assert fatal == []
    assert loop.errors == len(SURVIVED) and loop.rounds == 1


@pytest.mark.parametrize("exc", FATAL, ids=lambda e: type(e).__name__)
def test_what_cannot_be_handled_ends_the_process(ctx: Context, exc: BaseException) -> None:
    loop, fatal = run_steps(ctx, [rx.ConnectionError("first"), exc])
    assert fatal == [repr(exc)] and loop.rounds == 0


def test_errors_that_keep_coming_end_the_process(ctx: Context) -> None:
    stop = threading.Event()
    fatal: list[str] = []

    def step() -> None:
        raise ValueError("always")

    def on_fatal(name: str, _exc: BaseException) -> None:
        fatal.append(name)
        stop.set()

    loop = Loop("doomed", step, stop, every_s=5, give_up_s=0.2, on_fatal=on_fatal)
    loop.backoff.first = loop.backoff.cap = 0.01
    loop.run()
    assert fatal == ["doomed"] and loop.errors > 1


def test_a_loop_beats_to_redis(ctx: Context, rc: redis.Redis) -> None:
    run_steps(ctx, [])
    beat = rc.hget(ctx.keys.beats("proc-test"), "test")
    assert beat is not None and b'"every":5000' in beat
    # gone with its process: reported as stopped until then, if it never said it stops
    assert 0 < rc.pttl(ctx.keys.beats("proc-test")) <= PROC_TTL_MS


def test_a_pool_without_connections_for_long_ends_the_process(ctx: Context) -> None:
    """No connection to be had from the pool, round after round: connections lost for good
    (waiting brings none back), so the process ends for its supervisor to start afresh; a
    pool that has one again in time is survived, and starts the count afresh."""
    stop = threading.Event()
    fatal: list[str] = []
    rounds: list[str] = ["exhausted", "exhausted", "ok", "exhausted"]

    def step() -> None:
        if not rounds:
            raise PoolExhausted("no free Redis connection")
        if rounds.pop(0) == "exhausted":
            raise rx.MaxConnectionsError("Too many connections")

    def on_fatal(name: str, exc: BaseException) -> None:
        fatal.append(f"{name}: {exc}")
        stop.set()

    loop = Loop("starved", step, stop, every_s=5, on_fatal=on_fatal, exhausted_give_up_s=0.3)
    loop.backoff.first = loop.backoff.cap = 0.05
    started = time.monotonic()
    loop.run()
    assert fatal == ["starved: no free Redis connection"] and loop.rounds == 1
    assert time.monotonic() - started >= 0.3  # the count began again after the round that went
