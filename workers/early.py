"""Claiming an attempt while its task is handed to a worker thread, not after.

Without this, an idle dramatiq worker hands a task from its consumer thread to a worker thread
(waking it takes a while) and only then does that thread send the claim (begin.lua) and wait
for its answer: two waits in a row. Here the consumer thread writes the claims of the tasks it
read before handing them on, on a connection of their own, without waiting; the worker thread
reads its claim's answer when it starts the task, by which time it has usually arrived. The
fence is the same: the answer comes before the handler runs, the claim names its claimant,
and a claim sent again by the same claimant (an answer that did not come) is told OK again.

Only while a worker thread is free for each task (``StreamsBroker.hand_out``): a claimed
attempt holds a running lease, which must not wait behind other work. An answer older than a
third of the lease is not trusted: the claim is sent again (which extends the lease) before the
handler runs. Tasks that will not run here after all (a worker stopping with them still in
memory) have their claim handed back (unclaim.lua), so their next delivery claims them without
a stall. Off with ``REPLICA_WAIT``, whose claim must be on a replica before the handler runs.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections import defaultdict
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy

from pending_actions.broker import failpoints
from pending_actions.broker.atomic.replies import Begun
from pending_actions.broker.atomic.scripts import Call
from pending_actions.broker.context import Context
from pending_actions.broker.roundtrips import packed, pipeline, read_replies
from pending_actions.workers.tasks import ACTOR_NAME

log = logging.getLogger("pending_actions.early")


def _back(held: list[Any], idle: list[Any], drop: bool = False) -> None:
    """The connection in ``held`` (if still there) back on its idle list; ``drop``: first
    disconnected (answers left unread on it would be the next user's), to connect again on
    its next use. Never dropped for good: these connections are counted against the pool's
    bound, so one lost at each cut connection would end with a process that cannot get one."""
    conn = held.pop() if held else None
    if conn is not None:
        if drop:
            conn.disconnect()
        idle.append(conn)


class _Answers:
    """The answers to one write of claims, read in order by whichever thread needs one first;
    the connection goes back to its idle list once all are read, or disconnected when reading
    failed, or when the answers are dropped unread (a claim whose task never ran here)."""

    def __init__(self, conn: Any, n: int, idle: list[Any]) -> None:
        self.held: list[Any] = [conn]  # empty once the connection is back
        self.n = n
        self.idle = idle
        self.got: list[Any] = []
        self.lock = threading.Lock()
        weakref.finalize(self, _back, self.held, idle, True)

    def get(self, i: int) -> Any:
        """The i-th answer (an error as its exception); None when it cannot be read."""
        with self.lock:
            while len(self.got) <= i and self.held:
                try:
                    self.got.extend(read_replies(self.held[0], 1))
                except BaseException as exc:
                    _back(self.held, self.idle, drop=True)
                    if not isinstance(exc, Exception):
                        raise  # a thread interrupted (dramatiq's time limit, shutdown)
            if self.held and len(self.got) == self.n:
                _back(self.held, self.idle)
            return self.got[i] if i < len(self.got) else None


class Claimed:
    """A claim written by the consumer thread: its claimant (under which the worker thread
    claims again when needed), when it was written (monotonic s), and where its answer is."""

    def __init__(self, session: str, token: str, claimant: str, call: Call[Begun],
                 answers: _Answers | None = None, index: int = 0) -> None:
        self.session, self.token, self.claimant = session, token, claimant
        self.call, self.answers, self.index = call, answers, index
        self.at = time.monotonic()

    def begun(self) -> Begun | None:
        """begin.lua's answer; None when it did not come, was an error, or does not parse
        (the worker thread's own claim then meets the same and reports it)."""
        if self.answers is None:
            return None
        raw = self.answers.get(self.index)
        if raw is None or isinstance(raw, Exception):
            return None
        try:
            return self.call.decode(raw)
        except Exception:
            return None


class EarlyClaims:
    """The ``Early`` of ``workers/taskbroker.py`` for the run_attempt actor."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.claimed: dict[str, Claimed] = {}  # message id -> its claim
        self.lock = threading.Lock()
        # connections that carried claims and whose answers were all read, by server
        self.idle: defaultdict[Any, list[Any]] = defaultdict(list)

    def claim(self, messages: list[MessageProxy]) -> None:
        try:
            self._claim(messages)
        except Exception as exc:  # the worker threads claim as usual (same claimants)
            log.warning("early claim not sent (%s); claimed when the task runs", exc)

    def _claim(self, messages: list[MessageProxy]) -> None:
        tasks: list[tuple[str, str, str]] = []
        for message in messages:
            kwargs = message.kwargs if message.actor_name == ACTOR_NAME else None
            session = kwargs.get("session") if isinstance(kwargs, dict) else None
            token = kwargs.get("token") if isinstance(kwargs, dict) else None
            # (a malformed task is the actor's to report)
            if isinstance(session, str) and isinstance(token, str):
                tasks.append((message.message_id, session, token))
        if not tasks:
            return
        ctx = self.ctx
        failpoints.hit("before-begin", ctx.client, ctx.keys)
        # one write to one server: on a cluster a consumer reads one partition's stream
        first = ctx.keys.partition(tasks[0][1])
        tasks = [t for t in tasks if ctx.keys.partition(t[1]) == first]
        claims = []
        for message_id, session, token in tasks:
            claimant = uuid.uuid4().hex
            claims.append(Claimed(session, token, claimant,
                                  ctx.scripts.begin(session, token=token,
                                                    claimant=claimant)))
            with self.lock:  # before it is sent: a claim that lands unanswered is still ours
                self.claimed[message_id] = claims[-1]
        self._send(claims)

    def _send(self, claims: list[Claimed]) -> None:
        # a Batch on the server of the claims' slot (on a cluster, its master), used only to
        # queue them: they are written here and read by other threads (_Answers)
        batch = pipeline(self.ctx.client, key=self.ctx.keys.inflight(claims[0].session))
        for c in claims:
            c.call.on(batch, by_digest=True)
        idle = self.idle[batch.pool]
        try:
            conn = idle.pop()
        except IndexError:  # kept, never given back to the pool (its checkout costs more)
            conn = batch.pool.get_connection()
        try:
            conn.send_packed_command(packed(conn, batch.commands))
        except BaseException:
            _back([conn], idle, drop=True)
            raise
        answers = _Answers(conn, len(claims), idle)
        for i, c in enumerate(claims):
            c.answers, c.index = answers, i

    def take(self, message_id: str) -> Claimed | None:
        """The claim written for this task, if one was (once: it is forgotten here)."""
        with self.lock:
            return self.claimed.pop(message_id, None)

    def release(self, messages: list[MessageProxy]) -> None:
        """Hand back the claims of tasks that will not run here (unclaim.lua)."""
        with self.lock:
            gone = [c for m in messages if (c := self.claimed.pop(m.message_id, None)) is not None]
        if not gone:
            return
        ctx = self.ctx
        try:
            pipe: Any = ctx.client.pipeline(transaction=False)
            for c in gone:
                c.begun()  # its answer read: the connection is then free
                ctx.scripts.unclaim(c.session, token=c.token, claimant=c.claimant).on(pipe)
            pipe.execute(raise_on_error=False)
        except Exception as exc:  # their leases run out and are recovered (a stall each)
            log.warning("could not hand back %d early claims: %s", len(gone), exc)


class HandBack(dramatiq.Middleware):
    """Hands back the claim of a task whose actor never took it: a middleware skipped the
    message or failed it before the actor ran (as dramatiq's AgeLimit does with one too old).
    Its claim would otherwise hold a running lease until it ran out, be recovered as a lost
    worker (a stall counted against an action no handler touched), and stay in the claims map.
    Handed back, the lease is dispatched again and, the task being acked, comes back as never
    started. After a run the actor has taken its claim, and this finds nothing."""

    def __init__(self, claims: EarlyClaims) -> None:
        self.claims = claims

    def after_process_message(self, broker: Any, message: MessageProxy, *,
                              result: Any = None, exception: BaseException | None = None) -> None:
        self.claims.release([message])

    def after_skip_message(self, broker: Any, message: MessageProxy) -> None:
        self.claims.release([message])
