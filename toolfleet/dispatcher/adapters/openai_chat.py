"""OpenAI Chat Completions: ``choices[0].message.tool_calls`` in, ``role: tool`` messages out.

Source: OpenAI API reference, Chat Completions ("function calling"): each tool call has ``id``,
``type: "function"``, ``function.name`` and ``function.arguments`` (a JSON *string*, possibly
invalid); each result goes back as ``{"role": "tool", "tool_call_id": <id>, "content": <text>}``,
one per call, after the assistant message that made the calls. ``choices[0]`` is read whatever its
``index`` says (``null`` or missing included), as the streamed format reads choice 0; a choice given
alone (``completion.choices[0]``) is read as its message. Tools are declared as
``{"type": "function", "function": {"name", "description", "parameters"}}``.

A tool call of ``type: "custom"`` (``custom: {"name", "input"}``, a custom tool's free-form text) is
a call too, answered by a ``role: tool`` message as any; toolfleet runs function tools only, so it
gets ``UNKNOWN_TOOL`` (:mod:`.custom_calls`), and goes back as it came (no ``function`` added).

A message whose only call is a ``function_call`` of the deprecated ``functions`` API (no id; its
answer a ``role: "function"`` message) refuses the batch, reason ``missing_call_id``
(:func:`.wire.refuse_legacy_function_call`), streamed or not; it used to read as no call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from .base import as_dict, tool_descriptions
from .wire import (
    arguments_for_wire,
    at,
    call_arguments,
    for_wire,
    need_list,
    need_object,
    need_text,
    refuse_legacy_function_call,
    reject,
)


class OpenAIChatAdapter:
    name = "openai_chat"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        message, where = self._message(payload)
        calls = []
        for index, raw in enumerate(need_list(message.get("tool_calls"), at(where, "tool_calls"), "tool_calls")):
            here = at(at(where, "tool_calls"), index)
            raw = need_object(raw, here, "a tool call")
            if raw.get("type") == "custom":
                custom = need_object(raw.get("custom"), at(here, "custom"), "custom", optional=True)
                name = need_text(custom.get("name"), at(at(here, "custom"), "name"), "a tool name")
                arguments: str | dict[str, Any] = {"input": custom.get("input")}
            else:
                function = need_object(raw.get("function"), at(here, "function"), "function", optional=True)
                name = need_text(function.get("name"), at(at(here, "function"), "name"), "a function name")
                arguments = call_arguments(function.get("arguments"))
            calls.append(ToolCall(id=need_text(raw.get("id"), at(here, "id"), "a call id"), name=name,
                                  arguments=arguments, index=index))
        if not calls:
            refuse_legacy_function_call(message.get("function_call"), at(where, "function_call"))
        return calls

    def custom_call_ids(self, payload: Any) -> set[str]:
        """The ids of the completion's tool calls of ``type: "custom"``; BatchRejected (with the
        pointer) for a payload that cannot be read, as :meth:`parse`."""
        message, _ = self._message(payload)
        calls = [as_dict(c) for c in message.get("tool_calls") or []]
        return {str(c.get("id")) for c in calls if isinstance(c, dict) and c.get("type") == "custom"}

    def _message(self, payload: Any) -> tuple[dict[str, Any], str]:
        data = as_dict(payload)
        if isinstance(data, dict) and "choices" in data:
            choices = need_list(data.get("choices"), "/choices", "choices", optional=False)
            if not choices:
                raise reject("/choices", "the completion has no choices")
            choice = need_object(choices[0], "/choices/0", "a choice")
            return need_object(choice.get("message"), "/choices/0/message", "message", optional=True), \
                "/choices/0/message"
        if not isinstance(data, dict):
            raise BatchRejected("expected a chat completion or an assistant message", reason="unreadable_payload",
                                pointer="/")
        if is_choice(data):  # completion.choices[0]: its message (read as a message, it had no calls)
            return need_object(data.get("message"), "/message", "message", optional=True), "/message"
        return data, ""

    def assistant_message(self, payload: Any) -> dict[str, Any]:
        """The assistant message of a completion (or the message itself), to append before the tool
        messages: every field kept as it came (``extra_content``, ``reasoning_content``, …), except
        what the API would refuse: each call's ``arguments`` go back as a JSON string (``null`` as
        ``"{}"``, how it ran), ``type`` as ``"function"`` when missing, and text that cannot be
        encoded (a lone surrogate) cleaned. Raises BatchRejected as :meth:`parse` does."""
        OpenAIChatAdapter.parse(self, payload)  # the same checks: what goes back is what was read
        message, _ = self._message(payload)
        return for_chat_wire(message)

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        return [self.assistant_message(payload)]

    def format_results(self, results: Sequence[ToolResult], response: Any = None) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in results]

    def tools(self, source: Any) -> list[dict[str, Any]]:
        return [{"type": "function", "function": d} for d in tool_descriptions(source)]


def is_choice(data: dict[str, Any]) -> bool:
    """Whether ``data`` (plain data) is one choice of a completion (``completion.choices[0]``: a
    ``message``, no ``role`` or ``tool_calls`` of its own), not an assistant message."""
    return "message" in data and "role" not in data and "tool_calls" not in data and "choices" not in data


def first_choice(data: dict[str, Any]) -> Any:
    """The first choice of a completion (plain data), or ``data`` itself when it is a choice; None
    when there is none."""
    if is_choice(data):
        return data
    choices = data.get("choices")
    return as_dict(choices[0]) if isinstance(choices, list) and choices else None


def for_chat_wire(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message as the Chat API takes it back (see :meth:`OpenAIChatAdapter.assistant_message`)."""
    out = for_wire(message)
    out["role"] = "assistant"
    calls = []
    for raw in message.get("tool_calls") or []:
        call = for_wire(as_dict(raw))
        if call.get("type") == "custom":  # name and input as the model wrote them
            calls.append(call)
            continue
        function = dict(call.get("function") or {})
        function["name"] = function.get("name") or ""
        function["arguments"] = arguments_for_wire(((as_dict(raw).get("function")) or {}).get("arguments"))
        call["function"] = function
        call["type"] = "function"  # run as a function (whatever type a gateway wrote): it goes back as one
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
    return out
