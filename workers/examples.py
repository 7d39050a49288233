"""Example handlers for the quick start:
``pending-actions up --handlers pending_actions.workers.examples``."""

from __future__ import annotations

from typing import Any

from pending_actions.broker.errors import ToolError
from pending_actions.broker.models import PendingAction
from pending_actions.workers.registry import handler


@handler("examples.echo")
def echo(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
         idempotency_key: str) -> dict[str, Any]:
    """Applies nothing; answers with what it was given."""
    return {
        "content": [{"type": "text", "text": f"Applied {action.label}: {reason}"}],
        "details": {"payload": action.payload, "attempt": action.attempts,
                    "idempotency_key": idempotency_key},
    }


@handler("examples.fail_once")
def fail_once(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
              idempotency_key: str) -> str:
    """Fails the first attempt with a ToolError, succeeds on the retry."""
    if action.attempts < 2:
        raise ToolError(f"{action.label}: first attempt refused; call resolve again to retry")
    return f"Applied {action.label} on attempt {action.attempts}"


@handler("examples.reject")
def reject(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
           idempotency_key: str) -> None:
    """A reject handler that returns None, so the default discard text is used."""
    return None
