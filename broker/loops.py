"""The one way a worker runs a long-lived loop: every loop (request serving, recovery, lease
renewal, registration, the webhook feed) goes round through ``Loop.run``, which

- survives every error it can: logs it once with the loop's name (a repeat only as a count,
  once a minute), waits out a backoff, and goes round again;
- ends the process (exit code ``EXIT_LOOP_DIED``) on what it cannot handle: a Redis that
  refuses our credentials or permissions, a bad configuration, a pool with no connection to
  give for ``EXHAUSTED_GIVE_UP_S`` (connections lost for good: no waiting brings them back,
  and a process without them serves nothing while it looks alive), or errors other than an
  outage that keep coming for ``give_up_s``. Its supervisor (``up``, ``worker``, compose,
  systemd) restarts it. Never a live process with a dead loop;
- beats: after each round that went through, at most every third of its interval, it writes
  its beat to Redis (beat.lua, server time), which ``pending-actions health`` checks.

A ``Pulse`` per process keeps its beats alive. A process that stops cleanly says so
(``Beats.stopped``): gone at once. One killed or hung stops pulsing: ``health`` reports it as
stopped (unhealthy) until its beats expire, ``PROC_TTL_MS`` after its last one, unless its
supervisor has started its successor."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis
from redis.exceptions import RedisClusterException

from pending_actions.broker.backoff import Backoff
from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.connection_pool import is_exhausted
from pending_actions.broker.errors import ConfigError, Forbidden, RedisFull
from pending_actions.broker.failures import translate

log = logging.getLogger("pending_actions.loops")

EXIT_LOOP_DIED = 3  # a loop met an error it cannot handle; restart the process
PULSE_S = 1.0  # a process whose pulse is 3 s late has stopped: health says so
# a process that stopped pulsing without saying it stops (killed, hung) is reported by health
# as stopped, unhealthy, until its beats expire this long after its last one; then it is gone
PROC_TTL_MS = 60_000
# a loop that has found no free connection in its pool this long ends its process: by then the
# process's pool has dropped out of the live ones (POOL_TTL_MS, 10 s by default)
EXHAUSTED_GIVE_UP_S = 15.0

Fatal = Callable[[str, BaseException], None]


def exit_process(loop: str, exc: BaseException) -> None:
    """The default on a fatal error: end the whole process at once, non-zero."""
    log.critical("loop %s cannot go on (%s); exiting with %d so that it is restarted",
                 loop, exc, EXIT_LOOP_DIED)
    logging.shutdown()
    os._exit(EXIT_LOOP_DIED)


def is_fatal(exc: BaseException) -> bool:
    """Errors that waiting cannot fix: credentials, permissions, configuration."""
    if isinstance(exc, Forbidden | ConfigError):
        return True
    # (redis-py's AuthenticationError is a ConnectionError: translated first, not retried)
    return isinstance(exc, redis.RedisError) and isinstance(translate(exc),
                                                             Forbidden | ConfigError)


def is_outage(exc: BaseException) -> bool:
    """Redis away or full: wait as long as it takes, never give up on these."""
    # (RedisClusterException: the cluster client could not read a whole slot table, as
    # mid-failover; no RedisError, so not in TRANSIENT)
    if isinstance(exc, (*TRANSIENT, RedisFull, RedisClusterException)):
        return True
    return isinstance(exc, redis.RedisError) and isinstance(translate(exc), RedisFull)


def process_name() -> str:
    """A new name for this process in the beats and the pool registry: ``host:pid:random``.
    The random part keeps it unique where the host name and the pid are not: containers on
    the host's network share its name, and each has its own pids (every worker is pid 1)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Beats:
    """This process's beats: who it is, and the client and scripts to write them with."""

    def __init__(self, ctx: Any, proc: str, role: str, supervisor: str = "") -> None:
        """``supervisor``: the process that restarts this one when it dies (``worker`` for
        its dramatiq processes), whose live successor of it makes its death no longer news."""
        self.ctx = ctx
        self.proc = proc
        self.info = orjson.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                  "role": role, "supervisor": supervisor})
        self.last: dict[str, float] = {}
        self.lock = threading.Lock()
        # held while a beat is written: once ``stopped`` holds it, no beat brings them back
        self.writing = threading.Lock()
        self.closed = False

    def beat(self, loop: str, every_s: float, force: bool = False) -> None:
        """Write ``loop``'s beat unless it wrote one less than a third of its interval ago.
        Never raises: a beat that cannot be written shows as late, which is the truth."""
        now = time.monotonic()
        with self.lock:
            if not force and now - self.last.get(loop, -1e9) < every_s / 3:
                return
            self.last[loop] = now
        try:
            with self.writing:
                if not self.closed:
                    self.ctx.scripts.beat(self.proc, loop=loop, every_ms=int(every_s * 1000),
                                          ttl_ms=PROC_TTL_MS, info=self.info).run()
        except Exception as exc:  # a beat must never stop its loop
            log.debug("beat of %s not written: %s", loop, exc)
            with self.lock:
                self.last.pop(loop, None)

    def stopped(self) -> None:
        """This process stops cleanly: its beats go, and no loop still winding down writes
        them again, so that ``health`` counts it gone, not stopped. (Redis away: it shows as
        stopped until its beats expire.)"""
        keys = self.ctx.keys
        with self.writing:
            self.closed = True
        try:
            pipe = self.ctx.client.pipeline(transaction=False)
            pipe.delete(keys.beats(self.proc))
            pipe.zrem(keys.beat_procs, self.proc)
            pipe.execute()
        except Exception as exc:
            log.warning("could not say that %s stops: %s", self.proc, exc)


