"""Your own handlers, as a package of their own: ``Dockerfile`` beside this folder installs it
into the service image, and the compose profile ``handlers`` runs a worker of it
(``pending-actions worker --handlers acme_handlers``). Its workers form a pool of their own:
stages of ``acme.note`` go to them, the example handlers' to the other workers."""

from __future__ import annotations

from typing import Any

from pending_actions import PendingAction, ToolError, handler


@handler("acme.note")
def note(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> str:
    """Takes a note (here: says so); a real one would write it where its team reads, keyed
    by ``idempotency_key`` so that a retried attempt does not write it twice."""
    text = action.payload.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ToolError("acme.note needs payload.text, a non-empty string")
    return f"Noted: {text} ({reason})"
