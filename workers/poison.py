"""Poison: a stored record that does not parse. Whoever meets one parks it (park.lua: the
session's dead letters get its raw bytes and the reason), tells the resolver waiting on it,
and carries on; every other session is untouched."""

from __future__ import annotations

import logging

from pending_actions.broker.context import Context
from pending_actions.broker.errors import Poison
from pending_actions.broker.models import ResolveRequest
from pending_actions.broker.results import base_details, text_result

log = logging.getLogger("pending_actions.poison")

PARKABLE = {"spec", "state", "lease"}


def not_served(request: ResolveRequest, why: str) -> bytes:
    """The error result for a resolve that could not be served."""
    details = base_details(request.action, request.reason, request.extra)
    return text_result(f"Could not resolve: {why}", details, is_error=True).to_json()


def park_poison(ctx: Context, session: str, found: Poison, req: str = "",
                reply: bytes = b"", token: str = "") -> bool:
    """Park the record ``found`` names. Returns False when it is not a record that can be
    parked (a key of the wrong type: an operator's to mend) or it changed meanwhile."""
    if found.what not in PARKABLE:
        log.error("session %s: %s; an operator has to mend or delete that key", session, found)
        return False
    raw = ctx.client.hget(found.key, found.field)
    if raw is None:
        return False
    assert isinstance(raw, bytes)
    parked = ctx.scripts.park(session, what=found.what, field=found.field,  # type: ignore[arg-type]
                              raw=raw, reason=str(found), req=req, reply=reply,
                              token=token).run()
    if parked:
        log.warning("session %s: %s parked in its dead letters", session, found)
    return parked


def park_spec(ctx: Context, session: str, action_id: str, raw: bytes, reason: str,
              req: str = "", reply: bytes = b"", token: str = "") -> bool:
    """Park a spec that Python could not read (valid JSON, not a valid spec, say)."""
    return ctx.scripts.park(session, what="spec", field=action_id, raw=raw, reason=reason,
                            req=req, reply=reply, token=token).run()