class Loop:
    """One long-lived loop. ``step`` does one round (it may block, e.g. on XREADGROUP);
    ``pause_s`` is waited between rounds; ``every_s`` is the longest a healthy round takes
    between two beats."""

    def __init__(self, name: str, step: Callable[[], object], stop: threading.Event, *,
                 every_s: float, pause_s: float = 0.0, beats: Beats | None = None,
                 on_fatal: Fatal | None = None, give_up_s: float = 300.0,
                 backoff: Backoff | None = None,
                 exhausted_give_up_s: float = EXHAUSTED_GIVE_UP_S) -> None:
        self.name = name
        self.step = step
        self.stop = stop
        self.every_s = every_s
        self.pause_s = pause_s
        self.beats = beats
        self.on_fatal = on_fatal or exit_process
        self.give_up_s = give_up_s
        self.exhausted_give_up_s = exhausted_give_up_s
        self.backoff = backoff or Backoff(first=0.05, cap=5.0)
        self.rounds = 0
        self.errors = 0

    def thread(self) -> threading.Thread:
        return threading.Thread(target=self.run, name=self.name, daemon=True)

    def run(self) -> None:
        if self.beats is not None:
            self.beats.beat(self.name, self.every_s, force=True)
        while not self.stop.is_set():
            try:
                self.step()
            except BaseException as exc:  # the point of this class
                try:
                    go_on = self._failed(exc)
                except BaseException as worse:  # never a dead loop in a live process
                    go_on = False
                    self.on_fatal(self.name, worse)
                if not go_on:
                    return
                self.stop.wait(self.backoff.next())
                continue
            self.rounds += 1
            self.backoff.reset()
            self._failing_since, self._exhausted_since, self._said = None, None, None
            if self.beats is not None:
                self.beats.beat(self.name, self.every_s)
            if self.pause_s:
                self.stop.wait(self.pause_s)

    _failing_since: float | None = None  # first of the non-outage errors in a row
    _exhausted_since: float | None = None  # first of the rounds in a row without a connection
    _said: tuple[type, str] | None = None
    _repeats = 0
    _said_at = 0.0

    def _failed(self, exc: BaseException) -> bool:
        """Log ``exc`` (once, then a count a minute) and say whether to go on; on what
        cannot be handled, call ``on_fatal``."""
        if not isinstance(exc, Exception) or is_fatal(exc):
            self.on_fatal(self.name, exc)
            return False
        self.errors += 1
        now = time.monotonic()
        if is_exhausted(exc):
            self._exhausted_since = self._exhausted_since or now
            if now - self._exhausted_since > self.exhausted_give_up_s:
                self.on_fatal(self.name, exc)
                return False
        else:
            self._exhausted_since = None
        outage = is_outage(exc) and not is_exhausted(exc)
        if not outage:
            self._failing_since = self._failing_since or now
            if now - self._failing_since > self.give_up_s:
                self.on_fatal(self.name, exc)
                return False
        what = (type(exc), str(exc)[:200])
        if what != self._said:
            self._said, self._repeats, self._said_at = what, 0, now
            if outage:
                log.warning("%s: %s; retrying", self.name, translate(exc))
            elif is_exhausted(exc):
                log.error("%s: %s; retrying (the process ends if this lasts %gs)", self.name,
                          exc, self.exhausted_give_up_s)
            else:
                log.error("%s: %s: %s; retrying", self.name, type(exc).__name__, exc,
                          exc_info=exc)
        else:
            self._repeats += 1
            if now - self._said_at > 60:
                log.warning("%s: the same error %d more times", self.name, self._repeats)
                self._repeats, self._said_at = 0, now
        return True


def start_pulse(beats: Beats, stop: threading.Event) -> Loop:
    """The loop that keeps this process's beats from expiring while it lives."""
    every = PULSE_S * 3
    loop = Loop("pulse", lambda: beats.beat("pulse", every, force=True), stop, every_s=every,
                pause_s=PULSE_S)
    loop.thread().start()
    return loop
