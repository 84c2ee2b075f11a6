"""Anthropic Messages, streamed (``stream=True``): ``message_start``, ``content_block_*``,
``message_delta``, ``message_stop`` events.

Source: Anthropic API reference, "Streaming Messages": a ``content_block_start`` with a
``tool_use`` block opens a call (``id``, ``name``, ``input: {}``); ``content_block_delta`` events
with ``input_json_delta`` carry ``partial_json`` fragments to be joined; ``content_block_stop``
closes the block. Joined fragments that are empty mean ``{}`` (a tool called without input).

A call is complete at its ``content_block_stop``.
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ToolCall
from .anthropic import AnthropicAdapter
from .base import CallAssembler, StreamFormat, as_dict


class AnthropicStreamParser:
    def __init__(self) -> None:
        self.calls = CallAssembler()
        self.cut_off: list[str] = []
        self.warnings: list[str] = []
        self._message: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._start_input: dict[int, Any] = {}

    def feed(self, event: Any) -> list[ToolCall]:
        data = as_dict(event)
        kind = data.get("type") if isinstance(data, dict) else None
        index = data.get("index") if isinstance(data, dict) else None
        if kind == "message_start":
            self._message = dict(as_dict(data.get("message")) or {})
        elif kind == "content_block_start":
            block = dict(as_dict(data.get("content_block")) or {})
            self._blocks[index] = block
            if block.get("type") == "tool_use":
                self.calls.start(index, str(block.get("id") or ""), str(block.get("name") or ""))
                self._start_input[index] = block.get("input")
        elif kind == "content_block_delta":
            self._delta(index, as_dict(data.get("delta")) or {})
        elif kind == "content_block_stop":
            slot = self.calls.get(index)
            if slot is not None:
                joined = "".join(slot.parts)
                start = self._start_input.get(index)
                final = joined if joined.strip() or not (isinstance(start, dict) and start) else start
                self.calls.complete(index, final)
        elif kind == "message_delta":
            self._message.update(as_dict(data.get("delta")) or {})
            if data.get("usage"):
                self._message["usage"] = {**(self._message.get("usage") or {}), **as_dict(data["usage"])}
        elif kind == "error":
            self.warnings.append(f"the stream reported an error: {str(data.get('error') or data)[:120]}")
        return self.calls.release()

    def _delta(self, index: Any, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        block = self._blocks.setdefault(index, {})
        if kind == "input_json_delta":
            slot = self.calls.get(index)
            if slot is None or slot.done:
                self.warnings.append(f"input fragment for block {index} ignored (no open tool_use there)")
            else:
                slot.parts.append(str(delta.get("partial_json") or ""))
        elif kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text") or "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def finish(self) -> list[ToolCall]:
        for slot in self.calls.open_slots():
            self.cut_off.append(slot.id)
            slot.done = True
        return self.calls.release()

    def response(self) -> dict[str, Any]:
        content = []
        for index in sorted(self._blocks, key=lambda k: k if isinstance(k, int) else -1):
            block = dict(self._blocks[index])
            slot = self.calls.get(index)
            if slot is not None:
                block["input"] = _object(slot.arguments())
            content.append(block)
        return {**self._message, "type": "message", "role": "assistant", "content": content}


def _object(arguments: Any) -> dict[str, Any]:
    """A tool_use ``input`` for the rebuilt message: the arguments as an object, ``{}`` when they
    are not one (the call's own result says what was wrong with them)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if str(arguments).strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class AnthropicStreamAdapter(StreamFormat, AnthropicAdapter):
    name = "anthropic_stream"
    streamed = True

    def parser(self) -> AnthropicStreamParser:
        return AnthropicStreamParser()
