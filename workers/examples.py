"""Example handlers for the quick start:
``pending-actions up --handlers pending_actions.workers.examples``."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from pending_actions.broker.errors import Stale, ToolError
from pending_actions.broker.fingerprint import file_fingerprint, text_fingerprint
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


@handler("examples.write_file")
def write_file(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
               idempotency_key: str) -> dict[str, Any]:
    """Applies ``producers.example.propose_edit``: writes ``payload["content"]`` to
    ``payload["path"]`` atomically, if the file is still what the preview was computed from."""
    path = Path(action.payload["path"])
    content: str = action.payload["content"]
    now = file_fingerprint(path)
    if now == text_fingerprint(content):
        # a retry after a write whose outcome was lost: the file already holds this edit
        return {"content": f"{path} already holds this edit", "details": {"path": str(path)}}
    if now != action.fingerprint:
        raise Stale(f"{path.name} changed since the preview")
    # temp file beside the target (same filesystem), flushed, then renamed over it: a reader
    # sees the old file or the new one, never half of it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return {"content": f"Wrote {path.name} ({len(content.encode())} bytes)",
            "details": {"path": str(path), "fingerprint": text_fingerprint(content)}}
