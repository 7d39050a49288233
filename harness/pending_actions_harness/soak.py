"""``pending-actions soak``: many sessions staging and resolving through random handler
failures, random SIGKILLs of workers and a Redis SIGKILL+restart; then a tally from Redis.

The tally comes from each session's history stream, which every state change writes in the
same Lua step: an action is applied or discarded if its history says so, pending if it is
stacked or in flight, dead if it was dead-lettered, and lost if none of these. Applied-twice
counts actions with more than one recorded outcome."""

from __future__ import annotations

import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
import redis

from pending_actions.broker.errors import PendingActionsError
from pending_actions.broker.events import ENDINGS
from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers.client import PendingActions
from pending_actions_harness.supervise import WorkerProcess

K = Keys()



@dataclass
class Histories:
    """What the sessions' own records say became of every action: staged and outcomes from the
    history streams (each state change writes them in the same Lua step), pending from the
    stacks and leases, dead from the dead letters. The soak's tally and the compose test's
    both read this."""

    staged: set[str]
    outcomes: dict[str, list[str]]  # id -> the events that ended it (Event.ends), in order
    pending: set[str]
    dead: set[str]

    @classmethod
    def read(cls, client: Any, sessions: list[str]) -> Histories:
        found = cls(set(), {}, set(), set())
        for s in sessions:
            for _e, f in client.xrange(K.history(s)):
                event, action_id = f[b"event"].decode(), f[b"id"].decode()
                if event == "staged":
                    found.staged.add(action_id)
                elif event in ENDINGS:
                    found.outcomes.setdefault(action_id, []).append(event)
            found.pending.update(x.decode() for x in client.zrange(K.stack(s), 0, -1))
            found.pending.update(orjson.loads(v)["id"] for v in client.hvals(K.inflight(s)))
            found.dead.update(orjson.loads(x)["id"] for x in client.lrange(K.dead(s), 0, -1))
        return found


