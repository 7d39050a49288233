"""What the agent runtime shows the model and people: the ``resolve`` tool definition, its
intent line, the soft requirement, and the rendering of a result."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pending_actions.broker.models import ResolveAction, Result
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
            "enum": list(get_args(ResolveAction)),  # the verbs, as the models name them
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


Format = Literal["openai", "openai-responses", "anthropic"]


def tool_definition(format: Format | None = None) -> dict[str, Any]:
    """The ``resolve`` tool for model function calling: our own shape (name, label, hidden,
    strict, approval, parameters), or with ``format`` the one a model API takes: ``openai``
    (Chat Completions ``tools``), ``openai-responses`` (Responses API) or ``anthropic``
    (Messages API)."""
    if format == "anthropic":
        return anthropic_tool()
    if format in ("openai", "openai-responses"):
        return openai_tool("responses" if format == "openai-responses" else "chat")
    if format is not None:
        raise ValueError(f"unknown tool format {format!r}: openai, openai-responses, anthropic")
    return {
        "name": "resolve",
        "label": "Resolve",
        "description": DESCRIPTION,
        "hidden": True,
        "strict": True,
        "approval": "read",
        "parameters": PARAMETERS,
    }


def openai_tool(api: Literal["chat", "responses"] = "chat") -> dict[str, Any]:
    """The tool as OpenAI's function calling takes it (``ChatCompletionToolParam`` for Chat
    Completions, ``FunctionToolParam`` for the Responses API). Not ``strict`` there: OpenAI's
    strict mode admits no free-form object, and ``extra`` is one by design."""
    function = {"name": "resolve", "description": DESCRIPTION, "parameters": PARAMETERS,
                "strict": False}
    if api == "responses":
        return {"type": "function", **function}
    return {"type": "function", "function": function}


def anthropic_tool() -> dict[str, Any]:
    """The tool as Anthropic's Messages API takes it (``ToolParam``)."""
    return {"name": "resolve", "description": DESCRIPTION, "input_schema": PARAMETERS}


def intent(params: dict[str, Any]) -> str:
    """One line saying what a resolve call is about to do. While the arguments are still
    streaming and ``action`` is not known yet, it is ``accepting changes``."""
    accepting = params.get("action") != "discard"
    reason = params.get("reason")
    if isinstance(reason, str) and reason.strip():
        return f"{'accepting' if accepting else 'discarding'}: {reason}"
    return "accepting changes" if accepting else "discarding changes"


def soft_requirement(head_id: str) -> dict[str, Any]:
    return {"tool": "resolve", "id": head_id, "reminder": REMINDER}


def render(result: Result | dict[str, Any]) -> str:
    """A result for people: Accept, Discard or Failed, with the label and the reason. A failed
    discard is a Discard marked as an error: Failed is an apply that did not go through."""
    res = result if isinstance(result, Result) else Result.model_validate(result)
    details = res.details
    if details.get("action") == "discard":
        status = "Discard (error)" if res.is_error else "Discard"
    else:
        status = "Failed" if res.is_error else "Accept"
    label = details.get("label") or "(no pending action)"
    lines = [f"{status}: {label}"]
    if details.get("reason"):
        lines.append(f"  reason: {details['reason']}")
    if res.text:
        lines.extend(f"  {line}" for line in res.text.splitlines())
    return "\n".join(lines)
