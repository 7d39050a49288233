"""Drivers shared by every system measured: one-at-a-time round trips with gaps (idle), many
concurrent callers (loaded), raw Redis round trips, and Redis commands sent by idle workers."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import redis

from pending_actions.producers import PendingActions
from pending_actions_harness.bench.progress import Progress, Tick
from pending_actions_harness.bench.stats import Dist

Call = Callable[[], float]  # one timed round trip; returns seconds, raises on failure


def idle(name: str, call: Call, n: int, gap_s: tuple[float, float], tick: Tick,
         before: Callable[[], object] | None = None, seed: int = 1) -> Dist:
    """``n`` round trips one at a time, each after a random pause, so the workers have gone
    back to waiting when the request lands (the interactive case: an agent resolves now and
    then). ``before`` runs untimed ahead of the pause (e.g. staging the action to resolve)."""
    rng = random.Random(seed)
    dist = Dist(name)
    for _ in range(n):
        if before is not None:
            before()
        time.sleep(rng.uniform(*gap_s))
        try:
            dist.add_seconds(call())
        except Exception:
            dist.errors += 1
        tick(1)
    return dist


def idle_resolves(client: redis.Redis, who: str, stage: Callable[[], object] | None,
                  call: Call, n: int, gap_s: tuple[float, float],
                  progress: Progress) -> tuple[Dist, Dist]:
    """``n`` idle resolves (``stage`` before each) under Redis's own appendfsync, then ``n``
    with it set to everysec (``client``'s Redis); a few untimed first (scripts load and
    connections open on first use)."""
    for _ in range(3):
        if stage is not None:
            stage()
        call()
    policy = str(client.config_get("appendfsync")["appendfsync"])
    with progress.phase(f"{who}: idle resolve, request to reply", n) as tick:
        first = idle(f"{who} idle", call, n, gap_s, tick, before=stage)
    with progress.phase(f"{who}: idle resolve, Redis set to appendfsync everysec", n) as tick:
        client.config_set("appendfsync", "everysec")
        try:
            every = idle(f"{who} idle (everysec)", call, n, gap_s, tick, before=stage)
        finally:
            client.config_set("appendfsync", policy)
    return first, every


def idle_without_aof(client: redis.Redis, who: str, stage: Callable[[], object] | None,
                     call: Call, n: int, gap_s: tuple[float, float],
                     progress: Progress) -> Dist:
    """``n`` idle resolves with Redis's AOF off (``appendonly no``: a push broker's memory-only
    comparison), then the AOF on again and its rewrite waited out, so that nothing after runs
    beside it."""
    with progress.phase(f"{who}: idle resolve, Redis without AOF", n) as tick:
        client.config_set("appendonly", "no")
        try:
            return idle(f"{who} idle (no AOF)", call, n, gap_s, tick, before=stage)
        finally:
            client.config_set("appendonly", "yes")
            while int(client.info("persistence")["aof_rewrite_in_progress"]) or \
                    int(client.info("persistence")["aof_rewrite_scheduled"]):
                time.sleep(0.05)  # INFO is the only word Redis gives of a rewrite's end


def loaded(name: str, calls: Sequence[Call], per_caller: int, tick: Tick) -> Dist:
    """One thread per entry of ``calls``, each making ``per_caller`` round trips back to back,
    all released together. Throughput is completed round trips over the wall time."""
    dist = Dist(name)
    lock = threading.Lock()
    start_line = threading.Barrier(len(calls) + 1)

    def caller(call: Call) -> None:
        mine: list[float] = []
        errors = 0
        start_line.wait()
        for _ in range(per_caller):
            try:
                mine.append(call())
            except Exception:
                errors += 1
            tick(1)
        with lock:
            dist.samples_ms.extend(s * 1000 for s in mine)
            dist.errors += errors

    threads = [threading.Thread(target=caller, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    start_line.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    dist.wall_s = time.perf_counter() - began
    return dist


def resolver(pa: PendingActions, session: str, timeout: float = 30.0) -> Call:
    """A timed resolve of ``session``'s head: request to reply, through the public client."""

    def call() -> float:
        start = time.perf_counter()
        result = pa.resolve(session=session, action="apply", reason="bench", timeout=timeout)
        elapsed = time.perf_counter() - start
        if result.is_error:
            raise RuntimeError(result.content[0].get("text", "error result"))
        return elapsed

    return call


# A write, like every step of a resolve: with appendfsync always its reply waits for fsync too.
INCR_SCRIPT = "return redis.call('INCR', KEYS[1])"


