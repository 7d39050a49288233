"""``PendingActions``: what an agent runtime imports to stage actions and resolve them."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import orjson
import redis

from pending_actions.broker import texts
from pending_actions.broker.backoff import Backoff
from pending_actions.broker.connection import BLOCK_CHUNK_S, TRANSIENT
from pending_actions.broker.context import Context
from pending_actions.broker.errors import (
    Forbidden,
    InvalidInput,
    RedisUnavailable,
    UnknownHandler,
)
from pending_actions.broker.events import Event
from pending_actions.broker.failures import redis_errors, translate
from pending_actions.broker.feed import publish
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
)
from pending_actions.broker.results import base_details, text_result
from pending_actions.broker.scripts import Slot
from pending_actions.broker.settings import Settings
from pending_actions.producers.tool import soft_requirement

BY_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def _foreign(session: str) -> Forbidden:
    return Forbidden(f"session {session!r} belongs to another tenant")


def _redis_errors() -> AbstractContextManager[None]:
    """Every redis-py error as the package's (RedisUnavailable, RedisFull, Forbidden, ...)."""
    return redis_errors()


class PendingActions:
    """Client of the service. Thread-safe; one per process is enough."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.ctx = Context.create(self.settings)

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> PendingActions:
        return cls(Settings(redis_url=url, **overrides))

    @property
    def client(self) -> redis.Redis:
        return self.ctx.client

    def close(self) -> None:
        self.ctx.client.close()

    # --- staging ---------------------------------------------------------------------------
    def _spec(self, session: str, kind: str, tool: object, label: object, apply: object,
              reject: object, payload: object, prefix: str) -> tuple[str, bytes]:
        fields = self._validate(session, kind, tool, label, apply, reject, payload)
        self._check_handlers([fields])
        seq = self.client.incr(self.ctx.keys.seq)
        spec = self._encode(fields, f"{prefix}:{tool}:{seq}")
        return spec.id, orjson.dumps(spec.model_dump())

    def _encode(self, fields: dict[str, Any], action_id: str) -> Spec:
        return Spec(id=action_id, created_at=time.time(), **fields)

    def _validate(self, session: object, kind: str, tool: object, label: object,
                  apply: object, reject: object, payload: object,
                  tenant: object = DEFAULT_TENANT) -> dict[str, Any]:
        """Every check that needs no Redis; returns the spec's fields."""
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
        return {"session": session, "kind": kind, "tool": tool, "label": label,
                "apply": apply, "reject": reject, "payload": payload, "tenant": tenant}

    def _check_handlers(self, checked: list[dict[str, Any]]) -> None:
        """One round trip: every handler name the validated specs use exists, and no session
        belongs to another tenant (stage.lua checks that again, atomically)."""
        wanted = {(field, f[field]) for f in checked for field in ("apply", "reject")
                  if f[field] is not None}
        pairs = sorted(wanted)
        owners = sorted({(f["session"], f["tenant"]) for f in checked})
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.ctx.keys.handlers, [name for _f, name in pairs])
        for session, _t in owners:
            pipe.get(self.ctx.keys.tenant(session))
        found, *tenants = pipe.execute()
        for (field, name), value in zip(pairs, found, strict=True):
            if value is None:
                raise UnknownHandler(field, name)
        for (session, tenant), owner in zip(owners, tenants, strict=True):
            if owner is not None and owner.decode() != tenant:
                raise _foreign(session)

    def stage_many(self, actions: Iterable[dict[str, Any]]) -> list[str]:
        """Stage many actions in a few round trips: each dict has the keyword arguments of
        ``stage``. Every action is checked before anything is staged; in each session they go
        on the stack in the order given (so the last one given is the head)."""
        checked = [self._validate(a.get("session"), "action", a.get("tool"), a.get("label"),
                                  a.get("apply"), a.get("reject"), a.get("payload"),
                                  a.get("tenant", DEFAULT_TENANT))
                   for a in actions]
        if not checked:
            return []
        with _redis_errors():
            self._check_handlers(checked)
            last = int(self.client.incrby(self.ctx.keys.seq, len(checked)))
            pipe = self.client.pipeline(transaction=False)
            staged = []
            for seq, fields in enumerate(checked, start=last - len(checked) + 1):
                spec = self._encode(fields, f"pending-action:{fields['tool']}:{seq}")
                # depth 0 needs no look: an id staged already was staged by a retry of this
                staged.append((spec, self.ctx.scripts.stage(
                    spec.session, spec.id, orjson.dumps(spec.model_dump()),
                    spec.tenant).on(pipe)))
                publish(pipe, self.ctx.keys, Event.STAGED, spec)
            pipe.sadd(self.ctx.keys.sessions, *{f["session"] for f in checked})
            for tenant in {f["tenant"] for f in checked}:
                pipe.sadd(self.ctx.keys.tenant_sessions(tenant),
                          *{f["session"] for f in checked if f["tenant"] == tenant})
            replies = pipe.execute()
        for spec, queued in staged:
            if queued.get(replies).depth < 0:  # another tenant took the session meanwhile
                raise _foreign(spec.session)
        return [spec.id for spec, _q in staged]

    def stage(self, *, session: str, tool: str, label: str, apply: str,
              reject: str | None = None, payload: dict[str, Any] | None = None,
              tenant: str = DEFAULT_TENANT) -> str:
        """Stage a pending action on top of the session's stack. Returns its id. A session
        belongs to the tenant of its first stage; staging for another raises Forbidden."""
        return self.stage_many([{"session": session, "tool": tool, "label": label,
                                 "apply": apply, "reject": reject, "payload": payload,
                                 "tenant": tenant}])[0]

    def set_directive(self, session: str, *, tool: str, label: str, apply: str,
                      reject: str | None = None) -> str:
        """Set the session's one-shot directive; it takes precedence over the stack."""
        return self._set_slot(session, "directive", tool, label, apply, reject)

    def set_standing(self, session: str, *, tool: str, label: str, apply: str,
                     reject: str | None = None) -> str:
        """Set the session's standing handler: the fallback when nothing else is pending."""
        return self._set_slot(session, "standing", tool, label, apply, reject)

    def _set_slot(self, session: str, slot: Slot, tool: str, label: str, apply: str,
                  reject: str | None) -> str:
        with _redis_errors():
            slot_id, spec = self._spec(session, slot, tool, label, apply, reject, None, slot)
            self.ctx.scripts.set_slot(session, slot, slot_id, spec).run()
            self.client.sadd(self.ctx.keys.sessions, session)
        return slot_id

    def clear_standing(self, session: str) -> bool:
        check_session(session)
        with _redis_errors():
            return self.ctx.scripts.clear_slot(session, "standing").run().previous is not None

    def clear_directive(self, session: str) -> bool:
        check_session(session)
        with _redis_errors():
            return self.ctx.scripts.clear_slot(session, "directive").run().previous is not None

    # --- resolving -------------------------------------------------------------------------
    def resolve(self, *, session: str, action: str, reason: str,
                extra: dict[str, Any] | None = None, timeout: float | None = None,
                expect_id: str | None = None, by: str | None = None) -> Result:
        """Apply or discard the session's current target and wait for the outcome.

        ``expect_id``: go through only if that id is the target, else an error result naming
        ``expect_id`` and nothing changes (a person approves exactly what they saw). ``by``:
        who resolves, recorded in the session's history."""
        check_session(session)
        given = ResolveInput.parse(action, reason, extra)
        if len(given.reason) > self.settings.max_reason_chars:
            raise InvalidInput("reason", f"{len(given.reason)} characters; the limit is "
                               f"{self.settings.max_reason_chars}")
        if given.extra is not None:
            size = len(orjson.dumps(given.extra))
            if size > self.settings.max_extra_bytes:
                raise InvalidInput("extra", f"{size} bytes as JSON; the limit is "
                                   f"{self.settings.max_extra_bytes}")
        if expect_id is not None and (not isinstance(expect_id, str) or not expect_id
                                      or len(expect_id) > 300):
            raise InvalidInput("expect_id", "must be an action id")
        if by is not None and (not isinstance(by, str) or not BY_RE.match(by)):
            raise InvalidInput("by", "must be 1-128 characters of A-Z a-z 0-9 . _ : @ -")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
            raise InvalidInput("timeout", "must be a positive number of seconds")
        wait = float(timeout or self.settings.resolve_timeout_s)
        req = uuid.uuid4().hex
        request = ResolveRequest(req=req, session=session, action=given.action,
                                 reason=given.reason, extra=given.extra,
                                 timeout_ms=int(wait * 1000),
                                 deadline_ms=int((time.time() + wait) * 1000),
                                 expect_id=expect_id, by=by)
        with _redis_errors():
            self.client.xadd(self.ctx.keys.requests, request.to_fields())
        got = self._wait_reply(self.ctx.keys.reply(session, req), wait)
        if got is None:
            details = base_details(given.action, given.reason, given.extra)
            return text_result(texts.timed_out(wait), details, is_error=True)
        return Result.model_validate_json(got[1])

    def _wait_reply(self, key: str, wait: float) -> Any:
        """BLPOP until the deadline. A dropped connection is retried with the time that is
        left (the request is already in Redis and will be answered); Redis staying away
        raises RedisUnavailable."""
        deadline = time.monotonic() + wait
        retry = Backoff(cap=0.5)
        while (left := deadline - time.monotonic()) > 0:
            try:
                got = self.client.blpop([key], timeout=max(min(left, BLOCK_CHUNK_S), 0.01))
                if got is not None:
                    return got
            except TRANSIENT as exc:
                if retry.failures >= 3:
                    raise RedisUnavailable(f"Redis is unavailable: {exc}") from exc
            except redis.RedisError as exc:
                raise translate(exc) from exc
                time.sleep(min(retry.next(), max(deadline - time.monotonic(), 0)))
        return None

    # --- reading ---------------------------------------------------------------------------
    def pending(self, session: str, limit: int = 1000) -> list[PendingAction]:
        """In-flight actions first, then the stack, head first."""
        check_session(session)
        with _redis_errors():
            return self.ctx.scripts.pending(session, limit).run().actions

    def show(self, session: str, action_id: str) -> PendingAction | None:
        """One staged action, directive or standing handler by id; None if it is gone."""
        found = next((a for a in self.pending(session) if a.id == action_id), None)
        if found is not None:
            return found
        k = self.ctx.keys
        with _redis_errors():
            pipe = self.client.pipeline(transaction=True)
            pipe.hget(k.actions(session), action_id)
            pipe.hget(k.state(session), action_id)
            raw, st = pipe.execute()
        if raw is None:
            return None
        return PendingAction.build(Spec.model_validate_json(raw),
                                   ActionState.model_validate_json(st or b"{}"))

    def next_tool_choice(self, session: str) -> dict[str, Any] | None:
        """The directive if set; else a soft requirement to call resolve; else None."""
        check_session(session)
        with _redis_errors():
            got = self.ctx.scripts.peek(session).run()
        if got.directive is not None:
            return {"type": "directive",
                    **got.directive.model_dump(exclude={"payload", "kind"})}
        return soft_requirement(got.head) if got.head is not None else None

    def history(self, session: str, count: int = 100) -> list[dict[str, Any]]:
        check_session(session)
        with _redis_errors():
            entries: Any = self.client.xrevrange(self.ctx.keys.history(session), count=count)
        return [{"at": e.decode(), **{k.decode(): v.decode() for k, v in f.items()}}
                for e, f in reversed(entries)]

    def dead_letters(self, session: str) -> list[dict[str, Any]]:
        check_session(session)
        with _redis_errors():
            return [orjson.loads(x) for x in self.client.lrange(self.ctx.keys.dead(session), 0, -1)]

    def stats(self) -> dict[str, Any]:
        k, c = self.ctx.keys, self.client
        with _redis_errors():
            pipe = c.pipeline(transaction=False)
            pipe.scard(k.sessions)
            pipe.xlen(k.requests)
            pipe.zcount(k.leases, "-inf", "(+inf")  # not the sweep's +inf sentinel
            pipe.hkeys(k.handlers)
            pipe.get(k.seq)
            pipe.xlen(k.requests_dead)
            pipe.xlen(k.task_queue(self.settings.queue))
            sessions, requests, leased, handlers, seq, bad, tasks = pipe.execute()
        return {"sessions": sessions, "requests_waiting": requests,
                "leases": leased, "handlers": sorted(h.decode() for h in handlers),
                "staged_total": int(seq or 0), "malformed_requests": bad,
                "tasks_queued": tasks}
