"""Operator views across sessions through the real CLI: ``ls --all``, ``dead --all``, ``stats``
as a table, and ``top`` refreshing in place."""

from __future__ import annotations

import subprocess
import sys
import uuid

import orjson
import redis

from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from tests.support.procs import worker_env


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args], env=worker_env(url),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_ls_and_dead_across_sessions(pa: PendingActions, redis_server: EmbeddedRedis,
                                     rc: redis.Redis) -> None:
    tenant = f"ops-{uuid.uuid4().hex[:6]}"
    s1, s2 = f"ops-{uuid.uuid4().hex[:8]}", f"ops-{uuid.uuid4().hex[:8]}"
    a = pa.stage(session=s1, tool="edit", label="a", apply="t.ok", tenant=tenant)
    b = pa.stage(session=s2, tool="shell", label="b", apply="t.ok", tenant=tenant)
    c = pa.stage(session=s1, tool="edit", label="c", apply="t.ok", tenant=tenant)
    out = cli(redis_server.url, "--json", "ls", "--all", "--tenant", tenant)
    assert out.returncode == 0, out.stderr
    assert [(x["session"], x["id"]) for x in orjson.loads(out.stdout)] == \
        [(s1, c), (s2, b), (s1, a)]
    everything = orjson.loads(cli(redis_server.url, "--json", "ls", "--all").stdout)
    assert {a, b, c} <= {x["id"] for x in everything}
    text = cli(redis_server.url, "ls", "--all", "--tenant", tenant).stdout
    assert text.splitlines()[0].startswith(f"{s1}  {c}  pending")
    assert cli(redis_server.url, "ls").returncode == 2  # neither --session nor --all
    assert cli(redis_server.url, "ls", "--all", "--session", s1).returncode == 2
    # a dead letter as recover.lua writes it (the fault tests make real ones; this is the view)
    rc.rpush(pa.ctx.keys.dead(s2), orjson.dumps({"id": b, "reason": "lost 3 times",
                                                 "stalls": 3}))
    dead = orjson.loads(cli(redis_server.url, "--json", "dead", "--all", "--tenant",
                            tenant).stdout)
    assert dead == [{"session": s2, "id": b, "reason": "lost 3 times", "stalls": 3}]
    assert f"{s2}  {b}  lost 3 times" in cli(redis_server.url, "dead", "--all").stdout


def test_stats_table_and_top(pa: PendingActions, redis_server: EmbeddedRedis) -> None:
    tenant = f"top-{uuid.uuid4().hex[:6]}"
    session = f"top-{uuid.uuid4().hex[:8]}"
    pa.stage(session=session, tool="deploy", label="x", apply="t.ok", tenant=tenant)
    table = cli(redis_server.url, "stats").stdout
    assert "figure" in table and "pending" in table
    row = next(line for line in table.splitlines() if line.startswith(tenant + " "))
    assert row.split()[:4] == [tenant, "1", "0", "0"]
    assert any(line.split() == [tenant, "deploy", "1"] for line in table.splitlines())
    # what stats counts is said for what it is: ids reserved (in blocks), not stages
    assert "ids reserved (all time)" in table and "staged (all time)" not in table
    top = cli(redis_server.url, "top", "--iterations", "2", "--interval", "0.2").stdout
    frames = top.split("pending-actions top")[1:]
    assert len(frames) == 2
    assert "staged/s" in frames[1] and "recent events" in frames[1]
    assert tenant in frames[1]


def test_tops_rates_count_the_stages_in_the_feed(pa: PendingActions) -> None:
    """top's staged/s is stages (the feed's ``staged`` entries), not ids reserved: a new
    producer process reserves a block of ids for its first stage."""
    from pending_actions.cli.top import feed_rates

    def now_ms() -> int:
        seconds, micros = pa.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    since = now_ms()
    fresh = PendingActions.from_url(pa.settings.require_url())  # ids of its own, in blocks
    session = f"rate-{uuid.uuid4().hex[:8]}"
    for n in range(3):
        fresh.stage(session=session, tool="edit", label=f"r{n}", apply="t.ok")
    fresh.close()
    until = now_ms()
    rates = feed_rates(pa, since, until)
    seconds = max(until - since, 1) / 1000
    assert round(rates["staged"] * seconds) == 3, rates
