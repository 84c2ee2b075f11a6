"""OpenAI Responses: ``output`` items of type ``function_call`` in, ``function_call_output`` out.

Source: OpenAI API reference, Responses ("function calling"): a call is an output item
``{"type": "function_call", "id": "fc_…", "call_id": "call_…", "name", "arguments"}`` with
``arguments`` a JSON string. The result is paired by ``call_id`` (not by the item ``id``):
``{"type": "function_call_output", "call_id", "output"}``, an input item of the next request after
the model's own output items. Tools are declared flat:
``{"type": "function", "name", "description", "parameters", "strict"}``.

A ``custom_tool_call`` item (a custom tool: free-form ``input`` text, "Custom tools" in the same
guide) is a call too, in model order, answered by a ``custom_tool_call_output`` item; toolfleet runs
function tools only, so it gets ``UNKNOWN_TOOL`` (:mod:`.custom_calls`) instead of going unanswered,
which the API refuses.

The built-in tool items the client executes (``local_shell_call``, ``shell_call``,
``apply_patch_call``, ``tool_search_call``, ``computer_call``) are calls too, in model order, each
answered in its own shape (:mod:`.client_tools`: shells run as ``run_command``; a
``computer_call`` refuses the batch, reason ``unanswerable_call``).

A ``function_call`` with a ``namespace`` (a function of a ``namespace`` tool) runs the fleet tool
``namespace__name`` when the registry has one, else ``name``; the item goes back as it came
(:mod:`.namespaces`, applied by the dispatcher with :meth:`OpenAIResponsesAdapter.namespaces`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from .base import as_dict, tool_descriptions
from .client_tools import ClientCall, answer, answered_ids, is_client_call, read_item, refuse_unanswerable
from .namespaces import namespaces_of
from .wire import arguments_for_wire, at, call_arguments, for_wire, need_object, need_text

_STATUSES = ("in_progress", "completed", "incomplete")
NULL_REQUIRED = {"code_interpreter_call": frozenset({"code", "outputs"}),
                 "image_generation_call": frozenset({"result"})}
"""Fields of output items the API requires on input even when null (openai-python's input item types:
``Required[Optional[...]]``): a ``code_interpreter_call``'s ``outputs`` are null unless the request
includes them, an ``image_generation_call`` that failed has no ``result``; left out, the next request
is refused ("Missing required parameter"; openai-python#2396)."""
OUTPUT_OF = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
"""Item types of calls the client answers, and the type of the item that answers each."""


def _answered(item: dict[str, Any]) -> bool:
    """An item of a call the client answers (:data:`OUTPUT_OF`); a ``type`` of any JSON value."""
    kind = item.get("type")
    return isinstance(kind, str) and kind in OUTPUT_OF


def answered_here(items: list[Any]) -> set[int]:
    """Positions of the ``function_call`` / ``custom_tool_call`` items of ``items`` whose answer
    (an output item of the same ``call_id``) follows them in the same list, before another call
    of that id: a list that already holds a call's answer (an ``input`` list passed as a response)
    must not run the call again, nor answer it twice. Ids reused across turns (``call_0``) are told
    apart by position."""
    latest: dict[str, int] = {}  # call id -> position of its latest call not yet answered
    answered: set[int] = set()
    outputs = tuple(OUTPUT_OF.values())
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("call_id"), str):
            continue
        if _answered(item):
            latest[item["call_id"]] = n
        elif item.get("type") in outputs and item["call_id"] in latest:
            answered.add(latest.pop(item["call_id"]))
    return answered


