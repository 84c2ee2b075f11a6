"""Checking toolfleet's output against the official SDKs' request param types (test-only deps).

pydantic validates ``Iterable[...]`` fields of the SDKs' TypedDicts lazily and ignores unknown
keys, so :func:`conforms` validates in strict mode, drains every lazy iterator (which validates
each item), and compares the result with the input: a dropped key or a coerced value is a failure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from anthropic.types import MessageParam
from anthropic.types import ToolParam as AnthropicToolParam
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.responses import FunctionToolParam, ResponseInputItemParam
from pydantic import TypeAdapter

MESSAGES = {
    "openai_chat": TypeAdapter(list[ChatCompletionMessageParam]),
    "openai_responses": TypeAdapter(list[ResponseInputItemParam]),
    "anthropic": TypeAdapter(list[MessageParam]),
}
TOOLS = {
    "openai_chat": TypeAdapter(list[ChatCompletionFunctionToolParam]),
    "openai_responses": TypeAdapter(list[FunctionToolParam]),
    "anthropic": TypeAdapter(list[AnthropicToolParam]),
}


def base_format(name: str) -> str:
    return name.removesuffix("_stream")


def _drain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_drain(v) for v in value]
    if isinstance(value, Iterator) or type(value).__name__ == "ValidatorIterator":
        return [_drain(v) for v in value]
    return value


def conforms(adapter: TypeAdapter, value: Any) -> None:
    """Raise AssertionError (or pydantic's ValidationError) unless ``value`` is exactly an instance."""
    validated = _drain(adapter.validate_python(value, strict=True))
    assert validated == _drain(value), f"SDK type dropped or changed something:\n{validated}\n!=\n{value}"


def check_messages(format: str, messages: list[dict[str, Any]]) -> None:
    conforms(MESSAGES[base_format(format)], messages)


def check_tools(format: str, tools: list[dict[str, Any]]) -> None:
    conforms(TOOLS[base_format(format)], tools)
