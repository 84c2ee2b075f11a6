"""OpenAI Chat Completions: ``choices[0].message.tool_calls`` in, ``role: tool`` messages out.

Source: OpenAI API reference, Chat Completions ("function calling"): each tool call has ``id``,
``type: "function"``, ``function.name`` and ``function.arguments`` (a JSON *string*, possibly
invalid); each result goes back as ``{"role": "tool", "tool_call_id": <id>, "content": <text>}``,
one per call, after the assistant message that made the calls. Tools are declared as
``{"type": "function", "function": {"name", "description", "parameters"}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from .base import arguments_text, as_dict, tool_descriptions


class OpenAIChatAdapter:
    name = "openai_chat"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        message = self.assistant_message(payload)
        calls = []
        for index, raw in enumerate(message.get("tool_calls") or []):
            raw = as_dict(raw)
            function = raw.get("function") or {}
            calls.append(
                ToolCall(
                    id=str(raw.get("id") or ""),
                    name=str(function.get("name") or ""),
                    arguments=arguments_text(function.get("arguments")),
                    index=index,
                )
            )
        return calls

    def assistant_message(self, payload: Any) -> dict[str, Any]:
        """The assistant message of a completion (or the message itself), unchanged, so the caller
        can append it before the tool messages."""
        data = as_dict(payload)
        if isinstance(data, dict) and "choices" in data:
            choices = data.get("choices") or []
            if not choices:
                raise BatchRejected("the completion has no choices", reason="unreadable_payload")
            data = as_dict(choices[0]).get("message") or {}
        if not isinstance(data, dict):
            raise BatchRejected("expected a chat completion or an assistant message", reason="unreadable_payload")
        return data

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        return [self.assistant_message(payload)]

    def format_results(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in results]

    def tools(self, source: Any) -> list[dict[str, Any]]:
        return [{"type": "function", "function": d} for d in tool_descriptions(source)]