class OpenAIResponsesAdapter:
    name = "openai_responses"
    streamed = False

    def parse(self, payload: Any) -> list[ToolCall]:
        """The calls in model order: ``function_call`` and ``custom_tool_call`` items and the
        client-executed built-in tool items (:mod:`.client_tools`). Raises BatchRejected for a
        payload that cannot be read, and (reason ``unanswerable_call``) for one holding a
        ``computer_call``."""
        calls: list[ToolCall] = []
        items, where = self._items(payload)
        answered, clients, done = answered_ids(items), [], answered_here(items)
        for n, item in enumerate(items):
            here = at(where, n)
            if is_client_call(item, answered):
                client = read_item(item, len(calls), here)
                calls.append(client.call)
                clients.append((client, here))
                continue
            if not _answered(item) or n in done:  # (an answered call: not a call to run)
                continue
            custom = item.get("type") == "custom_tool_call"
            calls.append(
                ToolCall(
                    id=need_text(item.get("call_id"), at(here, "call_id"), "a call_id"),
                    name=need_text(item.get("name"), at(here, "name"), "a tool name"),
                    arguments={"input": item.get("input")} if custom else call_arguments(item.get("arguments")),
                    index=len(calls),
                )
            )
        refuse_unanswerable(clients)
        return calls

    def client_calls(self, payload: Any) -> dict[str, ClientCall]:
        """``{call_id: ClientCall}`` of the response's client-executed built-in tool items
        (:mod:`.client_tools`); BatchRejected as :meth:`parse`."""
        items, where = self._items(payload)
        answered, out, n_calls, done = answered_ids(items), {}, 0, answered_here(items)
        for n, item in enumerate(items):
            if is_client_call(item, answered):
                client = read_item(item, n_calls, at(where, n))
                out[client.call.id] = client
            if is_client_call(item, answered) or (_answered(item) and n not in done):
                n_calls += 1
        return out

    def namespaces(self, payload: Any) -> dict[str, str]:
        """``{call_id: namespace}`` of the response's ``function_call`` items that carry a
        ``namespace`` (:mod:`.namespaces`); BatchRejected as :meth:`parse`."""
        return namespaces_of(self.output_items(payload))

    def custom_call_ids(self, payload: Any) -> set[str]:
        """The call ids of the response's ``custom_tool_call`` items; BatchRejected (with the
        pointer) for a payload that cannot be read, as :meth:`parse`."""
        return {str(i.get("call_id")) for i in self.output_items(payload) if i.get("type") == "custom_tool_call"}

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
        openai-python#3008) unless the API requires it even when null (:data:`NULL_REQUIRED`), and
        text that cannot be encoded (a lone surrogate) is cleaned."""
        OpenAIResponsesAdapter.parse(self, payload)
        out = []
        for item in self.output_items(payload):
            keep = NULL_REQUIRED.get(item.get("type"), ()) if isinstance(item.get("type"), str) else ()
            clean = {key: value for key, value in for_wire(item).items() if value is not None or key in keep}
            if _answered(item):
                if item.get("type") == "function_call":
                    clean["arguments"] = arguments_for_wire(item.get("arguments"))
                clean["name"] = clean.get("name") or ""
                if clean.get("status") not in _STATUSES:
                    clean.pop("status", None)  # optional on input; the API takes only these
                if not isinstance(clean.get("id"), str):
                    clean.pop("id", None)
            out.append(clean)
        return out

    def format_results(self, results: Sequence[ToolResult], response: Any = None) -> list[dict[str, Any]]:
        """One output item per result; a result of a ``custom_tool_call`` of ``response`` (the
        payload the calls came from) is a ``custom_tool_call_output``, one of a client-executed
        built-in tool item the answer of its kind (:func:`.client_tools.answer`)."""
        custom = self.custom_call_ids(response) if response is not None else set()
        client = self.client_calls(response) if response is not None else {}
        return [answer(client[r.call_id], r) if r.call_id in client else
                {"type": OUTPUT_OF["custom_tool_call" if r.call_id in custom else "function_call"],
                 "call_id": r.call_id, "output": r.content} for r in results]

    def tools(self, source: Any) -> list[dict[str, Any]]:
        """``strict`` is False: strict mode needs every property required and no defaults, which
        tools with optional parameters do not meet; it is the caller's opt-in."""
        return [{"type": "function", **d, "strict": False} for d in tool_descriptions(source)]
