"""What the agent runtime shows the model and people: the ``resolve`` tool definition, its
intent line, the soft requirement, and the rendering of a result."""

from __future__ import annotations

from typing import Any

from pending_actions.broker.models import Result
from pending_actions.broker.texts import REMINDER

DESCRIPTION = (
    "Finalizes the most recent pending action (a staged preview) by applying or discarding it. "
    "`reason` is required and passed to the handler; `extra` is optional free-form metadata."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": ["apply", "discard"],
            "description": "Whether to commit or reject the pending action.",
        },
        "reason": {
            "type": "string",
            "description": "Required explanation passed through to the handler.",
        },
        "extra": {
            "type": "object",
            "description": "Free-form metadata passed through to the handler untouched.",
            "additionalProperties": True,
        },
    },
    "required": ["action", "reason"],
    "additionalProperties": False,
}


def tool_definition() -> dict[str, Any]:
    """The ``resolve`` tool for model function calling."""
    return {
        "name": "resolve",
        "label": "Resolve",
        "description": DESCRIPTION,
        "hidden": True,
        "strict": True,
        "approval": "read",
        "parameters": PARAMETERS,
    }


def intent(params: dict[str, Any]) -> str:
    """One line saying what a resolve call is about to do."""
    accepting = params.get("action") == "apply"
    reason = params.get("reason")
    if isinstance(reason, str) and reason.strip():
        return f"{'accepting' if accepting else 'discarding'}: {reason}"
    return "accepting changes" if accepting else "discarding changes"


def soft_requirement(head_id: str) -> dict[str, Any]:
    return {"tool": "resolve", "id": head_id, "reminder": REMINDER}


def render(result: Result | dict[str, Any]) -> str:
    """A result for people: Accept, Discard or Failed, with the label and the reason."""
    res = result if isinstance(result, Result) else Result.model_validate(result)
    details = res.details
    if res.is_error:
        status = "Failed"
    else:
        status = "Accept" if details.get("action") == "apply" else "Discard"
    label = details.get("label") or "(no pending action)"
    lines = [f"{status}: {label}"]
    if details.get("reason"):
        lines.append(f"  reason: {details['reason']}")
    if res.text:
        lines.extend(f"  {line}" for line in res.text.splitlines())
    return "\n".join(lines)
