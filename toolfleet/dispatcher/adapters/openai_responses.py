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
from .base import as_dict, tool_descriptions
from .wire import arguments_for_wire, at, call_arguments, for_wire, need_object, need_text

_STATUSES = ("in_progress", "completed", "incomplete")


class OpenAIResponsesAdapter:
    name = "openai_responses"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        calls = []
        items, where = self._items(payload)
        for n, item in enumerate(items):
            here = at(where, n)
            if item.get("type") != "function_call":
                continue
            calls.append(
                ToolCall(
                    id=need_text(item.get("call_id"), at(here, "call_id"), "a call_id"),
                    name=need_text(item.get("name"), at(here, "name"), "a function name"),
                    arguments=call_arguments(item.get("arguments")),
                    index=len(calls),
                )
            )
        return calls

    def _items(self, payload: Any) -> tuple[list[dict[str, Any]], str]:
        data, where = as_dict(payload), ""
        if isinstance(data, dict):
            data, where = data.get("output"), "/output"
        if not isinstance(data, list):
            raise BatchRejected("expected a response with an output list, or a list of output items",
                                reason="unreadable_payload", pointer=where or "/")
        return [need_object(i, at(where, n), "an output item") for n, i in enumerate(data)], where

    def output_items(self, payload: Any) -> list[dict[str, Any]]:
        """The ``output`` items of a response (or a list of items given directly); BatchRejected
        (with the pointer) for an item that is not an object."""
        return self._items(payload)[0]

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        """The response's output items: the next request's input repeats them before the
        ``function_call_output`` items (reasoning items included, as the API asks). Every field is
        kept, except what the API refuses: a ``function_call``'s ``arguments`` go back as a JSON
        string (``null`` as ``"{}"``), a missing ``name`` as ``""``, an ``id`` that is not a string
        or a ``status`` the API does not know is left out, a field whose value is ``null`` is left
        out (what the SDK's ``model_dump()`` writes for every unset field: ``"status": null`` on a
        reasoning item, which the API refuses, "Unknown parameter: 'input[1].status'";
        openai-python#3008), and text that cannot be encoded (a lone surrogate) is cleaned."""
        OpenAIResponsesAdapter.parse(self, payload)
        out = []
        for item in self.output_items(payload):
            clean = {key: value for key, value in for_wire(item).items() if value is not None}
            if item.get("type") == "function_call":
                clean["arguments"] = arguments_for_wire(item.get("arguments"))
                clean["name"] = clean.get("name") or ""
                if clean.get("status") not in _STATUSES:
                    clean.pop("status", None)  # optional on input; the API takes only these
                if not isinstance(clean.get("id"), str):
                    clean.pop("id", None)
            out.append(clean)
        return out

    def format_results(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        return [{"type": "function_call_output", "call_id": r.call_id, "output": r.content} for r in results]

    def tools(self, source: Any) -> list[dict[str, Any]]:
        """``strict`` is False: strict mode needs every property required and no defaults, which
        tools with optional parameters do not meet; it is the caller's opt-in."""
        return [{"type": "function", **d, "strict": False} for d in tool_descriptions(source)]
