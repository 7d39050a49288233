"""The atomic operations: one Lua file each under ``lua/``, each behind a method here that
passes every key it touches in KEYS (all under the hash tag of the session's partition), builds
its KEYS and ARGV by keyword as the script's header declares them (``declared.py``:
``KEYS.take``, ``ARGV.take``), and decodes its reply into the type from ``replies.py``. Methods
with more than a session and a value or two take keywords only.

A method returns a ``Call`` (``calls.py``): sent now (``run()``) or queued on a pipeline
(``on(pipe)``). The text of each script is ``source.py``'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, NamedTuple, TypeVar

import redis
import redis.asyncio

from pending_actions.broker.atomic.calls import Call, Queued
from pending_actions.broker.atomic.declared import ARGV, KEYS, NAMES, lua_file
from pending_actions.broker.atomic.replies import (
    Begun,
    Concluded,
    Expiry,
    Peeked,
    Pending,
    Recovered,
    Renewed,
    RunClaimed,
    SlotChanged,
    Staged,
    Taken,
)
from pending_actions.broker.atomic.source import LUA_TABLES, prelude, source
from pending_actions.broker.connection import server_info
from pending_actions.broker.events import Event
from pending_actions.broker.feed import cap as feed_cap
from pending_actions.broker.keys import RESOLVER_GROUP, Keys
from pending_actions.broker.models import DEFAULT_TENANT
from pending_actions.broker.routing import Live
from pending_actions.broker.routing import record as pool_record
from pending_actions.broker.settings import Settings

__all__ = ["LUA_TABLES", "NAMES", "Call", "Queued", "Scripts", "Slot", "lua_file",
           "prelude", "source"]
R = TypeVar("R")
Slot = Literal["directive", "standing"]


class ToStage(NamedTuple):
    """One action of a stage.lua call: its id, spec JSON, ttl in ms (None: none), created_at
    for the feed, and what the policy decided ("" without one; allow, ask, deny or auto), by
    which rule ("" for the default), and ``more``: a deny's reason, an ask's approvals, an
    auto's lease token followed by its request's JSON (whose id is ``req``)."""

    id: str
    spec: bytes
    ttl_ms: int | None
    created: str
    decision: str = ""
    rule: str = ""
    more: str | bytes = ""
    req: str = ""

_SET = {"directive": Event.DIRECTIVE_SET, "standing": Event.STANDING_SET}
_CLEARED = {"directive": Event.DIRECTIVE_CLEARED, "standing": Event.STANDING_CLEARED}


class Scripts:
    def __init__(self, client: redis.Redis | redis.asyncio.Redis, settings: Settings,
                 keys: Keys, flags: bool | None = None) -> None:
        """``flags``: send the Redis 7 script flags. None: ask the server once, on first use
        (a worker may start before Redis is up). Producers pass False: their scripts (stage,
        slots, reads) need no flag, and an asyncio client cannot ask from here."""
        self._k = keys
        self._s = settings
        self._client = client
        self._flags = flags
        self._streams: dict[tuple[int, tuple[str, ...]], tuple[str, ...]] = {}
        self._fn: dict[bool, dict[str, Any]] = {
            on: {name: client.register_script(source(name, on)) for name in NAMES}
            for on in (True, False)}

    def _scripts(self) -> dict[str, Any]:
        if self._flags is None:
            assert not isinstance(self._client, (redis.asyncio.Redis,
                                                 redis.asyncio.RedisCluster)), \
                "an asyncio client passes flags"
            info = server_info(self._client, "server")
            # a cluster may answer per node: the oldest server decides
            found = ([info] if "redis_version" in info else list(info.values()))
            self._flags = min(int(str(i["redis_version"]).split(".")[0]) for i in found) >= 7
        return self._fn[self._flags]

    def load_all(self) -> None:
        """SCRIPT LOAD every script (a worker's start: proves the permission to run them)."""
        for script in self._scripts().values():
            script.registered_client.script_load(script.script)

    def _call(self, name: str, keys: Sequence[str], args: Sequence[Any],
              decode: Callable[[Any], R]) -> Call[R]:
        return Call(self._scripts()[name], keys, args, decode)

    # --- producers -------------------------------------------------------------------------
    def stage(self, session: str, *, tenant: str, indexed: bool, at: str,
              actions: list[ToStage], policy_version: str = "",
              marker_ttl_s: int = 0) -> Call[Staged]:
        """``actions`` of one session, in the order given, decided by ``policy_version`` of the
        tenant's policy ("" for none). ``indexed``: the tenant keeps an index of its sessions;
        ``at``: the time of the feed's entries; ``marker_ttl_s``: an auto request's marker's."""
        k, s = self._k, self._s
        p = k.partition(session)
        markers = [k.request_marker(session, a.req) if a.decision == "auto"
                   else k.denial(session, a.id) for a in actions
                   if a.decision in ("auto", "deny")]
        return self._call(
            "stage",
            [*KEYS.stage(stack=k.stack(session), actions=k.actions(session),
                         hist=k.history(session), sessions=k.sessions(p),
                         tenants=k.tenant_index(p, tenant), expiries=k.expiries(p),
                         expiries_due=k.expiries_due(p), feed=k.events(p),
                         policies=k.policy_markers(p), inflight=k.inflight(session),
                         leases=k.leases(p), requests=k.requests(p)), *markers],
            [*ARGV.stage(maxlen=s.history_maxlen, tenant=tenant, session=session,
                         indexed="1" if indexed else "", feed_maxlen=feed_cap(k), at=at,
                         policy_version=policy_version, dispatch_ms=s.dispatch_timeout_ms,
                         marker_ttl_s=marker_ttl_s or s.reply_ttl_s,
                         denial_ttl_s=s.reply_ttl_s,
                         max_pending=s.max_pending_per_session),
             *(x for a in actions
               for x in (a.id, a.spec, "" if a.ttl_ms is None else a.ttl_ms, a.created,
                         a.decision, a.rule, a.more))],
            Staged.decode,
        )

    def set_policy(self, tenant: str, *, rest: bytes) -> Call[int]:
        """A new version of ``tenant``'s policy; ``rest``: its record's JSON after the version
        (``,"set_at":...}``). Returns the version."""
        k = self._k
        return self._call("set_policy", KEYS.set_policy(doc=k.policy(tenant),
                                                        current=k.policy_index),
                          ARGV.set_policy(tenant=tenant, rest=rest), int)

    def mark_policy(self, partition: int, *, tenant: str, version: int) -> Call[bool]:
        """Raise the partition's marker of ``tenant``'s policy to ``version``."""
        return self._call("mark_policy",
                          KEYS.mark_policy(markers=self._k.policy_markers(partition)),
                          ARGV.mark_policy(tenant=tenant, version=version),
                          lambda raw: bool(int(raw)))

    def reserve(self, partition: int, *, size: int, floor: int = 0) -> Call[int]:
        """``size`` values of the partition's id counter: the block's last one, or -1 when the
        counter and its mark are both lost (nothing handed out)."""
        k = self._k
        return self._call(
            "reserve",
            KEYS.reserve(counter=k.seq(partition), mark=k.seq_mark(partition),
                         sessions=k.sessions(partition), feed=k.events(partition)),
            ARGV.reserve(size=size, floor=floor), int)

    def _leases(self, session: str, token: str) -> tuple[str, str]:
        """The lease index of the session's partition and the lease's member in it."""
        k = self._k
        return k.leases(k.partition(session)), k.lease_member(session, token)

    def _slot_keys(self, script: Any, session: str, slot: Slot) -> tuple[str, ...]:
        """set_slot's and clear_slot's KEYS (``script``: ``KEYS.set_slot``, ...): ``slot`` is
        the directive's key or the standing one's."""
        k = self._k
        key = k.directive(session) if slot == "directive" else k.standing(session)
        keys: tuple[str, ...] = script(slot=key, actions=k.actions(session),
                                       state=k.state(session), hist=k.history(session))
        return keys

    def set_slot(self, session: str, slot: Slot, *, action_id: str,
                 spec: bytes) -> Call[SlotChanged]:
        return self._call(
            "set_slot", self._slot_keys(KEYS.set_slot, session, slot),
            ARGV.set_slot(action_id=action_id, spec=spec, event=_SET[slot],
                          maxlen=self._s.history_maxlen),
            SlotChanged.decode,
        )

    def clear_slot(self, session: str, slot: Slot) -> Call[SlotChanged]:
        return self._call(
            "clear_slot", self._slot_keys(KEYS.clear_slot, session, slot),
            ARGV.clear_slot(event=_CLEARED[slot], maxlen=self._s.history_maxlen),
            SlotChanged.decode,
        )

    # --- agent-framework runs (pending_actions/adapters) ------------------------------------
    def claim_run(self, session: str, *, tenant: str, token: str, lease_ms: int,
                  fresh: bool) -> Call[RunClaimed]:
        k = self._k
        return self._call(
            "claim_run", KEYS.claim_run(run=k.run(session), sessions=k.sessions(k.partition(
                session))),
            ARGV.claim_run(session=session, tenant=tenant, token=token, lease_ms=lease_ms,
                           fresh="1" if fresh else "", ttl_ms=self._s.run_ttl_s * 1000),
            RunClaimed.decode)

    def save_run(self, session: str, *, token: str, done: bool, framework: str = "",
                 state: str = "", calls: bytes = b"[]") -> Call[int]:
        return self._call(
            "save_run", KEYS.save_run(run=self._k.run(session)),
            ARGV.save_run(token=token, done="1" if done else "", framework=framework,
                          state=state, calls=calls, ttl_ms=self._s.run_ttl_s * 1000), int)

    def renew_run(self, session: str, *, token: str, lease_ms: int) -> Call[int]:
        return self._call("renew_run", KEYS.renew_run(run=self._k.run(session)),
                          ARGV.renew_run(token=token, lease_ms=lease_ms), int)

    def note_outcome(self, session: str, *, action_id: str, text: str) -> Call[int]:
        return self._call("note_outcome", KEYS.note_outcome(run=self._k.run(session)),
                          ARGV.note_outcome(action_id=action_id, text=text), int)

    def pending(self, session: str, limit: int) -> Call[Pending]:
        k = self._k
        return self._call(
            "pending",
            KEYS.pending(stack=k.stack(session), inflight=k.inflight(session),
                         actions=k.actions(session), state=k.state(session),
                         expiries=k.expiries(k.partition(session)),
                         revoked=k.revoked(k.partition(session))),
            ARGV.pending(limit=limit, session=session), partial(Pending.decode, session=session),
        )

    def peek(self, session: str) -> Call[Peeked]:
        k = self._k
        return self._call(
            "peek",
            KEYS.peek(directive=k.directive(session), stack=k.stack(session),
                      actions=k.actions(session), expiries=k.expiries(k.partition(session))),
            ARGV.peek(session=session), partial(Peeked.decode, session=session),
        )

    # --- resolve worker --------------------------------------------------------------------
    def take(self, session: str, *, req: str, action: str, token: str, reason: str,
             extra: bytes, marker_ttl_s: int, none_reply: bytes, live: Live,
             message: bytes | None, expect_id: str = "", by: str = "",
             conflict_reply: bytes = b"", expired_reply: bytes = b"",
             entry: bytes | str = b"", trace: str = "", approver: str = "",
             revision: int | None = None, patched: str = "", grant: str = "", tenant: str = "",
             decided: tuple[str, str] | None = None) -> Call[Taken]:
        """``message``: the task to enqueue to the chosen pool's stream in this partition;
        None when the caller enqueues it on another broker itself. ``entry``: the request's
        id in its partition's request stream, acked by the script (b"": the caller acks).
        ``trace``: the take's context, kept in the lease (``broker/tracing.py``)."""
        k, s = self._k, self._s
        p = k.partition(session)
        keys = KEYS.take.__new__(
            KEYS.take, directive=k.directive(session), stack=k.stack(session),
            standing=k.standing(session), actions=k.actions(session), state=k.state(session),
            inflight=k.inflight(session), hist=k.history(session),
            marker=k.request_marker(session, req), replies=k.reply(session, req),
            leases=k.leases(p), expiries=k.expiries(p), expired=k.expired(session),
            requests=k.requests(p), dead=k.dead(session), revoked=k.revoked(p),
            sessions=k.sessions(p), policies=k.policy_markers(p))
        args = ARGV.take.__new__(
            ARGV.take, req=req, action=action, token=token, dispatch_ms=s.dispatch_timeout_ms,
            marker_ttl_s=marker_ttl_s, maxlen=s.history_maxlen, reason=reason, extra=extra,
            none_reply=none_reply, reply_ttl_s=s.reply_ttl_s, session=session,
            routes_json=live.routes_json, pool_count=len(live.pools), message=message or b"",
            expect_id=expect_id, by=by, conflict_reply=conflict_reply,
            expired_reply=expired_reply, memory_ms=s.expired_memory_s * 1000, entry=entry,
            group=RESOLVER_GROUP, trace=trace, approver=approver,
            revision="" if revision is None else str(revision), patched=patched, grant=grant,
            tenant=tenant, edit_tenant=decided[0] if decided else "",
            edit_version=decided[1] if decided else "")
        return self._call("take", keys if message is None else keys + self._task_queues(p, live),
                          args, partial(Taken.decode, session=session))

    def approve(self, session: str, *, counted: Taken, req: str, action: str, approver: str,
                grant: str = "", patched: str = "", marker_ttl_s: int,
                entry: bytes | str = b"", decided: tuple[str, str] | None = None) -> Call[Taken]:
        """Record the approval a take answered COUNTED for (``counted``), the request's own
        fields as given to that take: APPROVED (recorded), RETAKE (changed since: take again)
        or DUP."""
        assert counted.basis is not None
        k, s, seen = self._k, self._s, counted.basis
        p = k.partition(session)
        return self._call(
            "approve",
            KEYS.approve(directive=k.directive(session), stack=k.stack(session),
                         actions=k.actions(session), state=k.state(session),
                         hist=k.history(session), marker=k.request_marker(session, req),
                         revoked=k.revoked(p), expiries=k.expiries(p),
                         policies=k.policy_markers(p), requests=k.requests(p)),
            ARGV.approve(action_id=counted.id, req=req, action=action, approver=approver,
                         grant=grant, patched=patched, seen=seen.counters, top=seen.top,
                         skipped=seen.skipped, seen_directive=seen.directive,
                         needed=seen.needed, session=session,
                         edit_tenant=decided[0] if decided else "",
                         edit_version=decided[1] if decided else "",
                         maxlen=s.history_maxlen, marker_ttl_s=marker_ttl_s, entry=entry,
                         group=RESOLVER_GROUP),
            partial(Taken.decode, session=session))

    def _task_queues(self, partition: int, live: Live) -> tuple[str, ...]:
        """The partition's task stream of each live pool, kept: every take sends them."""
        found = self._streams.get((partition, live.pools))
        if found is None:
            if len(self._streams) >= 10_000:  # pools that came and went
                self._streams.clear()
            found = tuple(self._k.task_queue(partition, pool) for pool in live.pools)
            self._streams[partition, live.pools] = found
        return found

    def expire(self, session: str, *, action_id: str) -> Call[Expiry]:
        k = self._k
        return self._call(
            "expire",
            KEYS.expire(stack=k.stack(session), actions=k.actions(session),
                        state=k.state(session), expiries=k.expiries(k.partition(session)),
                        expired=k.expired(session), hist=k.history(session)),
            ARGV.expire(action_id=action_id, maxlen=self._s.history_maxlen,
                        memory_ms=self._s.expired_memory_s * 1000, session=session),
            Expiry.decode,
        )

    def mark_expiries(self, partition: int, *, look_again_ms: int,
                      waiting: list[bytes]) -> Call[int]:
        k = self._k
        return self._call(
            "mark_expiries",
            KEYS.mark_expiries(expiries=k.expiries(partition),
                               expiries_due=k.expiries_due(partition)),
            [*ARGV.mark_expiries(look_again_ms=look_again_ms), *waiting], int)

    def recover(self, session: str, *, token: str, req: str, returned_reply: bytes,
                dead_reply: bytes, unstarted_reply: bytes, returned_error: str,
                unstarted_error: str) -> Call[Recovered]:
        """The replies to the resolver when the action is returned (after a stall),
        dead-lettered, never started; the last_error when returned, never started."""
        k, s = self._k, self._s
        leases, member = self._leases(session, token)
        return self._call(
            "recover",
            KEYS.recover(inflight=k.inflight(session), stack=k.stack(session),
                         directive=k.directive(session), actions=k.actions(session),
                         state=k.state(session), hist=k.history(session), dead=k.dead(session),
                         replies=k.reply(session, req), leases=leases),
            ARGV.recover(token=token, max_stalls=s.max_stalls, reply_ttl_s=s.reply_ttl_s,
                         maxlen=s.history_maxlen, returned_reply=returned_reply,
                         dead_reply=dead_reply, unstarted_reply=unstarted_reply,
                         returned_error=returned_error, unstarted_error=unstarted_error,
                         member=member),
            Recovered.decode,
        )

    # --- handler tasks ---------------------------------------------------------------------
    def begin(self, session: str, *, token: str, claimant: str) -> Call[Begun]:
        k = self._k
        leases, member = self._leases(session, token)
        return self._call(
            "begin",
            KEYS.begin.__new__(KEYS.begin, inflight=k.inflight(session),
                               actions=k.actions(session), state=k.state(session),
                               leases=leases),
            ARGV.begin.__new__(ARGV.begin, token=token, lease_ms=self._s.lease_ms,
                               member=member, claimant=claimant),
            partial(Begun.decode, session=session),
        )

    def unclaim(self, session: str, *, token: str, claimant: str) -> Call[bool]:
        leases, member = self._leases(session, token)
        return self._call(
            "unclaim", KEYS.unclaim(inflight=self._k.inflight(session), leases=leases),
            ARGV.unclaim(token=token, claimant=claimant,
                         dispatch_ms=self._s.dispatch_timeout_ms, member=member), bool)

    def renew(self, session: str, *, token: str) -> Call[Renewed]:
        leases, member = self._leases(session, token)
        return self._call(
            "renew", KEYS.renew(inflight=self._k.inflight(session), leases=leases),
            ARGV.renew(token=token, lease_ms=self._s.lease_ms, member=member), Renewed.decode)

    def finalize(self, session: str, *, token: str, req: str, reply: bytes, event: Event,
                 action_id: str, attempt: int,
                 noted: tuple[str, ...] = ()) -> Call[Concluded]:
        """``noted``: more field, value pairs for the outcome's history entry."""
        k, s = self._k, self._s
        leases, member = self._leases(session, token)
        return self._call(
            "finalize",
            KEYS.finalize.__new__(
                KEYS.finalize, inflight=k.inflight(session), actions=k.actions(session),
                state=k.state(session), hist=k.history(session), replies=k.reply(session, req),
                leases=leases),
            [*ARGV.finalize.__new__(
                ARGV.finalize, token=token, reply=reply, reply_ttl_s=s.reply_ttl_s,
                maxlen=s.history_maxlen, event=event, action_id=action_id, attempt=attempt,
                member=member), *noted],
            Concluded.decode,
        )

    def readd(self, session: str, *, token: str, req: str, last_error: str, reply: bytes,
              action_id: str, attempt: int) -> Call[Concluded]:
        k, s = self._k, self._s
        leases, member = self._leases(session, token)
        return self._call(
            "readd",
            KEYS.readd.__new__(
                KEYS.readd, inflight=k.inflight(session), stack=k.stack(session),
                directive=k.directive(session), actions=k.actions(session),
                state=k.state(session), hist=k.history(session), replies=k.reply(session, req),
                leases=leases, dead=k.dead(session)),
            ARGV.readd.__new__(
                ARGV.readd, token=token, last_error=last_error, reply=reply,
                reply_ttl_s=s.reply_ttl_s, maxlen=s.history_maxlen, action_id=action_id,
                attempt=attempt, member=member),
            Concluded.decode,
        )

    # --- poison, retention, liveness ---------------------------------------------------------
    def park(self, session: str, *, what: Literal["spec", "state", "lease"], field: str,
             raw: bytes, reason: str, req: str = "", reply: bytes = b"",
             token: str = "") -> Call[bool]:
        """Move an unreadable record aside (see park.lua); ``req``/``reply``: the resolver
        waiting on it, ``token``: the lease to end with a parked spec."""
        k = self._k
        return self._call(
            "park",
            KEYS.park(actions=k.actions(session), state=k.state(session),
                      inflight=k.inflight(session), stack=k.stack(session),
                      directive=k.directive(session), standing=k.standing(session),
                      dead=k.dead(session), hist=k.history(session),
                      replies=k.reply(session, req) if req else k.dead(session),
                      leases=k.leases(k.partition(session))),
            ARGV.park(what=what, field=field, raw=raw,
                      raw_text=raw.decode("utf-8", "backslashreplace"), reason=reason[:500],
                      maxlen=self._s.history_maxlen, reply=reply,
                      reply_ttl_s=self._s.reply_ttl_s, token=token, session=session),
            lambda raw_reply: bool(int(raw_reply)),
        )

    def retire(self, partition: int, *, sessions: list[tuple[str, str]],
               retention_ms: int) -> Call[list[int]]:
        """A page of the partition's sessions, each with the tenant its field held when read
        ("" for none yet); each 2 (gone), 1 (set to expire) or 0 (live)."""
        k = self._k
        return self._call(
            "retire",
            [*KEYS.retire(sessions=k.sessions(partition)),
             *(key for s, t in sessions
               for key in (k.actions(s), k.dead(s), k.history(s), k.stack(s),
                           k.tenant_index(partition, t or DEFAULT_TENANT)))],
            [*ARGV.retire(retention_ms=retention_ms),
             *(x for pair in sessions for x in pair)],
            lambda codes: [int(c) for c in codes],
        )

    def sweep(self, session: str) -> Call[int]:
        """Put back the lease index entries of the session's leases that lack one."""
        k = self._k
        return self._call(
            "sweep",
            KEYS.sweep(inflight=k.inflight(session), leases=k.leases(k.partition(session))),
            ARGV.sweep(session=session), int)

    def register(self, *, pool: str, names: list[str], instance: str, ttl_ms: int,
                 tenants: dict[str, list[str]] | None = None) -> Call[int]:
        """Keep ``instance``, a worker process of ``pool`` (its handler ``names``, some kept to
        ``tenants``), live for ``ttl_ms`` (``broker/routing.py``)."""
        k = self._k
        return self._call(
            "register", KEYS.register(pools=k.pools, live=k.pool_live),
            ARGV.register(pool=pool, names=pool_record(names, tenants),
                          member=Keys.pool_member(pool, instance), ttl_ms=ttl_ms), int)

    def beat(self, proc: str, *, loop: str, every_ms: int, ttl_ms: int,
             info: bytes) -> Call[int]:
        k = self._k
        return self._call(
            "beat", KEYS.beat(procs=k.beat_procs, beats=k.beats(proc)),
            ARGV.beat(proc=proc, loop=loop, every_ms=every_ms, ttl_ms=ttl_ms, info=info), int)
