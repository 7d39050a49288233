"""The client's logic without I/O, shared by ``PendingActions`` and ``AsyncPendingActions``.

Each operation is a generator (a ``Plan``): it validates its input, yields what it needs from
Redis, a ``Batch`` of commands for one pipeline or a ``Wait`` on a reply list, gets the answer
sent back, and returns the value the caller sees. The two clients only drive plans, one with
redis-py's blocking client, one with ``redis.asyncio``: validation, request building and
result building exist once, here."""

from __future__ import annotations

import functools
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from pending_actions.broker import texts
from pending_actions.broker.errors import Forbidden, InvalidInput, UnknownHandler
from pending_actions.broker.events import Event
from pending_actions.broker.feed import publish
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import (
    DEFAULT_TENANT,
    TOOL_RE,
    ActionState,
    PendingAction,
    ResolveInput,
    ResolveRequest,
    Result,
    Spec,
    check_handler_name,
    check_session,
    check_tenant,
    merge_patch,
)
from pending_actions.broker.payloads import check_payload, check_schema
from pending_actions.broker.pools import Live, parse_live, queue_live
from pending_actions.broker.replies import Peeked, Pending
from pending_actions.broker.results import base_details, text_result
from pending_actions.broker.scripts import Call, Scripts, Slot
from pending_actions.broker.settings import Settings
from pending_actions.producers.tool import soft_requirement

T = TypeVar("T")
MAX_FINGERPRINT_CHARS = 1_000
BY_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def _incrby(pipe: Any, key: str, by: int) -> None:
    pipe.incrby(key, by)


def _foreign(session: str) -> Forbidden:
    return Forbidden(f"session {session!r} belongs to another tenant")


@dataclass(frozen=True)
class Batch:
    """Commands queued by ``queue(pipe)`` and sent as one pipeline; the driver sends back the
    list of replies."""

    queue: Callable[[Any], object]
    transaction: bool = False
    # with REPLICA_WAIT: acknowledged once that many replicas of this key's master have it
    # (every command queued then in this key's slot when on a cluster)
    wait_on: str | None = None


@dataclass(frozen=True)
class Wait:
    """Block on the list ``key`` for up to ``seconds``; the driver sends back its first item,
    or None when the time ran out. ``first`` queues commands that go in the same round trip
    as the first wait (the request that the wait is for); an error of theirs is raised."""

    key: str
    seconds: float
    first: Callable[[Any], object] | None = None


@dataclass(frozen=True)
class Run:
    """One script on its own, sent as EVALSHA (its body only when Redis lacks it); the driver
    sends back its decoded reply. Cheaper than a ``Batch`` of one EVAL, which sends the body."""

    call: Call[Any]


Plan = Generator[Batch | Wait | Run, Any, T]


