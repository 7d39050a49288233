"""Where the time of one idle resolve goes, step by step, read off Redis's MONITOR feed.

Each traced resolve has a session of its own (nothing else names it). MONITOR stamps every
command with the server's clock (microseconds; Redis 7.0 stamps a command as it starts running
it) and the client that sent it; the caller stamps the call's start and end with the same
machine's clock. So each resolve's commands (those of a client, not of a script, whose
arguments name its session) give the moments it crossed each process: the request written,
the resolve worker's take, the dramatiq worker's begin, its finalize, the caller's return.
Scripts are told apart by their SHA1 (EVALSHA) or their body's (a pipeline's EVAL).

MONITOR makes Redis format and send every command to one more client, so these are a
breakdown of where the time goes, not the idle p50 (the main table has that)."""

from __future__ import annotations

import hashlib
import random
import re
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from pending_actions.broker.atomic.scripts import NAMES, source
from pending_actions.producers import PendingActions
from pending_actions_harness.bench.fill import drop_sessions
from pending_actions_harness.bench.handlers import NOOP
from pending_actions_harness.bench.measure import resolver
from pending_actions_harness.bench.progress import Tick

# (label, from, to): each a milestone; "call" and "return" are the caller's own stamps.
# A write's fsync (appendfsync always) happens before Redis answers it: in the step after it.
STEPS = (
    ("call -> request written", "call", "request"),
    ("request -> take (resolve worker wakes)", "request", "take"),
    ("take -> begin (dramatiq worker wakes)", "take", "begin"),
    ("begin -> finalize (handler, Python around it)", "begin", "finalize"),
    ("finalize -> caller returns", "finalize", "return"),
)
SCRIPTS = ("take", "begin", "finalize")
_EVAL = {b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO"}
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.S)
_ESCAPE = re.compile(rb"\\(x[0-9a-f]{2}|.)", re.S)
_ESCAPED = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


def script_names() -> dict[bytes, str]:
    """SHA1 (hex) of every script as Redis may run it (with and without the Redis 7 flags)."""
    return {hashlib.sha1(source(name, flags).encode()).hexdigest().encode(): name
            for name in NAMES for flags in (True, False)}


def _unescape(arg: bytes) -> bytes:
    """Undo MONITOR's quoting (sdscatrepr: \\n \\r \\t \\a \\b \\" \\\\ and \\xHH)."""
    def one(m: re.Match[bytes]) -> bytes:
        code = m.group(1)
        if len(code) == 3 and code[:1] == b"x":
            return bytes([int(code[1:], 16)])
        return _ESCAPED.get(code, code)

    return _ESCAPE.sub(one, arg)


@dataclass(frozen=True)
class Event:
    at: float  # server clock, seconds
    client: str
    label: str  # the script's name, or the command's


def parse(line: bytes, names: dict[bytes, str]) -> Event | None:
    """One MONITOR line: ``<time> [<db> <client>] "arg" ...``; None for a script's own
    commands (client ``lua``) and for what cannot be read."""
    head, _sep, rest = line.partition(b"] ")
    stamp, _sep, where = head.partition(b" [")
    client = where.partition(b" ")[2].decode(errors="replace")
    if client == "lua" or not rest:
        return None
    try:
        at = float(stamp)
    except ValueError:
        return None
    args = [_unescape(a) for a in _ARG.findall(rest)[:2]]
    if not args:
        return None
    command = args[0].upper()
    if command in _EVAL and len(args) > 1:
        sha = args[1].lower() if b"SHA" in command else hashlib.sha1(args[1]).hexdigest().encode()
        return Event(at, client, names.get(sha, "unknown script"))
    return Event(at, client, command.decode(errors="replace"))


@dataclass
class Traced:
    session: str
    start: float  # wall clock, seconds
    end: float
    elapsed_s: float  # the caller's perf_counter round trip
    events: list[Event]

    def milestones(self) -> dict[str, float]:
        """The first moment of each milestone this resolve has (a later redesign may lack
        one: its steps are then left out, not guessed)."""
        found = {"call": self.start, "return": self.end}
        if self.events:
            found["request"] = self.events[0].at  # the first command naming the session
        for e in self.events:
            if e.label in SCRIPTS:
                found.setdefault(e.label, e.at)
        return found


def _monitor_lines(mon: Any, stop: bytes) -> Iterator[bytes]:
    while True:
        line = mon.connection.read_response()
        if isinstance(line, str):
            line = line.encode()
        if stop in line:
            return
        yield line


def run(pa: PendingActions, url: str, n: int, gap_s: tuple[float, float],
        payload: dict[str, Any], tick: Tick, seed: int = 5) -> dict[str, Any]:
    """``n`` idle resolves (each staged, then resolved after a pause) under MONITOR; the
    median and mean of each step, and every resolve's timeline."""
    names = script_names()
    rng = random.Random(seed)
    traced: list[Traced] = []
    conn = redis.Redis.from_url(url)
    try:
        with conn.monitor() as mon:
            for _ in range(n):
                session = f"bench-trace-{uuid.uuid4().hex[:16]}"
                pa.stage(session=session, tool="bench", label="bench action", apply=NOOP,
                         payload=payload)
                time.sleep(rng.uniform(*gap_s))
                start = time.time()
                elapsed = resolver(pa, session)()
                traced.append(Traced(session, start, time.time(), elapsed, []))
                tick(1)
            stop = f"bench-trace-end-{uuid.uuid4().hex}".encode()
            pa.client.echo(stop)  # MONITOR shows it too: the end of what to read
            _assign(_monitor_lines(mon, stop), traced, names)
    finally:
        conn.close()
    drop_sessions(pa.ctx, [t.session for t in traced])
    return summarize(traced)


def _assign(lines: Iterator[bytes], traced: list[Traced], names: dict[bytes, str]) -> None:
    """Each resolve's commands: within its call, naming its session (a cheap byte test
    before any parsing: the EVAL of a pipeline carries a whole script)."""
    i = 0
    for line in lines:
        try:
            at = float(line.partition(b" ")[0])
        except ValueError:
            continue
        while i < len(traced) and at > traced[i].end:
            i += 1
        if i == len(traced):
            return
        t = traced[i]
        if at < t.start or t.session.encode() not in line:
            continue
        event = parse(line, names)
        if event is not None:
            t.events.append(event)


def summarize(traced: list[Traced]) -> dict[str, Any]:
    steps: dict[str, list[float]] = {label: [] for label, _a, _b in STEPS}
    for t in traced:
        ms = t.milestones()
        for label, a, b in STEPS:
            if a in ms and b in ms:
                steps[label].append((ms[b] - ms[a]) * 1000)
    walls = [(t.end - t.start) * 1000 for t in traced]
    total = statistics.fmean(walls) if walls else float("nan")

    def stat(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"n": 0, "median_ms": None, "mean_ms": None, "share_of_mean": None}
        mean = statistics.fmean(values)
        return {"n": len(values), "median_ms": statistics.median(values), "mean_ms": mean,
                "share_of_mean": mean / total if total else None}

    def timeline(t: Traced) -> list[list[Any]]:
        return [[round((e.at - t.start) * 1000, 3), e.label, e.client] for e in t.events]

    return {
        "resolves": len(traced),
        "steps": {label: stat(v) for label, v in steps.items()},
        "total": {**stat(walls), "share_of_mean": 1.0 if walls else None,
                  "perf_counter_median_ms": statistics.median(t.elapsed_s * 1000
                                                              for t in traced)
                  if traced else None},
        "timelines": [timeline(t) for t in traced],
    }

