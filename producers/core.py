"""The client's logic without I/O, shared by ``PendingActions`` and ``AsyncPendingActions``:
plans (``producers/plans.py``) for resolving and reading; staging is ``producers/staging.py``."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import orjson

from pending_actions.broker import texts, tracing
from pending_actions.broker.atomic.replies import Peeked, Pending, RunClaimed
from pending_actions.broker.atomic.scripts import Slot
from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.models import (
    ActionState,
    PendingAction,
    ResolveInput,
    ResolveRequest,
    Result,
    Spec,
    check_session,
    check_tenant,
    merge_patch,
    patch_between,
    person,
)
from pending_actions.broker.payloads import check_json, check_payload
from pending_actions.broker.policy.rules import strictness
from pending_actions.broker.results import base_details, text_result
from pending_actions.broker.routing import parse_live, queue_live
from pending_actions.producers.plans import Batch, Chunks, Plan, Run, Wait
from pending_actions.producers.staging import Staging
from pending_actions.producers.tool import soft_requirement

__all__ = ["Batch", "Chunks", "Core", "Plan", "Run", "Wait"]
GRANT_RE = re.compile(r"^[0-9a-f]{16}\Z")


class Core(Staging):
    # --- agent-framework runs (pending_actions/adapters) -----------------------------------
    def claim_run(self, session: str, tenant: str, token: str, fresh: bool) -> Plan[RunClaimed]:
        """Hold the session's run for this process (``run_lease_s``): a fresh one for
        ``run()``, the paused one for ``resume()``."""
        check_session(session)
        check_tenant(tenant)
        got: RunClaimed = yield Run(self.scripts.claim_run(
            session, tenant=tenant, token=token, lease_ms=int(self.settings.run_lease_s * 1000),
            fresh=fresh))
        return got

    def renew_run(self, session: str, token: str) -> Plan[bool]:
        """Hold the run ``token`` claimed for another ``run_lease_s``; False when it is not
        this token's any more."""
        check_session(session)
        got = yield Run(self.scripts.renew_run(
            session, token=token, lease_ms=int(self.settings.run_lease_s * 1000)))
        return bool(got)

    def save_run(self, session: str, token: str, *, done: bool, framework: str = "",
                 state: str = "", calls: bytes = b"[]") -> Plan[bool]:
        """What the run held by ``token`` came to; False when its lease was taken since."""
        check_session(session)
        got = yield Run(self.scripts.save_run(session, token=token, done=done,
                                              framework=framework, state=state, calls=calls))
        return bool(got)

    def clear_slot(self, session: str, slot: Slot) -> Plan[bool]:
        check_session(session)
        got = yield Run(self.scripts.clear_slot(session, slot))
        return got.previous is not None

    # --- resolving -------------------------------------------------------------------------
    def resolve(self, session: str, action: object, reason: object, extra: object,
                timeout: object, edit: object = None, expect_id: object = None,
                by: object = None, approver: object = None,
                revision: object = None, grant: object = None,
                tenant: object = None) -> Plan[Result]:
        check_session(session)
        given = ResolveInput.parse(action, reason, extra)
        if len(given.reason) > self.settings.max_reason_chars:
            raise InvalidInput("reason", f"{len(given.reason)} characters; the limit is "
                               f"{self.settings.max_reason_chars}")
        if given.extra is not None:
            check_json(given.extra, "extra", self.settings.max_extra_bytes)
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout < 0.001):
            # (the request counts its timeout in whole ms)
            raise InvalidInput("timeout", "must be a positive number of seconds, 0.001 or more")
        if expect_id is not None and (not isinstance(expect_id, str) or not expect_id
                                      or len(expect_id) > 300):
            raise InvalidInput("expect_id", "must be an action id")
        if by is not None:
            by = person("by", by)
        if approver is not None:
            approver = person("approver", approver)
            if by is not None and by != approver:
                raise InvalidInput("by", "a person's resolve is by its approver")
            by = approver
        if grant is not None and (approver is None or not isinstance(grant, str)
                                  or not GRANT_RE.match(grant)):
            raise InvalidInput("grant", "the id of the serve token an approver's resolve came "
                               "through (16 hex digits), only with an approver")
        if tenant is not None:
            check_tenant(tenant)
        if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int)
                                     or revision < 0):
            raise InvalidInput("revision", "must be a revision number (0 or more)")
        patched, decided = None, None
        if edit is not None:
            if not isinstance(edit, dict):
                raise InvalidInput("edit", "must be a JSON Merge Patch object")
            check_json(edit, "edit", self.settings.max_payload_bytes)
            if given.action != "apply":
                raise InvalidInput("edit", "only an apply can edit the payload")
            expect_id, seen, patched, decided = yield from self._check_edit(session, edit,
                                                                            expect_id)
            if revision is not None and revision != seen:
                raise InvalidInput("revision", f"{expect_id} is at revision {seen}, not "
                                   f"{revision}; nothing was changed")
            revision = seen  # the edit goes only with the payload it was checked against
            if approver is None:
                patched = None
        wait = float(timeout or self.settings.resolve_timeout_s)
        req = uuid.uuid4().hex
        tracing.annotate({tracing.SESSION: session, tracing.ACTION: given.action})
        # every field is checked above (req is ours): no model to validate it again
        request = ResolveRequest.encode(req, session, given.action, given.reason, given.extra,
                                        int(wait * 1000), int((time.time() + wait) * 1000),
                                        expect_id, by, edit, tracing.carried(),
                                        approver, revision, patched, grant,
                                        None if tenant is None else str(tenant), decided)
        requests = self.keys.requests(self.keys.partition(session))
        got = yield Wait(self.keys.reply(session, req), wait,
                         first=lambda p: p.execute_command("XADD", requests, "*",
                                                           ResolveRequest.FIELD, request))
        if got is None:
            details = base_details(given.action, given.reason, given.extra)
            result = text_result(texts.timed_out(wait), details, is_error=True)
        else:
            result = Result.model_validate_json(got)
        if result.is_error:
            tracing.errored(result.text.partition("\n")[0][:200])
        return result

    def _check_edit(self, session: str, edit: dict[str, Any],
                    expect_id: str | None) -> Plan[tuple[str, int, str, tuple[str, str]]]:
        """An edit is checked here, against the target it will meet (its payload as people
        edited it so far), and goes only with that target and revision: the request carries
        its id as ``expect_id`` (the caller's own when given), the revision seen and the
        policy version the edited payload was decided by. Returns those (the version as
        (tenant, version)) and the patch from the staged payload to the edited one (JSON
        text)."""
        found = yield from self._target(session)
        if found is None:
            raise InvalidInput("edit", "there is no pending action to edit")
        target, st = found
        if expect_id is not None and expect_id != target.id:
            raise InvalidInput("expect_id", f"{expect_id} is not the current target "
                               f"({target.id} is); nothing was changed")
        shown = merge_patch(target.payload, st.patch) if st.patch is not None else target.payload
        edited = merge_patch(shown, edit)
        check_json(edited, "edit", self.settings.max_payload_bytes, "the edited payload is ")
        check_payload(edited, target.payload_schema, "edit")
        # what people approve must not be stricter than what they were asked: the edited
        # action is decided again (both handlers), by the policy in force now
        verdict, version = yield from self.decided(
            session=session, tool=target.tool, apply=target.apply, label=target.label,
            payload=edited, tenant=target.tenant, reject=target.reject)
        staged = target.policy or {}
        if verdict is not None and verdict.weight > strictness(staged.get("decision"),
                                                               staged.get("approvals")):
            raise InvalidInput("edit", texts.edit_stricter(target.id, verdict, staged))
        patch = orjson.dumps(patch_between(target.payload, edited)).decode()
        # the take checks that this version is still in force (REDECIDE otherwise)
        return target.id, st.revision, patch, (target.tenant, version)

    def _target(self, session: str) -> Plan[tuple[Spec, ActionState] | None]:
        got: Peeked = yield Run(self.scripts.peek(session))
        if got.directive is not None:
            return got.directive, ActionState()
        if got.head is None:
            return None
        head = got.head
        raw, st = yield Batch(lambda p: (p.hget(self.keys.actions(session), head),
                                         p.hget(self.keys.state(session), head)))
        if not raw:
            return None
        return Spec.read(raw, head, session), ActionState.model_validate_json(st or b"{}")

    # --- reading ---------------------------------------------------------------------------
    def pending(self, session: str, limit: int = 1000) -> Plan[list[PendingAction]]:
        check_session(session)
        got: Pending = yield Run(self.scripts.pending(session, limit))
        return got.actions

    def stack_depth(self, session: str) -> Plan[int]:
        """How many actions the session's stack holds, without reading them (one past its ttl
        that the sweep has not ended yet still counts)."""
        check_session(session)
        depth, = yield Batch(lambda p: p.zcard(self.keys.stack(session)))
        return int(depth)

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
        spec = Spec.read(raw, action_id, session)
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

    def tenant_of(self, session: str) -> Plan[str | None]:
        """The tenant the session belongs to; None while it has none (never staged, retired,
        or only a slot set)."""
        check_session(session)
        key = self.keys.sessions(self.keys.partition(session))
        raw, = yield Batch(lambda p: p.hget(key, session))
        return raw.decode() if raw else None

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
                pipe.hlen(k.sessions(p))
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