class Core:
    # ids reserved per partition in one INCRBY: a stage is then one script call, and ids stay
    # unique without a counter hit per stage (an unused rest of a block is skipped, never reused)
    ID_BLOCK = 16
    LIVE_MAX_AGE_S = 2.0  # how old the view of live workers' handlers may be at a stage

    def __init__(self, settings: Settings, keys: Keys, scripts: Scripts,
                 cluster: bool = False) -> None:
        self.settings = settings
        self.keys = keys
        self.scripts = scripts
        self.cluster = cluster
        self._ids: dict[int, tuple[int, int]] = {}  # partition -> (next counter, end)
        self._lock = threading.Lock()
        self._live = Live()
        self._live_at = -1e9

    # --- staging ---------------------------------------------------------------------------
    def validate(self, session: object, kind: str, tool: object, label: object, apply: object,
                 reject: object, payload: object, ttl: object = None, fingerprint: object = None,
                 schema: object = None, tenant: object = DEFAULT_TENANT) -> dict[str, Any]:
        """Every check that needs no Redis; returns the spec's fields (and ``ttl``)."""
        check_session(session)
        check_tenant(tenant)
        if not isinstance(tool, str) or not TOOL_RE.match(tool):
            raise InvalidInput("tool", f"must be 1-64 of A-Z a-z 0-9 . _ - (got {tool!r})")
        if not isinstance(label, str) or not label.strip():
            raise InvalidInput("label", "must be a non-empty string")
        if len(label) > self.settings.max_label_chars:
            raise InvalidInput("label", f"longer than {self.settings.max_label_chars} characters")
        check_handler_name("apply", apply)
        if reject is not None:
            check_handler_name("reject", reject)
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise InvalidInput("payload", f"must be a JSON object, got {type(payload).__name__}")
        try:
            size = len(orjson.dumps(payload))
        except TypeError as exc:
            raise InvalidInput("payload", f"not JSON-serialisable: {exc}") from None
        if size > self.settings.max_payload_bytes:
            raise InvalidInput("payload", f"{size} bytes; the limit is "
                               f"{self.settings.max_payload_bytes}")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                                or not 0 < ttl <= 10 * 365 * 86_400):
            raise InvalidInput("ttl", f"must be a positive number of seconds (got {ttl!r})")
        if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint
                                        or len(fingerprint) > MAX_FINGERPRINT_CHARS):
            raise InvalidInput("fingerprint", f"must be a string of 1-{MAX_FINGERPRINT_CHARS} "
                               "characters")
        checked_schema = check_schema(schema)
        check_payload(payload, checked_schema, "payload")
        return {"session": session, "kind": kind, "tool": tool, "label": label,
                "apply": apply, "reject": reject, "payload": payload, "ttl": ttl,
                "fingerprint": fingerprint, "payload_schema": checked_schema, "tenant": tenant}

    def _handler_check(self, checked: list[dict[str, Any]]) -> Plan[None]:
        """One round trip: every handler name the validated specs use is live in some worker
        (the view of live workers may be ``LIVE_MAX_AGE_S`` old, and is read again on a miss),
        and no session belongs to another tenant (stage.lua checks that again, atomically)."""
        pairs = sorted({(field, f[field]) for f in checked for field in ("apply", "reject")
                        if f[field] is not None})
        owners = sorted({(f["session"], f["tenant"]) for f in checked})
        fresh = time.monotonic() - self._live_at <= self.LIVE_MAX_AGE_S
        reread = not fresh or not all(self._live.has(n) for _f, n in pairs)

        def queue(pipe: Any) -> None:
            if reread:
                queue_live(pipe, self.keys)
            for session, _t in owners:
                pipe.get(self.keys.tenant(session))

        replies = yield Batch(queue)
        if reread:
            self._live, self._live_at = parse_live(replies), time.monotonic()
            replies = replies[3:]
        tenants = replies
        for field, name in pairs:
            if not self._live.has(name):
                raise UnknownHandler(field, name)
        for (session, tenant), owner in zip(owners, tenants, strict=True):
            if owner is not None and owner.decode() != tenant:
                raise _foreign(session)

    @staticmethod
    def _spec(fields: dict[str, Any], action_id: str) -> Spec:
        now = time.time()
        ttl = fields.get("ttl")
        return Spec(id=action_id, created_at=now,
                    expires_at=None if ttl is None else now + ttl,
                    **{k: v for k, v in fields.items() if k != "ttl"})

    def stage_many(self, actions: Iterable[dict[str, Any]]) -> Plan[list[str]]:
        checked = [self.validate(a.get("session"), "action", a.get("tool"), a.get("label"),
                                 a.get("apply"), a.get("reject"), a.get("payload"),
                                 a.get("ttl"), a.get("fingerprint"), a.get("schema"),
                                 a.get("tenant", DEFAULT_TENANT))
                   for a in actions]
        if not checked:
            return []
        yield from self._handler_check(checked)
        seqs = yield from self._seqs([f["session"] for f in checked])
        specs = [self._spec(f, f"pending-action:{f['tool']}:{seq}")
                 for seq, f in zip(seqs, checked, strict=True)]

        pairs = list(zip(specs, checked, strict=True))

        def stage(pipe: Any, todo: list[tuple[Spec, dict[str, Any]]],
                  queued: list[Any]) -> None:
            queued.clear()  # a batch sent again (REPLICA_WAIT through a failover) queues anew
            for spec, fields in todo:
                ttl = fields["ttl"]
                # depth 0 needs no look: an id staged already was staged by a retry of this;
                # stage.lua also lists the session and indexes a ttl in its partition
                queued.append(self.scripts.stage(
                    spec.session, spec.id, orjson.dumps(spec.model_dump()), spec.tenant,
                    None if ttl is None else int(ttl * 1000)).on(pipe))

        def feed(pipe: Any) -> None:
            for spec in specs:
                publish(pipe, self.keys, Event.STAGED, spec)
            for tenant in {s.tenant for s in specs}:
                pipe.sadd(self.keys.tenant_sessions(tenant),
                          *{s.session for s in specs if s.tenant == tenant})

        staged = []
        if self.settings.replica_wait and self.cluster:
            # WAIT covers one connection, so one master: with it on a cluster a batch goes one
            # stage at a time, and the feed (other slots) after
            for one in pairs:
                queued: list[Any] = []
                replies = yield Batch(functools.partial(stage, todo=[one], queued=queued),
                                      wait_on=self.keys.stack(one[0].session))
                staged += [q.get(replies) for q in queued]
            yield Batch(feed)
        else:
            queued = []

            def queue(pipe: Any) -> None:
                stage(pipe, pairs, queued)
                feed(pipe)

            replies = yield Batch(queue, wait_on=self.keys.stack(specs[0].session))
            staged = [q.get(replies) for q in queued]
        for spec, one in zip(specs, staged, strict=True):
            if one.depth < 0:  # another tenant took the session meanwhile
                raise _foreign(spec.session)
        return [s.id for s in specs]

    def _seqs(self, sessions: list[str]) -> Plan[list[int]]:
        """One new seq per session given: ``counter * partitions + partition``, the counter
        that of the session's partition, reserved ``ID_BLOCK`` at a time (one round trip for
        the partitions that ran out)."""
        k = self.keys
        parts = [k.partition(s) for s in sessions]
        need = Counter(parts)
        got: dict[int, list[int]] = {}
        with self._lock:
            for p, n in need.items():
                nxt, end = self._ids.get(p, (0, 0))
                if end - nxt >= n:
                    got[p] = list(range(nxt, nxt + n))
                    self._ids[p] = (nxt + n, end)
        sizes = {p: max(n, self.ID_BLOCK) for p, n in need.items() if p not in got}
        if sizes:
            # with REPLICA_WAIT a block is used only once a replica has it: a failover must not
            # roll a counter back under ids already handed out (one partition at a time on a
            # cluster, where WAIT covers one master)
            ends: list[Any] = []
            if self.settings.replica_wait and self.cluster:
                for p, n in sizes.items():
                    ends += yield Batch(functools.partial(_incrby, key=k.seq(p), by=n),
                                        wait_on=k.seq(p))
            else:
                ends = yield Batch(
                    lambda pipe: [pipe.incrby(k.seq(p), n) for p, n in sizes.items()],
                    wait_on=k.seq(next(iter(sizes))))
            with self._lock:
                for (p, size), end in zip(sizes.items(), ends, strict=True):
                    first = int(end) - size + 1
                    got[p] = list(range(first, first + need[p]))
                    # what another thread left of an older block is skipped, never reused
                    self._ids[p] = (first + need[p], int(end) + 1)
        taken = {p: iter(v) for p, v in got.items()}
        return [next(taken[p]) * k.partitions + p for p in parts]

    def set_slot(self, session: str, slot: Slot, tool: object, label: object, apply: object,
                 reject: object) -> Plan[str]:
        fields = self.validate(session, slot, tool, label, apply, reject, None)
        yield from self._handler_check([fields])
        seq, = yield from self._seqs([session])
        spec = self._spec(fields, f"{slot}:{tool}:{seq}")

        def queue(pipe: Any) -> None:
            self.scripts.set_slot(session, slot, spec.id, orjson.dumps(spec.model_dump())).on(pipe)
            pipe.sadd(self.keys.sessions(self.keys.partition(session)), session)

        yield Batch(queue)
        return spec.id

    def clear_slot(self, session: str, slot: Slot) -> Plan[bool]:
        check_session(session)
        got = yield Run(self.scripts.clear_slot(session, slot))
        return got.previous is not None

    # --- resolving -------------------------------------------------------------------------
    def resolve(self, session: str, action: object, reason: object, extra: object,
                timeout: object, edit: object = None, expect_id: object = None,
                by: object = None) -> Plan[Result]:
        check_session(session)
        given = ResolveInput.parse(action, reason, extra)
        if len(given.reason) > self.settings.max_reason_chars:
            raise InvalidInput("reason", f"{len(given.reason)} characters; the limit is "
                               f"{self.settings.max_reason_chars}")
        if given.extra is not None and (size := len(orjson.dumps(given.extra))) > \
                self.settings.max_extra_bytes:
            raise InvalidInput("extra", f"{size} bytes as JSON; the limit is "
                               f"{self.settings.max_extra_bytes}")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise InvalidInput("timeout", "must be a positive number of seconds")
        if expect_id is not None and (not isinstance(expect_id, str) or not expect_id
                                      or len(expect_id) > 300):
            raise InvalidInput("expect_id", "must be an action id")
        if by is not None and (not isinstance(by, str) or not BY_RE.match(by)):
            raise InvalidInput("by", "must be 1-128 characters of A-Z a-z 0-9 . _ : @ -")
        if edit is not None:
            if not isinstance(edit, dict):
                raise InvalidInput("edit", "must be a JSON Merge Patch object")
            if given.action != "apply":
                raise InvalidInput("edit", "only an apply can edit the payload")
            expect_id = yield from self._check_edit(session, edit, expect_id)
        wait = float(timeout or self.settings.resolve_timeout_s)
        req = uuid.uuid4().hex
        request = ResolveRequest(req=req, session=session, action=given.action,
                                 reason=given.reason, extra=given.extra,
                                 timeout_ms=int(wait * 1000),
                                 deadline_ms=int((time.time() + wait) * 1000),
                                 expect_id=expect_id, by=by, edit=edit)
        requests = self.keys.requests(self.keys.partition(session))
        got = yield Wait(self.keys.reply(session, req), wait,
                         first=lambda p: p.xadd(requests, request.to_fields()))
        if got is None:
            details = base_details(given.action, given.reason, given.extra)
            return text_result(texts.timed_out(wait), details, is_error=True)
        return Result.model_validate_json(got)

    def _check_edit(self, session: str, edit: dict[str, Any],
                    expect_id: str | None) -> Plan[str]:
        """An edit is checked here, against the target it will meet, and goes only with that
        target: the request carries its id as ``expect_id`` (the caller's own when given)."""
        target = yield from self._target(session)
        if target is None:
            raise InvalidInput("edit", "there is no pending action to edit")
        if expect_id is not None and expect_id != target.id:
            raise InvalidInput("expect_id", f"{expect_id} is not the current target "
                               f"({target.id} is); nothing was changed")
        try:
            edited = merge_patch(target.payload, edit)
            size = len(orjson.dumps(edited))
        except TypeError as exc:
            raise InvalidInput("edit", f"not JSON-serialisable: {exc}") from None
        if size > self.settings.max_payload_bytes:
            raise InvalidInput("edit", f"the edited payload is {size} bytes; the limit is "
                               f"{self.settings.max_payload_bytes}")
        check_payload(edited, target.payload_schema, "edit")
        return target.id

    def _target(self, session: str) -> Plan[Spec | None]:
        got: Peeked = yield Run(self.scripts.peek(session))
        if got.directive is not None:
            return got.directive
        if got.head is None:
            return None
        head = got.head
        raw, = yield Batch(lambda p: p.hget(self.keys.actions(session), head))
        return Spec.model_validate_json(raw) if raw else None

    # --- reading ---------------------------------------------------------------------------
    def pending(self, session: str, limit: int = 1000) -> Plan[list[PendingAction]]:
        check_session(session)
        got: Pending = yield Run(self.scripts.pending(session, limit))
        return got.actions

    def show(self, session: str, action_id: str) -> Plan[PendingAction | None]:
        found = next((a for a in (yield from self.pending(session)) if a.id == action_id), None)
        if found is not None:
            return found
        k = self.keys

        def queue(pipe: Any) -> None:
            pipe.hget(k.actions(session), action_id)
            pipe.hget(k.state(session), action_id)

        raw, st = yield Batch(queue, transaction=True)
        if raw is None:
            return None
        spec = Spec.model_validate_json(raw)
        if spec.expires_at is not None and spec.expires_at <= time.time():
            return None  # past its ttl: gone, as pending() says, whether or not it is swept
        return PendingAction.build(spec, ActionState.model_validate_json(st or b"{}"))

    def next_tool_choice(self, session: str) -> Plan[dict[str, Any] | None]:
        check_session(session)
        got: Peeked = yield Run(self.scripts.peek(session))
        if got.directive is not None:
            return {"type": "directive",
                    **got.directive.model_dump(
                        exclude={"payload", "kind", "fingerprint", "payload_schema"})}
        return soft_requirement(got.head) if got.head is not None else None

    def history(self, session: str, count: int = 100) -> Plan[list[dict[str, Any]]]:
        check_session(session)
        entries, = yield Batch(lambda p: p.xrevrange(self.keys.history(session), count=count))
        return [{"at": e.decode(), **{k.decode(): v.decode() for k, v in f.items()}}
                for e, f in reversed(entries)]

    def dead_letters(self, session: str) -> Plan[list[dict[str, Any]]]:
        check_session(session)
        items, = yield Batch(lambda p: p.lrange(self.keys.dead(session), 0, -1))
        return [orjson.loads(x) for x in items]

    def stats(self) -> Plan[dict[str, Any]]:
        k = self.keys
        parts = range(k.partitions)
        live_replies = yield Batch(lambda p: queue_live(p, k))
        live = parse_live(live_replies)

        def queue(pipe: Any) -> None:
            for p in parts:
                pipe.scard(k.sessions(p))
                pipe.xlen(k.requests(p))
                pipe.zcard(k.leases(p))
                pipe.get(k.seq(p))
                pipe.xlen(k.requests_dead(p))
                pipe.zcard(k.expiries(p))
                for pool in live.pools:
                    pipe.xlen(k.task_queue(p, pool))

        got = yield Batch(queue)
        width = 6 + len(live.pools)
        rows = [got[i * width:(i + 1) * width] for i in parts]
        return {"sessions": sum(r[0] for r in rows), "requests_waiting": sum(r[1] for r in rows),
                "leases": sum(r[2] for r in rows), "handlers": sorted(live.routes),
                "pools": len(live.pools), "partitions": k.partitions,
                # ids are reserved in blocks: this counts reserved ones, staged or skipped
                "ids_reserved": sum(int(r[3] or 0) for r in rows),
                "malformed_requests": sum(r[4] for r in rows),
                "expiring": sum(r[5] for r in rows),
                "tasks_queued": sum(sum(r[6:]) for r in rows)}
