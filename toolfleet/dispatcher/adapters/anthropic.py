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

import json
from collections.abc import Sequence
from typing import Any

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from ...tools.validation import MAX_NESTING
from .base import as_dict, tool_descriptions
from .wire import at, call_arguments, depth_of, for_wire, need_object, need_text


class AnthropicAdapter:
    name = "anthropic"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        calls = []
        blocks, where = self._blocks(payload)
        for n, block in enumerate(blocks):
            here = at(where, n)
            if block.get("type") != "tool_use":
                continue
            calls.append(
                ToolCall(
                    id=need_text(block.get("id"), at(here, "id"), "a tool_use id"),
                    name=need_text(block.get("name"), at(here, "name"), "a tool name"),
                    arguments=call_arguments(block.get("input")),
                    index=len(calls),
                )
            )
        return calls

    def _blocks(self, payload: Any) -> tuple[list[dict[str, Any]], str]:
        data, where = as_dict(payload), ""
        if isinstance(data, dict):
            data, where = data.get("content"), "/content"
        if not isinstance(data, list):
            raise BatchRejected("expected a message with a content list, or a list of content blocks",
                                reason="unreadable_payload", pointer=where or "/")
        return [need_object(b, at(where, n), "a content block") for n, b in enumerate(data)], where

    def content_blocks(self, payload: Any) -> list[dict[str, Any]]:
        """The content blocks of a message (or a list of blocks given directly); BatchRejected
        (with the pointer) for a block that is not an object."""
        return self._blocks(payload)[0]

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        """``[{"role": "assistant", "content": <the blocks>}]``: every block and field kept, except
        what the API refuses: a text block with no text other than white space is dropped
        ("text content blocks must be non-empty"), a ``tool_use`` whose ``input`` is not an object
        (or nests past the argument depth limit) goes back with ``{}`` (its result says what was
        wrong), and text that cannot be encoded (a lone surrogate) is cleaned. ``[]`` (no message)
        when no block is left (``content: []``, or only white-space text): the API refuses an
        assistant message with empty content, and :func:`~toolfleet.dispatcher.history.repair_history`
        removes one (``empty_message_removed``)."""
        AnthropicAdapter.parse(self, payload)
        blocks = blocks_for_wire(self.content_blocks(payload))
        return [{"role": "assistant", "content": blocks}] if blocks else []

    def format_results(self, results: Sequence[ToolResult], response: Any = None) -> list[dict[str, Any]]:
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


def blocks_for_wire(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant content blocks as the Messages API takes them back (see
    :meth:`AnthropicAdapter.assistant_messages`)."""
    out = []
    for block in blocks:
        if block.get("type") == "text" and not (isinstance(block.get("text"), str) and block["text"].strip()):
            continue
        if block.get("type") == "tool_use":
            given = block.get("input")
            if isinstance(given, str):  # input sent as JSON text: the object it holds, as it ran
                try:
                    given = json.loads(given) if given.strip() else {}
                except (ValueError, RecursionError):
                    given = None
            fit = isinstance(given, dict) and depth_of(given, MAX_NESTING) <= MAX_NESTING
            block = {**block, "input": given if fit else {}, "name": block.get("name") or ""}
        out.append(for_wire(block))
    return out
