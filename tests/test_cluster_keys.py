"""CONTRACT 4.4: every key a script touches is passed in KEYS and lives in one cluster slot.
Watches real traffic of all processes with MONITOR (on every master of a cluster) while the
whole flow runs, and checks each EVALSHA and EVAL (scripts sent on pipelines): its keys hash to
a single slot, all carry the hash tag of the session's partition, and a session's keys name
the session. On a real cluster a script breaking this would also fail with CROSSSLOT."""

from __future__ import annotations

import re
import threading
from collections import Counter

import pytest
import redis
from redis.crc import key_slot

from pending_actions.producers import PendingActions
from tests.conftest import Deployment, both

TAG = re.compile(r"\{([^}]*)\}")
ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')  # one quoted argument of a MONITOR line


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def _watch(port: int, calls: list[list[str]], ready: threading.Event,
           stop: threading.Event) -> None:
    with redis.Redis(port=port).monitor() as m:
        ready.set()
        while True:
            # raw lines: redis-py's parsed form joins arguments with spaces, and a script
            # body sent with EVAL has spaces of its own
            line = m.connection.read_response()
            text = line.decode() if isinstance(line, bytes) else str(line)
            args = ARG.findall(text)
            if args and args[0].upper() in ("EVALSHA", "EVAL"):
                calls.append(args)
            if stop.is_set() and "stop-monitor" in text:
                return


def test_every_script_call_stays_in_one_slot(deployment: Deployment) -> None:
    pa: PendingActions = deployment.pa
    calls: list[list[str]] = []
    stop = threading.Event()
    watchers = []
    for port in deployment.monitor_ports:
        ready = threading.Event()
        t = threading.Thread(target=_watch, args=(port, calls, ready, stop), daemon=True)
        t.start()
        ready.wait(5)
        watchers.append(t)
    s = "slots:test"
    pa.stage(session=s, tool="edit", label="a", apply="t.ok", reject="t.reject_text")
    pa.stage(session=s, tool="edit", label="b", apply="t.toolerror")
    pa.resolve(session=s, action="apply", reason="r")
    pa.resolve(session=s, action="discard", reason="r")
    pa.set_directive(s, tool="plan", label="d", apply="t.ok")
    pa.set_standing(s, tool="mode", label="m", apply="t.ok")
    pa.resolve(session=s, action="apply", reason="r")
    pa.resolve(session=s, action="apply", reason="r")
    pa.resolve(session=s, action="apply", reason="r")
    pa.clear_standing(s)
    pa.pending(s)
    pa.next_tool_choice(s)
    stop.set()
    for port in deployment.monitor_ports:
        redis.Redis(port=port).echo("stop-monitor")
    for t in watchers:
        t.join(10)
    keys_ = pa.ctx.keys
    tag = keys_.tags[keys_.partition(s)]
    seen = Counter[int]()
    assert {p[0].upper() for p in calls} == {"EVAL", "EVALSHA"}, "both ways of sending scripts"
    for parts in calls:
        numkeys = int(parts[2])
        keys = parts[3:3 + numkeys]
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, keys
        tags = {m.group(1) for k in keys for m in [TAG.search(k)] if m}
        if tags in ({"beats"}, {"events"}):  # a worker loop's beat, a stage's feed entries
            continue  # (feed.lua): one slot of their own, no session's
        assert tags == {tag}, keys
        assert all(f":s:{s}:" in k or ":s:" not in k for k in keys), keys
        seen[numkeys] += 1
    # stage x2, take x5, begin x4, finalize/readd x4, slots, reads
    assert sum(seen.values()) >= 20, seen
