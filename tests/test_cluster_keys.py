"""CONTRACT 4.4: every key a script touches is passed in KEYS and lives in one cluster slot.
Watches real traffic of all processes with MONITOR while the whole flow runs, and checks each
EVALSHA and EVAL (scripts sent on pipelines): its keys hash to a single slot, and session keys
carry the session's hash tag."""

from __future__ import annotations

import re
import threading
from collections import Counter

import redis
from redis.crc import key_slot

from pending_actions.producers import PendingActions

TAG = re.compile(r"\{([^}]*)\}")
ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')  # one quoted argument of a MONITOR line


def test_every_script_call_stays_in_one_slot(pa: PendingActions, rc: redis.Redis) -> None:
    calls: list[list[str]] = []
    ready = threading.Event()
    stop = threading.Event()
    url = pa.settings.redis_url or ""

    def watch() -> None:
        with redis.Redis.from_url(url).monitor() as m:
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

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    ready.wait(5)
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
    rc.get("stop-monitor")
    t.join(10)
    seen = Counter[int]()
    assert {p[0].upper() for p in calls} == {"EVAL", "EVALSHA"}, "both ways of sending scripts"
    for parts in calls:
        numkeys = int(parts[2])
        keys = parts[3:3 + numkeys]
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, keys
        tags = {m.group(1) for k in keys for m in [TAG.search(k)] if m}
        if tags == {"beats"}:  # a worker loop's beat: its own slot, no session's
            continue
        assert tags <= {s}, keys
        seen[numkeys] += 1
    # stage x2, take x5, begin x4, finalize/readd x4, slots, reads
    assert sum(seen.values()) >= 20, seen
