"""OpenAI Responses, streamed (``stream=True``): typed server-sent events ``response.*``.

Source: OpenAI API reference, "Streaming events" for Responses: ``response.output_item.added``
opens an output item (for a call: ``type: "function_call"`` with ``call_id`` and ``name``),
``response.function_call_arguments.delta`` carries argument fragments (``output_index``,
``item_id``, ``delta``), ``response.function_call_arguments.done`` the whole ``arguments``,
``response.output_item.done`` the finished item, and ``response.completed`` the whole response.

A call is complete at its ``function_call_arguments.done`` (or, if that is missing, its
``output_item.done``, or ``response.completed``); the arguments given there win over the joined
fragments.
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ToolCall
from .base import CallAssembler, StreamFormat, as_dict
from .openai_responses import OpenAIResponsesAdapter

_ENDS = ("response.completed", "response.incomplete", "response.failed")


class OpenAIResponsesStreamParser:
    def __init__(self) -> None:
        self.calls = CallAssembler()
        self.cut_off: list[str] = []
        self.warnings: list[str] = []
        self._base: dict[str, Any] = {}
        self._final: dict[str, Any] | None = None
        self._items: dict[Any, dict[str, Any]] = {}  # output_index -> item
        self._keys: dict[str, Any] = {}  # item id -> output_index

    def feed(self, event: Any) -> list[ToolCall]:
        data = as_dict(event)
        kind = data.get("type", "") if isinstance(data, dict) else ""
        if kind in ("response.created", "response.in_progress"):
            self._base = as_dict(data.get("response")) or {}
        elif kind in ("response.output_item.added", "response.output_item.done"):
            self._item(data, done=kind.endswith(".done"))
        elif kind == "response.function_call_arguments.delta":
            slot = self.calls.get(self._key(data))
            if slot is None:
                self.warnings.append(f"argument fragment for an unknown item {data.get('item_id')!r} ignored")
            elif slot.done:
                self.warnings.append(f"call {slot.id}: argument text after its arguments were done was ignored")
            else:
                slot.parts.append(str(data.get("delta") or ""))
        elif kind == "response.function_call_arguments.done":
            key = self._key(data)
            slot = self.calls.get(key)
            if slot is not None:
                slot.name = slot.name or str(data.get("name") or "")
                self.calls.complete(key, _text(data.get("arguments")))
        elif kind in _ENDS:
            self._final = as_dict(data.get("response")) or None
            for item in (self._final or {}).get("output") or []:
                item = as_dict(item)
                if item.get("type") == "function_call":
                    for key, known in self._items.items():
                        if known.get("call_id") == item.get("call_id"):
                            self.calls.complete(key, _text(item.get("arguments")))
            if kind != "response.completed":
                self.warnings.append(f"the response ended with {kind}")
        elif kind == "error":
            self.warnings.append(f"the stream reported an error: {str(data.get('message') or data)[:120]}")
        return self.calls.release()

    def _item(self, data: dict[str, Any], done: bool) -> None:
        item = as_dict(data.get("item")) or {}
        key = data.get("output_index", item.get("id", len(self._items)))
        self._items[key] = item
        if item.get("id"):
            self._keys[str(item["id"])] = key
        if item.get("type") != "function_call":
            return
        slot = self.calls.start(key, str(item.get("call_id") or ""), str(item.get("name") or ""))
        slot.id = slot.id or str(item.get("call_id") or "")
        slot.name = slot.name or str(item.get("name") or "")
        if done:
            self.calls.complete(key, _text(item.get("arguments")))
        elif item.get("arguments"):
            slot.parts.append(str(item["arguments"]))

    def _key(self, data: dict[str, Any]) -> Any:
        if "output_index" in data:
            return data["output_index"]
        return self._keys.get(str(data.get("item_id")))

    def finish(self) -> list[ToolCall]:
        for slot in self.calls.open_slots():
            self.cut_off.append(slot.id)
            slot.done = True
        return self.calls.release()

    def response(self) -> dict[str, Any]:
        if self._final and self._final.get("output"):
            return self._final
        output = []
        for key in sorted(self._items, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0)):
            item = dict(self._items[key])
            slot = self.calls.get(key)
            if slot is not None:
                arguments = slot.arguments()
                item["arguments"] = arguments if isinstance(arguments, str) else json.dumps(arguments)
                item["status"] = "incomplete" if slot.id in self.cut_off else "completed"
            output.append(item)
        return {**self._base, "object": "response", "output": output}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


class OpenAIResponsesStreamAdapter(StreamFormat, OpenAIResponsesAdapter):
    name = "openai_responses_stream"
    streamed = True

    def parser(self) -> OpenAIResponsesStreamParser:
        return OpenAIResponsesStreamParser()
