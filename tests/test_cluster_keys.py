"""CONTRACT 4.4: every key a script touches is passed in KEYS and lives in one cluster slot.
Watches real traffic of all processes with MONITOR (on every master of a cluster) while the
whole flow runs, and checks each EVALSHA and EVAL (scripts sent on pipelines): its keys hash to
a single slot, all carry the hash tag of the session's partition, and a session's keys name
the session. On a real cluster a script breaking this would also fail with CROSSSLOT."""

from __future__ import annotations

import re
import threading
import uuid
from collections import Counter

import pytest
import redis
from redis.crc import key_slot

from pending_actions.broker.errors import Denied
from pending_actions.producers import PendingActions
from tests.conftest import Deployment, both
from tests.support.faults import wait_history
from tests.support.replies import command_calls, tail_id

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
    # a tenant with a policy (set before the watch: setting one writes the {policies} slot and
    # a marker in every partition's): its stages and people's approvals are watched below
    tenant = f"slots-{uuid.uuid4().hex[:6]}"
    pa.set_policy({"rules": [
        {"name": "two", "match": {"tool": "deploy"}, "decision": "ask", "approvals": 2},
        {"name": "reads", "match": {"tool": "read"}, "decision": "allow", "auto": True},
        {"name": "no-rm", "match": {"tool": "rm"}, "decision": "deny"}]}, tenant=tenant)
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
    ps = f"slots:policy-{tenant}"
    pa.stage(session=ps, tool="deploy", label="d", apply="t.ok", tenant=tenant)
    assert pa.resolve(session=ps, action="apply", reason="r").text.startswith("Needs approval")
    assert pa.resolve(session=ps, action="apply", reason="r", approver="a").text.startswith(
        "Approved 1 of 2")
    assert not pa.resolve(session=ps, action="apply", reason="r", approver="b").is_error
    since = tail_id(deployment.rc, pa.ctx.keys.history(ps))
    pa.stage(session=ps, tool="read", label="r", apply="t.ok", tenant=tenant)
    wait_history(deployment.rc, ps, "applied", since)
    with pytest.raises(Denied):
        pa.stage(session=ps, tool="rm", label="x", apply="t.ok", tenant=tenant)
    stop.set()
    for port in deployment.monitor_ports:
        redis.Redis(port=port).echo("stop-monitor")
    for t in watchers:
        t.join(10)
    keys_ = pa.ctx.keys
    tag = keys_.tags[keys_.partition(s)]
    policy_tag = keys_.tags[keys_.partition(ps)]
    seen = Counter[int]()
    assert {p[0].upper() for p in calls} == {"EVAL", "EVALSHA"}, "both ways of sending scripts"
    for parts in calls:
        numkeys = int(parts[2])
        keys = parts[3:3 + numkeys]
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, keys
        tags = {m.group(1) for k in keys for m in [TAG.search(k)] if m}
        # a worker loop's beat, a worker's registration of its pool (register.lua, every
        # REGISTER interval: the longer the watch, the likelier one falls in it): global keys
        # in a slot of their own, no session's
        if tags in ({"beats"}, {"registry"}):
            continue
        assert tags in ({tag}, {policy_tag}), keys
        named = {x for x in (s, ps) for k in keys if f":s:{x}:" in k}
        assert len(named) <= 1 and all(":s:" not in k or named for k in keys), keys
        seen[numkeys] += 1
    # stage x2, take x5, begin x4, finalize/readd x4, slots, reads
    assert sum(seen.values()) >= 20, seen


def test_no_round_trip_asks_a_server_for_keys(clustered: Deployment) -> None:
    """redis-py's cluster client asks a server for the keys of a command with movable keys
    (COMMAND GETKEYS: every EVALSHA on its pipeline, every XREADGROUP) before sending it, a
    round trip more each; staging and resolving, in the caller and in the workers, send none."""
    pa = clustered.pa
    masters = [redis.Redis(port=port) for port in clustered.monitor_ports]
    for m in masters:
        m.config_resetstat()
    sessions = [f"getkeys-{i}" for i in range(6)]
    pa.stage_many({"session": s, "tool": "edit", "label": "a", "apply": "t.ok"}
                  for s in sessions)
    for s in sessions:
        pa.stage(session=s, tool="edit", label="b", apply="t.ok")
        assert not pa.resolve(session=s, action="apply", reason="r").is_error
        assert not pa.resolve(session=s, action="discard", reason="r").is_error
        assert pa.pending(s) == []
    asked = {m.connection_pool.connection_kwargs["port"]:
             command_calls(m).get("command|getkeys", 0) for m in masters}
    ran = sum(command_calls(m).get("evalsha", 0) for m in masters)
    for m in masters:
        m.close()
    assert ran >= 4 * len(sessions), "the scripts went by digest"
    assert asked == dict.fromkeys(asked, 0), asked
