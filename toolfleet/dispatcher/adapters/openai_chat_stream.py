"""OpenAI Chat Completions, streamed (``stream=True``): ``chat.completion.chunk`` events.

Source: OpenAI API reference, "Streaming" for Chat Completions: each chunk's
``choices[0].delta.tool_calls`` holds fragments keyed by ``index``; the first fragment of a call
carries its ``id``, ``type`` and ``function.name``, the following ones pieces of
``function.arguments`` to be joined in order; ``finish_reason`` ends the choice.

A call is complete, and released at once, when the first of these happens: its joined arguments
form a complete JSON object (nothing can be appended to one and stay valid JSON), a later call
starts (calls are streamed one after another), or ``finish_reason`` arrives. Only choice 0 is
read, as for the non-streamed format.
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ToolCall
from .base import CallAssembler, StreamFormat, as_dict, parses_as_object
from .openai_chat import OpenAIChatAdapter


class OpenAIChatStreamParser:
    def __init__(self) -> None:
        self.calls = CallAssembler()
        self.cut_off: list[str] = []
        self.warnings: list[str] = []
        self._meta: dict[str, Any] = {}
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._finish: str | None = None
        self._last_key: Any = None

    def feed(self, event: Any) -> list[ToolCall]:
        chunk = as_dict(event)
        if not isinstance(chunk, dict):
            self.warnings.append(f"ignored an event that is not an object: {str(chunk)[:60]}")
            return []
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if chunk.get(key) is not None:
                self._meta.setdefault(key, chunk[key])
        for choice in chunk.get("choices") or []:
            choice = as_dict(choice)
            if choice.get("index", 0) != 0:
                continue
            delta = as_dict(choice.get("delta")) or {}
            if delta.get("content"):
                self._content.append(delta["content"])
            if delta.get("refusal"):
                self._refusal.append(delta["refusal"])
            for fragment in delta.get("tool_calls") or []:
                self._fragment(as_dict(fragment))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                for slot in self.calls.open_slots():
                    slot.done = True
        return self.calls.release()

    def _fragment(self, fragment: dict[str, Any]) -> None:
        function = as_dict(fragment.get("function")) or {}
        key = fragment.get("index")
        if key is None:  # some compatible servers leave out index: a new id starts a new call
            key = len(self.calls.slots()) if fragment.get("id") or self._last_key is None else self._last_key
        self._last_key = key
        slot = self.calls.get(key)
        if slot is None:
            slot = self.calls.start(key, str(fragment.get("id") or ""), str(function.get("name") or ""))
            for earlier in self.calls.open_before(slot.index):
                earlier.done = True
        else:
            slot.id = slot.id or str(fragment.get("id") or "")
            slot.name = slot.name or str(function.get("name") or "")
        text = function.get("arguments")
        if not text:
            return
        if slot.done:
            self.warnings.append(f"call {slot.id or slot.index}: argument text after its arguments were "
                                 f"complete was ignored: {str(text)[:60]!r}")
            return
        slot.parts.append(str(text))
        if parses_as_object("".join(slot.parts)):
            slot.done = True

    def finish(self) -> list[ToolCall]:
        for slot in self.calls.open_slots():
            if self._finish is None:
                self.cut_off.append(slot.id)
            slot.done = True
        return self.calls.release()

    def response(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        tool_calls = []
        for slot in self.calls.slots():
            arguments = slot.arguments()
            tool_calls.append({
                "id": slot.id,
                "type": "function",
                "function": {"name": slot.name,
                             "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
            })
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {**self._meta, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": self._finish}]}


class OpenAIChatStreamAdapter(StreamFormat, OpenAIChatAdapter):
    name = "openai_chat_stream"
    streamed = True

    def parser(self) -> OpenAIChatStreamParser:
        return OpenAIChatStreamParser()
