"""Calls of custom tools (free-form ``input`` text instead of JSON arguments): OpenAI Chat
``tool_calls`` of ``type: "custom"`` and Responses ``custom_tool_call`` items (OpenAI API reference,
"Function calling", custom tools). toolfleet serves function tools, whose arguments its JSON Schemas
check, so it runs none of them; each still gets its one result, ``UNKNOWN_TOOL``, answered in the
shape its kind takes (``custom_tool_call_output`` in Responses), since the API refuses a history
with a call left unanswered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...models import ErrorCode, ToolCall, ToolResult


def custom_call_results(adapter: Any, payload: Any, calls: Sequence[ToolCall]) -> dict[str, ToolResult]:
    """``{call id: UNKNOWN_TOOL result}`` for the custom tool calls among ``calls`` (parsed from
    ``payload`` by ``adapter``); empty for a format without custom tools."""
    find = getattr(adapter, "custom_call_ids", None)
    custom = find(payload) if find is not None else set()
    return {c.id: custom_call_result(c) for c in calls if c.id in custom}


def custom_call_result(call: ToolCall) -> ToolResult:
    """The ``UNKNOWN_TOOL`` result of a custom tool call."""
    return ToolResult.failure(
        call.id, call.name, ErrorCode.UNKNOWN_TOOL,
        f"{call.name!r} was called as a custom tool (free-form input); toolfleet runs function tools only, whose "
        "JSON arguments it checks, so it did not run",
        "offer the tool to the model as a function tool (toolfleet's tools list) and ask again",
    )
