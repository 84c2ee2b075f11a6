"""Anthropic Messages: ``content`` blocks of type ``tool_use`` in, one ``user`` message of
``tool_result`` blocks out.

Source: Anthropic API reference, Messages ("tool use"): a call is a content block
``{"type": "tool_use", "id": "toolu_…", "name", "input"}`` with ``input`` an *object*. All results
of one assistant turn go back in ONE ``user`` message whose content starts with the
``tool_result`` blocks, in the order of the calls: ``{"type": "tool_result", "tool_use_id",
"content", "is_error": true}`` (``is_error`` only on errors). Tools are declared as
``{"name", "description", "input_schema"}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from .base import arguments_text, as_dict, tool_descriptions


class AnthropicAdapter:
    name = "anthropic"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        calls = []
        for block in self.content_blocks(payload):
            if block.get("type") != "tool_use":
                continue
            calls.append(
                ToolCall(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=arguments_text(block.get("input")),
                    index=len(calls),
                )
            )
        return calls

    def content_blocks(self, payload: Any) -> list[dict[str, Any]]:
        """The content blocks of a message (or a list of blocks given directly)."""
        data = as_dict(payload)
        if isinstance(data, dict):
            data = data.get("content")
        if not isinstance(data, list):
            raise BatchRejected("expected a message with a content list, or a list of content blocks",
                                reason="unreadable_payload")
        return [block for block in (as_dict(b) for b in data) if isinstance(block, dict)]

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        """``[{"role": "assistant", "content": <the blocks, unchanged>}]``."""
        return [{"role": "assistant", "content": self.content_blocks(payload)}]

    def format_results(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        if not results:
            return []
        return [{"role": "user", "content": [result_block(r) for r in results]}]

    def tools(self, source: Any) -> list[dict[str, Any]]:
        return [
            {"name": d["name"], "description": d["description"], "input_schema": d["parameters"]}
            for d in tool_descriptions(source)
        ]


def result_block(result: ToolResult) -> dict[str, Any]:
    """One ``tool_result`` block; ``is_error: true`` only on an error result."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.call_id, "content": result.content}
    if not result.ok:
        block["is_error"] = True
    return block