class Soak:
    def __init__(self, seconds: float, sessions: int, actions: int, workers: int,
                 fail_rate: float, kill_every: float, restart_redis: bool, seed: int,
                 redis_faults: bool = False) -> None:
        self.seconds, self.n_sessions, self.max_actions = seconds, sessions, actions
        self.n_workers, self.fail_rate, self.kill_every = workers, fail_rate, kill_every
        self.restart_redis, self.rng = restart_redis, random.Random(seed)
        self.redis_faults = redis_faults
        self.dir = Path(tempfile.mkdtemp(prefix="pa-soak-"))
        self.server = EmbeddedRedis(directory=self.dir / "redis", fsync="always")
        self.workers: list[WorkerProcess] = []
        self.stop = threading.Event()
        self.events = Counter[str]()
        self.lock = threading.Lock()
        self.acknowledged: set[str] = set()  # ids that stage() returned to a producer

    # the tally reads the histories, so no process may trim them
    HISTORY = 10_000_000

    def _worker(self) -> WorkerProcess:
        return WorkerProcess(self.server.url, "pending_actions_harness.soak_handlers", {
            "lease_ms": "2000", "dispatch_timeout_ms": "20000", "recovery_interval_ms": "200",
            "max_stalls": "5", "claim_idle_ms": "5000", "history_maxlen": str(self.HISTORY),
            "restart_backoff_max_s": "0.5"}).start()

    def count(self, name: str) -> None:
        with self.lock:
            self.events[name] += 1

    def producer(self, session: str, pa: PendingActions) -> None:
        staged, empty = 0, False
        while not self.stop.is_set():
            try:
                if staged < self.max_actions and (empty or self.rng.random() < 0.5):
                    action_id = pa.stage(session=session, tool="soak",
                                         label=f"{session} #{staged}", apply="soak.apply",
                                         reject="soak.reject",
                                         payload={"fail_rate": self.fail_rate})
                    staged, empty = staged + 1, False
                    with self.lock:
                        self.acknowledged.add(action_id)
                    continue
                if staged >= self.max_actions and empty:
                    return  # this session is done: everything staged has ended
                action = "apply" if self.rng.random() < 0.8 else "discard"
                res = pa.resolve(session=session, action=action, reason="soak", timeout=10)
                empty = res.details.get("label") is None
                if not empty:
                    self.count("resolve errors" if res.is_error else "resolve ok")
            except PendingActionsError:
                self.count("redis unavailable")
                self.stop.wait(0.1)  # Redis is down: retry after a pause, as an agent would

    def chaos(self) -> None:
        restarted = not self.restart_redis
        started = time.monotonic()
        while not self.stop.wait(self.rng.expovariate(1 / self.kill_every)):
            if not restarted and time.monotonic() - started > self.seconds / 2:
                self.server.kill()
                self.server.start()
                restarted = True
                self.count("redis restarts")
                continue
            if self.redis_faults and self.rng.random() < 0.5:
                self.redis_fault()
                continue
            i = self.rng.randrange(len(self.workers))
            victim = self.workers[i]
            if self.rng.random() < 0.5 and victim.kill_one_handler_process():
                self.count("dramatiq processes killed")
            else:
                victim.kill()
                self.workers[i] = self._worker()
                self.count("whole workers killed")

    def redis_fault(self) -> None:
        """One of issue 13's faults on Redis itself: a CLIENT KILL of every connection, a
        SCRIPT FLUSH, the global keys deleted, or two seconds at the memory limit."""
        rc: Any = redis.Redis.from_url(self.server.url)
        try:
            fault = self.rng.choice(["client kill", "script flush", "global keys deleted",
                                     "redis full 2s"])
            if fault == "client kill":
                rc.client_kill_filter(_type="normal", skipme=True)
            elif fault == "script flush":
                rc.script_flush()
            elif fault == "global keys deleted":
                # the shared keys a process rebuilds; not the lease indexes, which only the
                # scripts that keep a lease write (no sweep rebuilds them)
                rc.delete(*(K.requests(p) for p in range(K.partitions)),
                          *(K.sessions(p) for p in range(K.partitions)), K.workers)
            else:
                for n in range(40):
                    rc.set(f"soak:junk:{n}", b"x" * 50_000)
                rc.config_set("maxmemory", int(rc.info("memory")["used_memory"]) - 1_000_000)
                self.stop.wait(2.0)
                rc.delete(*(f"soak:junk:{n}" for n in range(40)))
                rc.config_set("maxmemory", 0)
            self.count(fault)
        except redis.RedisError:
            self.count("redis fault not applied (Redis down)")
        finally:
            rc.close()

    def run(self) -> dict[str, Any]:
        self.server.start()
        try:
            return self._run()
        finally:  # also on Ctrl-C: nothing we started outlives us
            for w in self.workers:
                w.stop()
            self.server.stop()

    def _run(self) -> dict[str, Any]:
        self.workers = [self._worker() for _ in range(self.n_workers)]
        pa = PendingActions.from_url(self.server.url, resolve_timeout_s=10,
                                     history_maxlen=self.HISTORY)
        sessions = [f"soak-{i}" for i in range(self.n_sessions)]
        threads = [threading.Thread(target=self.producer, args=(s, pa)) for s in sessions]
        threads.append(threading.Thread(target=self.chaos))
        try:
            for t in threads:
                t.start()
            with click.progressbar(length=int(self.seconds), label="soaking",
                                   file=sys.stderr) as bar:
                for _ in range(int(self.seconds)):
                    if self.stop.wait(1.0):
                        break
                    bar.update(1)
        finally:
            self.stop.set()
            for t in threads:
                if t.is_alive():
                    t.join()
        self.settle(sessions)
        return self.tally(sessions)

    def settle(self, sessions: list[str], timeout: float = 60) -> None:
        """Let in-flight attempts finish or be recovered before counting."""
        client: Any = redis.Redis.from_url(self.server.url)
        deadline = time.monotonic() + timeout
        for s in sessions:
            while client.hlen(K.inflight(s)) and time.monotonic() < deadline:
                tail = client.xrevrange(K.history(s), count=1)
                client.xread({K.history(s): tail[0][0] if tail else b"0-0"}, block=1000)

    def tally(self, sessions: list[str]) -> dict[str, Any]:
        client: Any = redis.Redis.from_url(self.server.url)
        found = Histories.read(client, sessions)
        staged, outcomes, pending, dead = found.staged, found.outcomes, found.pending, found.dead
        applied = {a for a, o in outcomes.items() if o[0] == "applied"}
        discarded = {a for a, o in outcomes.items() if o[0] == "discarded"}
        completions = {k.decode(): int(v) for k, v in client.hgetall("soak:completions").items()}
        effects = {k.decode(): int(v) for k, v in client.hgetall("soak:effects").items()}
        ended = applied | discarded | pending | dead
        return {
            "seconds": self.seconds, "sessions": len(sessions), "workers": self.n_workers,
            "staged": len(staged), "applied": len(applied), "discarded": len(discarded),
            "pending": len(pending), "dead_lettered": len(dead),
            # staged and never ended, or acknowledged to a producer and never recorded
            "lost": len((staged | self.acknowledged) - ended),
            "outcomes_without_stage": len(ended - staged),
            "applied_twice": sum(1 for o in outcomes.values() if len(o) > 1),
            "effects_twice": sum(1 for n in effects.values() if n > 1),
            "handler_reruns_after_lost_lease": sum(n - 1 for n in completions.values() if n > 1),
            **dict(self.events),
        }


@click.command()
@click.option("--seconds", type=click.FloatRange(min=5), default=60, show_default=True)
@click.option("--sessions", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--actions", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Most actions staged per session; a session stops once all have ended.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="Chance that one handler run raises a ToolError.")
@click.option("--kill-every", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Mean seconds between SIGKILLs of a worker or a dramatiq process.")
@click.option("--redis-restart/--no-redis-restart", default=True, show_default=True,
              help="SIGKILL and restart Redis (AOF, fsync always) half way through.")
@click.option("--redis-faults/--no-redis-faults", default=True, show_default=True,
              help="Also CLIENT KILL, SCRIPT FLUSH, delete the global keys, fill Redis to "
                   "its memory limit for 2 s, at random.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the tally as JSON.")
def soak(seconds: float, sessions: int, actions: int, workers: int, fail_rate: float,
         kill_every: float, redis_restart: bool, redis_faults: bool,
         seed: int, as_json: bool) -> None:
    """Soak the service on this machine with faults, then print staged / applied / discarded /
    pending / dead-lettered / lost / applied-twice. Exits 1 if anything was lost or applied
    twice. Starts its own Redis and workers; needs no configuration."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    tally = Soak(seconds, sessions, actions, workers, fail_rate, kill_every, redis_restart,
                 seed, redis_faults).run()
    if as_json:
        click.echo(orjson.dumps(tally, option=orjson.OPT_INDENT_2).decode())
    else:
        width = max(len(k) for k in tally)
        for key, value in tally.items():
            click.echo(f"{key:<{width}}  {value}")
    raise SystemExit(1 if tally["lost"] or tally["applied_twice"] else 0)
