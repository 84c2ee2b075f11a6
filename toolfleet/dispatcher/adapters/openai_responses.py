"""OpenAI Responses: ``output`` items of type ``function_call`` in, ``function_call_output`` out.

Source: OpenAI API reference, Responses ("function calling"): a call is an output item
``{"type": "function_call", "id": "fc_…", "call_id": "call_…", "name", "arguments"}`` with
``arguments`` a JSON string. The result is paired by ``call_id`` (not by the item ``id``):
``{"type": "function_call_output", "call_id", "output"}``, an input item of the next request after
the model's own output items. Tools are declared flat:
``{"type": "function", "name", "description", "parameters", "strict"}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from .base import arguments_text, as_dict, tool_descriptions


class OpenAIResponsesAdapter:
    name = "openai_responses"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        calls = []
        for item in self.output_items(payload):
            if item.get("type") != "function_call":
                continue
            calls.append(
                ToolCall(
                    id=str(item.get("call_id") or ""),
                    name=str(item.get("name") or ""),
                    arguments=arguments_text(item.get("arguments")),
                    index=len(calls),
                )
            )
        return calls

    def output_items(self, payload: Any) -> list[dict[str, Any]]:
        """The ``output`` items of a response (or a list of items given directly)."""
        data = as_dict(payload)
        if isinstance(data, dict):
            data = data.get("output")
        if not isinstance(data, list):
            raise BatchRejected("expected a response with an output list, or a list of output items",
                                reason="unreadable_payload")
        return [item for item in (as_dict(i) for i in data) if isinstance(item, dict)]

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        """The response's output items, unchanged: the next request's input repeats them before
        the ``function_call_output`` items (reasoning items included, as the API asks)."""
        return self.output_items(payload)

    def format_results(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        return [{"type": "function_call_output", "call_id": r.call_id, "output": r.content} for r in results]

    def tools(self, source: Any) -> list[dict[str, Any]]:
        """``strict`` is False: strict mode needs every property required and no defaults, which
        tools with optional parameters do not meet; it is the caller's opt-in."""
        return [{"type": "function", **d, "strict": False} for d in tool_descriptions(source)]
