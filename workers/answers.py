"""What a resolve worker answers when take.lua ran no handler: it decided about people's
approvals (``answer``, ``answer_people``: held for people, or an approval counted) or found no
live worker for a target's handler (``refuse_no_worker``). The housekeeping that completes a
``policy set`` stopped half way is ``workers/policy_markers.py``."""

from __future__ import annotations

import logging
from typing import Any

from pending_actions.broker import texts
from pending_actions.broker.atomic.replies import Taken, TakeStatus
from pending_actions.broker.context import Context
from pending_actions.broker.events import Event
from pending_actions.broker.feed import publish
from pending_actions.broker.models import ResolveRequest, Result
from pending_actions.broker.results import base_details, text_result

log = logging.getLogger("pending_actions.resolver")


def answer(request: ResolveRequest, got: Taken) -> Result:
    """The reply to a resolve that take.lua held for people, or counted as an approval."""
    assert got.spec is not None and got.counters is not None
    spec, st = got.spec, got.counters
    policy = spec.policy or {}
    need = int(policy.get("approvals") or 1)
    # approvals are of one verb at a time: those of the other count for nothing here
    names = (st.approved_by or []) if (st.approving or "apply") == request.action else []
    details = base_details(request.action, request.reason, request.extra, spec)
    details.update(policy=policy, approved_by=names, revision=st.revision)
    if got.status is TakeStatus.REDECIDE:
        return text_result(texts.policy_changed(spec.id), {**details, "edit": request.edit},
                           is_error=True)
    if got.status is TakeStatus.REVISED:
        details["revision_seen"] = request.revision
        return text_result(texts.revised(spec.id, request.revision, st.revision), details,
                           is_error=True)
    if got.status is TakeStatus.NEEDS_APPROVAL:
        return text_result(texts.needs_approval(spec.id, spec.label, policy.get("rule"),
                                                spec.tenant, need, names, request.action),
                           details, is_error=True)
    again = None if got.recorded else request.approver
    return text_result(texts.approved(len(names), need, names, again, request.action),
                       details)


def _reply(pipe: Any, ctx: Context, request: ResolveRequest, body: bytes) -> None:
    key = ctx.keys.reply(request.session, request.req)
    pipe.rpush(key, body)
    pipe.expire(key, ctx.settings.reply_ttl_s)


def answer_people(ctx: Context, answered: list[tuple[ResolveRequest, Taken]]) -> None:
    """Reply to what take.lua decided about people's approvals (``answer``), with the feed
    entry of a recorded approval, in one round trip."""
    if not answered:
        return
    pipe = ctx.client.pipeline(transaction=False)
    for request, got in answered:
        assert got.spec is not None and got.counters is not None
        if got.status is TakeStatus.APPROVED and got.recorded:
            publish(pipe, ctx.keys, Event.APPROVED, got.spec, by=request.approver,
                    rule=(got.spec.policy or {}).get("rule") or "",
                    approvals=len(got.counters.approved_by or []))
        _reply(pipe, ctx, request, answer(request, got).to_json())
    pipe.execute()


def refuse_no_worker(ctx: Context, refused: list[tuple[ResolveRequest, Taken]]) -> None:
    """Tell each resolver at once that no live worker has its target's handler; nothing was
    taken, so the action stays where it was (not re-dispatched in a loop)."""
    if not refused:
        return
    pipe = ctx.client.pipeline(transaction=False)
    for request, got in refused:
        log.warning("no live worker has handler %r for %s", got.handler, got.id)
        text = texts.no_worker(request.action, got.id, got.handler or None)
        reply = text_result(text, base_details(request.action, request.reason,
                                               request.extra, got.spec), is_error=True)
        _reply(pipe, ctx, request, reply.to_json())
    pipe.execute()
