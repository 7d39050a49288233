"""tool_definition() in the function-calling formats of the OpenAI and Anthropic APIs, checked
against those SDKs' own types: pydantic validates each against the SDK's TypedDict, and no key
is one the type does not declare."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter

from pending_actions import tool_definition
from pending_actions.producers.tool import PARAMETERS


@pytest.mark.parametrize(("fmt", "kind"), [
    ("openai", ChatCompletionToolParam),
    ("openai-responses", FunctionToolParam),
    ("anthropic", ToolParam),
])
def test_formats_match_the_sdk_types(fmt: Any, kind: Any) -> None:
    tool = tool_definition(fmt)
    TypeAdapter(kind).validate_python(tool)
    declared = set(kind.__annotations__)
    assert set(tool) <= declared, set(tool) - declared


def test_openai_chat_format() -> None:
    tool = tool_definition("openai")
    function = tool["function"]
    assert tool["type"] == "function" and function["name"] == "resolve"
    assert function["parameters"] == PARAMETERS
    from openai.types.shared_params import FunctionDefinition

    assert set(function) <= set(FunctionDefinition.__annotations__)


def test_anthropic_format() -> None:
    tool = tool_definition("anthropic")
    assert tool["name"] == "resolve" and tool["input_schema"] == PARAMETERS
    assert tool["input_schema"]["type"] == "object"


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        tool_definition("gemini")  # type: ignore[arg-type]
