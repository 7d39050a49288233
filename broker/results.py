"""Building the results of CONTRACT section 2. Shared by workers (outcomes) and producers
(timeouts), so the texts live in one place."""

from __future__ import annotations

from typing import Any

from pending_actions.broker.models import Result, Spec

NOTHING_TO_APPLY = "No pending action to resolve. Nothing to apply or discard."
NOTHING_TO_DISCARD = "Nothing to discard; no pending action remains."


def base_details(
    action: str, reason: str, extra: dict[str, Any] | None, spec: Spec | None = None
) -> dict[str, Any]:
    details: dict[str, Any] = {"action": action, "reason": reason}
    if extra is not None:
        details["extra"] = extra
    if spec is not None:
        details["sourceToolName"] = spec.tool
        details["label"] = spec.label
    return details


def text_result(text: str, details: dict[str, Any], *, is_error: bool = False) -> Result:
    return Result(content=[{"type": "text", "text": text}], details=details, is_error=is_error)


def nothing_to_target(action: str, reason: str, extra: dict[str, Any] | None) -> Result:
    details = base_details(action, reason, extra)
    if action == "apply":
        return text_result(NOTHING_TO_APPLY, details, is_error=True)
    return text_result(NOTHING_TO_DISCARD, details)


def default_text(action: str, spec: Spec, reason: str) -> str:
    verb = "Applied" if action == "apply" else "Discarded"
    return f"{verb}: {spec.label}. Reason: {reason}"


def from_handler(value: object, action: str, spec: Spec, reason: str,
                 extra: dict[str, Any] | None) -> Result:
    """Turn what a handler returned (str, dict with content/details, or None) into a Result.

    Raises TypeError for anything else: the caller treats that as a failed attempt."""
    details = base_details(action, reason, extra, spec)
    if value is None:
        return text_result(default_text(action, spec, reason), details)
    if isinstance(value, str):
        return text_result(value, details)
    if isinstance(value, dict) and "content" in value:
        content = value["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
            raise TypeError("handler result 'content' must be a str or a list of objects")
        if value.get("details") is not None:
            details["sourceResultDetails"] = value["details"]
        return Result(content=content, details=details, is_error=bool(value.get("is_error")))
    raise TypeError(
        f"handler returned {type(value).__name__}; expected str, dict with 'content', or None"
    )
