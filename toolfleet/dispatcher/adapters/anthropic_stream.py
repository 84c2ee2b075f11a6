"""Anthropic Messages, streamed (``stream=True``): ``message_start``, ``content_block_*``,
``message_delta``, ``message_stop`` events.

Source: Anthropic API reference, "Streaming Messages": a ``content_block_start`` with a
``tool_use`` block opens a call (``id``, ``name``, ``input: {}``); ``content_block_delta`` events
with ``input_json_delta`` carry ``partial_json`` fragments to be joined; ``content_block_stop``
closes the block. Joined fragments that are empty mean ``{}`` (a tool called without input), or
the ``input`` of the start event when a gateway put the whole input there.

Blocks are keyed by their ``index``; a ``content_block_start`` at an index already used starts a
new block (and a new call). A call is complete at its ``content_block_stop``. Block fields the
parser does not interpret survive the rebuild; a text block left without text (``text: ""`` and
no ``text_delta``) is dropped from it, as the API refuses one ("text content blocks must be
non-empty"). A field of the wrong type raises BatchRejected with its JSON pointer, the event's
position first (``/4/delta/partial_json``).

A stream's size is the model's to choose, so each event costs its own size: text, thinking and
citations deltas are kept as pieces and joined when the message is rebuilt (:meth:`response`),
usage is merged into one dict of the parser's own (concatenating at each delta took 4.2 s for
800 kB of text).
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ToolCall
from .anthropic import AnthropicAdapter
from .base import CallAssembler, StreamFormat, as_dict
from .wire import at, call_arguments, cut, join_surrogates, kind, need_index, need_object, need_text


class AnthropicStreamParser:
    def __init__(self) -> None:
        self.calls = CallAssembler()
        self.cut_off: list[str] = []
        self.warnings: list[str] = []
        self._message: dict[str, Any] = {}
        self._blocks: list[dict[str, Any]] = []  # in stream order
        self._at: dict[int | None, int] = {}  # block index -> position in _blocks (the latest block there)
        self._start_input: dict[int, Any] = {}
        self._server_input: dict[int, list[str]] = {}  # position -> input fragments of a block run server-side
        self._pieces: dict[tuple[int, str], list[Any]] = {}  # (position, field) -> text pieces / citations so far
        self._usage: dict[str, Any] | None = None  # the message's usage once merged: the parser's own dict
        self._events = -1

    def feed(self, event: Any) -> list[ToolCall]:
        self._events += 1
        where = f"/{self._events}"
        data = as_dict(event)
        if not isinstance(data, dict):
            self.warnings.append(f"ignored an event that is not an object: {cut(str(data), 60)}")
            return []
        kind_ = data.get("type")
        if kind_ in ("content_block_start", "content_block_delta", "content_block_stop"):
            index = need_index(data.get("index"), at(where, "index"))
        if kind_ == "message_start":
            self._message = dict(need_object(data.get("message"), at(where, "message"), "message", optional=True))
        elif kind_ == "content_block_start":
            block = dict(need_object(data.get("content_block"), at(where, "content_block"), "content_block"))
            self._at[index] = len(self._blocks)
            self._blocks.append(block)
            if block.get("type") == "tool_use":
                here = at(where, "content_block")
                self.calls.start(self._at[index], need_text(block.get("id"), at(here, "id"), "a tool_use id"),
                                 need_text(block.get("name"), at(here, "name"), "a tool name"))
                self._start_input[self._at[index]] = block.get("input")
        elif kind_ == "content_block_delta":
            self._delta(index, need_object(data.get("delta"), at(where, "delta"), "delta"), at(where, "delta"))
        elif kind_ == "content_block_stop":
            position = self._at.get(index)
            if position in self._server_input:
                self._close_server_input(position)
            slot = self.calls.get(position)
            if slot is not None and not slot.done:
                joined = join_surrogates("".join(slot.parts))
                start = self._start_input.get(position)  # Anthropic sends {} and then the deltas; a gateway
                # may send the whole input at the start, as an object or as JSON text: read as the block's
                if joined.strip() or start is None or start == {} or start == "":
                    self.calls.complete(position, joined)
                else:
                    self.calls.complete(position, call_arguments(start))
        elif kind_ == "message_delta":
            self._message.update(need_object(data.get("delta"), at(where, "delta"), "delta", optional=True))
            usage = need_object(data.get("usage"), at(where, "usage"), "usage", optional=True)
            if usage:
                old = self._message.get("usage")
                if old is not self._usage or old is None:  # a copy the first time: the event's dict stays as it was
                    old = self._usage = dict(old) if isinstance(old, dict) else {}
                    self._message["usage"] = old
                old.update(usage)
        elif kind_ == "error":
            self.warnings.append(f"the stream reported an error: {cut(str(data.get('error') or data), 120)}")
        return self.calls.release()

    def _delta(self, index: int | None, delta: dict[str, Any], where: str) -> None:
        kind_ = delta.get("type")
        position = self._at.get(index)
        if position is None:
            self.warnings.append(f"{where}: a delta for block {index}, which never started, was ignored")
            return
        block = self._blocks[position]
        if kind_ == "input_json_delta":
            text = need_text(delta.get("partial_json"), at(where, "partial_json"), "partial_json")
            slot = self.calls.get(position)
            if slot is not None and not slot.done:
                slot.parts.append(text)
            elif slot is None and _runs_elsewhere(block):
                self._server_input.setdefault(position, []).append(text)
            else:
                self.warnings.append(f"input fragment for block {index} ignored (no open tool_use there)")
            return
        for key, field in (("text_delta", "text"), ("thinking_delta", "thinking")):
            if kind_ == key:
                text = delta.get(field)
                if isinstance(text, str):
                    self._piece(position, field, lambda old: old if isinstance(old, str) else "").append(text)
                elif text is not None:
                    self.warnings.append(f"{at(where, field)}: ignored {kind(text)} (text expected)")
        if kind_ == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind_ == "citations_delta":
            self._piece(position, "citations", lambda old: old if isinstance(old, list) else []).append(
                delta.get("citation"))

    def _piece(self, position: int, field: str, first: Any) -> list[Any]:
        """The pieces of ``field`` of block ``position`` so far; the first time, what the block
        started with (``first(value)``: text as ``[text]``, citations as the list)."""
        pieces = self._pieces.get((position, field))
        if pieces is None:
            block = self._blocks[position]
            start = block[field] = first(block.get(field))  # the field's place among the block's keys, as before
            pieces = self._pieces[(position, field)] = list(start) if field == "citations" else [start]
        return pieces

    def _close_server_input(self, position: int) -> None:
        """The joined input of a block the API runs itself (``server_tool_use``, ``mcp_tool_use``):
        it goes back in the history as it was streamed, as the SDK's own accumulator keeps it."""
        joined = join_surrogates("".join(self._server_input.pop(position)))
        if not joined.strip():
            return
        try:
            value = json.loads(joined)
        except (ValueError, RecursionError):
            self.warnings.append(f"the input of block {position} ({self._blocks[position].get('type')}) is not "
                                 "JSON; kept as it started")
            return
        if isinstance(value, dict):
            self._blocks[position]["input"] = value

    def finish(self) -> list[ToolCall]:
        for position in list(self._server_input):
            self._close_server_input(position)
        for slot in self.calls.open_slots():
            self.cut_off.append(slot.id)
            slot.done = True
        return self.calls.release()

    def response(self) -> dict[str, Any]:
        for (position, field), pieces in self._pieces.items():  # joined once; later deltas add to the joined text
            if field == "citations":
                self._blocks[position][field] = list(pieces)
            else:
                self._blocks[position][field] = pieces[0] if len(pieces) == 1 else "".join(pieces)
                pieces[:] = [self._blocks[position][field]]
        content = []
        for position, block in enumerate(self._blocks):
            block = dict(block)
            slot = self.calls.get(position)
            if slot is not None:
                block.update(type="tool_use", id=slot.id, name=slot.name, input=_object(slot.arguments()))
            if block.get("type") == "text" and not (isinstance(block.get("text"), str) and block["text"].strip()):
                continue  # the API refuses an empty text block
            content.append(block)
        message = {**self._message, "type": "message", "role": "assistant", "content": content}
        if self._usage is not None and message.get("usage") is self._usage:
            message["usage"] = dict(self._usage)  # later deltas do not change a message already handed out
        return message


def _runs_elsewhere(block: dict[str, Any]) -> bool:
    """A block whose tool the API (or an MCP server it calls) runs: ``server_tool_use``,
    ``mcp_tool_use``; its input streams as ``input_json_delta`` as a ``tool_use``'s does (the
    anthropic SDK's ``TRACKS_TOOL_INPUT``)."""
    kind_ = block.get("type")
    return isinstance(kind_, str) and kind_.endswith("tool_use") and kind_ != "tool_use"


def _object(arguments: Any) -> dict[str, Any]:
    """A tool_use ``input`` for the rebuilt message: the arguments as an object, ``{}`` when they
    are not one (the call's own result says what was wrong with them)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if str(arguments).strip() else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class AnthropicStreamAdapter(StreamFormat, AnthropicAdapter):
    name = "anthropic_stream"
    streamed = True

    def parser(self) -> AnthropicStreamParser:
        return AnthropicStreamParser()