def raw_redis(client: redis.Redis, n: int, tick: Tick) -> tuple[Dist, Dist]:
    """PING and one EVALSHA (a one-key write script) round trip, back to back."""
    script = client.register_script(INCR_SCRIPT)
    script(keys=["bench:raw"])  # loaded now, so every timed call is a plain EVALSHA
    ping, evalsha = Dist("redis PING"), Dist("redis EVALSHA")
    for _ in range(n):
        start = time.perf_counter()
        client.ping()
        ping.add_seconds(time.perf_counter() - start)
        start = time.perf_counter()
        script(keys=["bench:raw"])
        evalsha.add_seconds(time.perf_counter() - start)
        tick(1)
    client.delete("bench:raw")
    return ping, evalsha


def timed(fn: Callable[[], object]) -> Call:
    def call() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return call


def raw_redis_idle(client: redis.Redis, n: int, gap_s: tuple[float, float],
                   tick: Tick) -> tuple[Dist, Dist]:
    """The same round trips, each after an idle pause: the floor of every idle figure, since
    a process that slept (on a virtual machine, a vCPU that halted) is slow to wake, and one
    resolve wakes several in turn."""
    script = client.register_script(INCR_SCRIPT)
    ping = idle("redis PING idle", timed(client.ping), n, gap_s, tick)
    evalsha = idle("redis EVALSHA idle", timed(lambda: script(keys=["bench:raw"])), n, gap_s,
                   tick)
    client.delete("bench:raw")
    return ping, evalsha


def raw_pipelined_evalsha(client: redis.Redis, total: int, batch: int, tick: Tick) -> float:
    """The ceiling for one producer: pipelined EVALSHA of a one-key write script, per second."""
    script = client.register_script(INCR_SCRIPT)
    script(keys=["bench:raw"])
    done = 0
    start = time.perf_counter()
    while done < total:
        n = min(batch, total - done)
        pipe = client.pipeline(transaction=False)
        for _ in range(n):
            script(keys=["bench:raw"], client=pipe)
        pipe.execute()
        done += n
        tick(n)
    rate = total / (time.perf_counter() - start)
    client.delete("bench:raw")
    return rate


@dataclass(frozen=True)
class Counters:
    """The server's own counters at one moment: commands run (a script's own commands
    included), reads from client connections, calls per command (commandstats), and the CPU
    time the server process has used (user + system, every thread of it)."""

    commands: int
    reads: int
    calls: dict[str, int]
    cpu_s: float

    # the INFO calls of one snapshot, which the next snapshot's command count includes
    SECTIONS: ClassVar[tuple[str, ...]] = ("stats", "commandstats", "cpu")

    @classmethod
    def read(cls, client: redis.Redis) -> Counters:
        pipe = client.pipeline(transaction=False)  # one read: counted once below
        for section in cls.SECTIONS:
            pipe.info(section)
        stats, commands, cpu = pipe.execute()
        return cls(int(stats["total_commands_processed"]), int(stats["total_reads_processed"]),
                   {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in commands.items()},
                   float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))

    def since_own(self) -> int:
        """The command count just after this snapshot's own INFO calls."""
        return self.commands + len(self.SECTIONS)

    def per_op(self, before: Counters, ops: int, top: int = 15) -> dict[str, Any]:
        """What ``ops`` operations cost between ``before`` and now, per operation: commands,
        client reads (one per round trip, a pipeline's included, as Redis reads a socket), the
        server's CPU time in microseconds and the costliest commands, by calls; the snapshots'
        own INFO calls and reads left out. Everything every client sent in between counts, the
        workers' own polling too. Commands are counted alike whatever they cost (a TYPE inside a
        script as one, like an EVALSHA): the CPU time says what they cost together."""
        calls = {k: (v - before.calls.get(k, 0)) / ops for k, v in self.calls.items()
                 if k != "info" and v != before.calls.get(k, 0)}
        ranked = sorted(calls.items(), key=lambda kv: -kv[1])
        # the first snapshot's INFO calls are counted by now, the second's read too
        return {"ops": ops, "commands": (self.commands - before.since_own()) / ops,
                "reads": (self.reads - before.reads - 1) / ops,
                "redis_cpu_us": (self.cpu_s - before.cpu_s) * 1e6 / ops,
                "by_command": {k: round(v, 3) for k, v in ranked[:top]}}


def idle_commands(client: redis.Redis, window_s: float, processes: int,
                  tick: Tick) -> dict[str, Any]:
    """Redis commands per second sent by workers that have nothing to do, from the server's
    own counters (total_commands_processed; commandstats for which commands they are)."""
    c0 = Counters.read(client)
    end = time.monotonic() + window_s
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        tick(1)
    c1 = Counters.read(client)
    # the first snapshot's INFO calls are counted; the second's are not yet
    others = c1.commands - c0.since_own()
    by_command = {k: v - c0.calls.get(k, 0) for k, v in c1.calls.items()
                  if k != "info" and v != c0.calls.get(k, 0)}
    return {
        "window_s": window_s, "processes": processes, "commands": others,
        "per_second": others / window_s, "per_second_per_process": others / window_s / processes,
        "by_command": dict(sorted(by_command.items(), key=lambda kv: -kv[1])),
    }
