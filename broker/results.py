"""Building resolve's one result shape, ``{content, details, is_error}``, for workers
(outcomes) and producers (timeouts). The texts themselves are in ``broker/texts.py``."""

from __future__ import annotations

from typing import Any

import orjson

from pending_actions.broker import texts
from pending_actions.broker.models import Result, Spec
from pending_actions.broker.texts import NOTHING_TO_APPLY as NOTHING_TO_APPLY
from pending_actions.broker.texts import NOTHING_TO_DISCARD as NOTHING_TO_DISCARD
from pending_actions.broker.texts import done


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


def nothing_to_target_json(action: str, reason: str, extra: dict[str, Any] | None) -> bytes:
    """``nothing_to_target(...).to_json()`` without the model: the resolve worker sends it
    with every take, in case there is nothing to take, and it is seldom used. The same bytes
    (``tests/test_input.py`` compares them)."""
    apply = action == "apply"
    return orjson.dumps({
        "content": [{"type": "text", "text": NOTHING_TO_APPLY if apply else NOTHING_TO_DISCARD}],
        "details": base_details(action, reason, extra), "is_error": apply})


def not_the_target(action: str, reason: str, extra: dict[str, Any] | None,
                   expect_id: str) -> Result:
    details = {**base_details(action, reason, extra), "expect_id": expect_id}
    return text_result(texts.not_the_target(expect_id), details, is_error=True)


def expired(action: str, reason: str, extra: dict[str, Any] | None, expect_id: str) -> Result:
    details = {**base_details(action, reason, extra), "expect_id": expect_id}
    return text_result(texts.expired(expect_id), details, is_error=True)


def from_handler(value: object, action: str, spec: Spec, reason: str,
                 extra: dict[str, Any] | None) -> Result:
    """Turn what a handler returned (str, dict with content/details, or None) into a Result.

    Raises TypeError for anything else: the caller treats that as a failed attempt."""
    details = base_details(action, reason, extra, spec)
    if value is None:
        return text_result(done(action, spec.label, reason), details)
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
