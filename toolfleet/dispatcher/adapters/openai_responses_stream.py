"""OpenAI Responses, streamed (``stream=True``): typed server-sent events ``response.*``.

Source: OpenAI API reference, "Streaming events" for Responses: ``response.output_item.added``
opens an output item (for a call: ``type: "function_call"`` with ``call_id`` and ``name``),
``response.function_call_arguments.delta`` carries argument fragments (``output_index``,
``item_id``, ``delta``), ``response.function_call_arguments.done`` the whole ``arguments``,
``response.output_item.done`` the finished item, and ``response.completed`` the whole response.

A call is complete at its ``function_call_arguments.done`` (or, if that is missing, its
``output_item.done``, or the terminal event: ``response.completed``, ``response.incomplete``,
``response.failed``); the arguments given there win over the joined fragments. A ``function_call``
or ``custom_tool_call`` item that only the terminal event's ``response.output`` carries (no
``output_item`` event announced it) is a call too, taken from there whole, in output order, after
the calls the stream announced: the same calls as the response non-streamed. A ``custom_tool_call``
item is a call from its ``output_item.added``, complete at its ``output_item.done`` (its whole
``input``; a stream ending before it cuts it off), listed in
:attr:`OpenAIResponsesStreamParser.custom` (it gets ``UNKNOWN_TOOL``: :mod:`.custom_calls`).

A built-in tool item the client executes (``local_shell_call``, ``shell_call``,
``apply_patch_call``, client ``tool_search_call``: :mod:`.client_tools`) is a call from its
``output_item.added`` (its place in model order), complete at its ``output_item.done`` (the whole
item: a ``shell_call``'s commands stream in before it), or taken whole from the terminal response
as above; each is read into :attr:`OpenAIResponsesStreamParser.client` (``{call_id: ClientCall}``),
from which the dispatcher answers it. A ``computer_call`` raises
:class:`~toolfleet.errors.BatchRejected` (reason ``unanswerable_call``) at its first event.

A ``function_call`` item's ``namespace`` (from any copy of the item: added, done or the terminal
response's) is kept in :attr:`OpenAIResponsesStreamParser.namespaces` (``{call_id: namespace}``)
before the call is released; the dispatcher resolves the tool it runs from it (:mod:`.namespaces`).

A ``function_call`` the output token limit cut off (its ``output_item.done`` with ``status:
"incomplete"``, or still open at a ``response.incomplete`` for ``max_output_tokens``: the rules of
:mod:`.cut_off`) is listed in ``cut_off`` as it completes, and does not run.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ...models import ToolCall
from .base import CallAssembler, StreamFormat, as_dict
from .client_tools import ClientCall, answered_ids, is_client_call, read_item, refuse_unanswerable
from .client_tools import tool_name as client_tool_name
from .cut_off import RUNNABLE, responses_cut_calls, safety_stop
from .namespaces import item_namespace
from .openai_responses import OpenAIResponsesAdapter
from .wire import at, cut, dumps, join_surrogates, need_index, need_list, need_object, need_text, reject, short
from .wire import kind as kind_of

_ENDS = ("response.completed", "response.incomplete", "response.failed")


class OpenAIResponsesStreamParser:
    def __init__(self) -> None:
        self.calls = CallAssembler()
        self.cut_off: list[str] = []
        self.cut_why: dict[str, str] = {}  # call id -> what cut it off at the token limit (.cut_off)
        self._stopped: str | None = None  # what said the safety system stopped the response (.cut_off)
        self.custom: set[str] = set()  # call ids of custom_tool_call items
        self.client: dict[str, ClientCall] = {}  # call id -> its built-in tool item, read when whole (.client_tools)
        self._builtin: set[str] = set()  # call ids of built-in tool items the client executes, from their start
        self.namespaces: dict[str, str] = {}  # call id -> its function_call item's namespace (.namespaces)
        self.warnings: list[str] = []
        self._base: dict[str, Any] = {}
        self._final: dict[str, Any] | None = None
        self._items: list[dict[str, Any]] = []  # output items in stream order
        self._at: dict[Any, int] = {}  # output_index -> position in _items (the latest item there)
        self._keys: dict[str, int] = {}  # item id -> position
        self._answered: set[str] = set()  # call ids the stream's answer items carry (answered_ids, kept as it grows)
        self._index: dict[tuple[str, Any, str], deque[int]] | None = None  # _announced's look-up, while _end runs
        self._matched: set[int] = set()  # positions a terminal response's item was found as (each once)
        self._events = -1

    def feed(self, event: Any) -> list[ToolCall]:
        self._events += 1
        where = f"/{self._events}"
        data = as_dict(event)
        if not isinstance(data, dict):
            self.warnings.append(f"ignored an event that is not an object: {cut(str(data), 60)}")
            return []
        kind = data.get("type", "")
        if kind in ("response.created", "response.in_progress"):
            self._base = need_object(data.get("response"), at(where, "response"), "response", optional=True)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            self._item(data, where, done=kind.endswith(".done"))
        elif kind == "response.function_call_arguments.delta":
            text = need_text(data.get("delta"), at(where, "delta"), "delta")
            slot = self.calls.get(self._key(data, where))
            if slot is None:
                self.warnings.append(f"argument fragment for an unknown item {short(data.get('item_id'))} ignored")
            elif slot.done:
                if text.strip():
                    self.warnings.append(f"call {slot.id}: argument text after its arguments were done was ignored")
            else:
                slot.parts.append(text)
        elif kind == "response.function_call_arguments.done":
            key = self._key(data, where)
            slot = self.calls.get(key)
            if slot is not None:
                slot.name = slot.name or need_text(data.get("name"), at(where, "name"), "name")
                self.calls.complete(key, _text(data.get("arguments"), at(where, "arguments")))
        elif kind in _ENDS:
            self._final = need_object(data.get("response"), at(where, "response"), "response", optional=True) or None
            self._end(self._final or {}, at(where, "response"))
            if kind != "response.completed":
                self.warnings.append(f"the response ended with {kind}")
        elif kind == "error":
            self.warnings.append(f"the stream reported an error: {cut(str(data.get('message') or data), 120)}")
        return self.calls.release()

    def _item(self, data: dict[str, Any], where: str, done: bool) -> None:
        here = at(where, "item")
        item = dict(need_object(data.get("item"), here, "item"))
        index = need_index(data.get("output_index"), at(where, "output_index"), "output_index")
        item_id = need_text(item.get("id"), at(here, "id"), "an item id")
        key = index if index is not None else item_id or len(self._items)
        position = self._keys.get(item_id) if item_id else None  # an item is known by its id first (docs/streams.md)
        if position is None or _another_item(self._items[position], item):  # (an id reused for another call)
            position = self._at.get(key)
        known = self._items[position] if position is not None else None
        if known is None or _another_item(known, item):
            if known is not None:  # the index reused by a new item: a new call
                self.calls.complete(position)
            position = len(self._items)
            self._items.append(item)
            self._at[key] = position
        else:
            self._items[position] = {**known, **item}
        if item_id:
            self._keys[item_id] = position
        self._answered |= answered_ids([self._items[position]])
        self._call(item, position, here, done)

    def _call(self, item: dict[str, Any], position: int, here: str, done: bool) -> None:
        """Start (or continue) the call of the output item at ``position``; ``done``: the item is
        whole (its ``output_item.done``, or the terminal response's copy)."""
        if item.get("type") == "custom_tool_call":  # a call from its added item; its whole input at done
            call_id = need_text(item.get("call_id"), at(here, "call_id"), "a call_id")
            slot = self.calls.start(position, call_id, need_text(item.get("name"), at(here, "name"), "a tool name"))
            slot.id = slot.id or call_id
            self.custom.add(slot.id)
            if done:
                self.calls.complete(position, {"input": item.get("input")})
            return
        if is_client_call(item, self._answered):
            self._client(item, position, here, done)
            return
        if item.get("type") != "function_call":
            return
        call_id = need_text(item.get("call_id"), at(here, "call_id"), "a call_id")
        name = need_text(item.get("name"), at(here, "name"), "a function name")
        slot = self.calls.start(position, call_id, name)
        slot.id = slot.id or call_id
        slot.name = slot.name or name
        self._namespace(item, slot.id)
        if done:
            if item.get("status") == "incomplete" and not slot.done:  # the token limit ended it (.cut_off)
                self._cut(slot.id, "status incomplete")
            self.calls.complete(position, _text(item.get("arguments"), at(here, "arguments")))
        elif item.get("arguments"):
            slot.parts.append(need_text(item["arguments"], at(here, "arguments"), "arguments"))

    def _client(self, item: dict[str, Any], position: int, here: str, done: bool) -> None:
        """Start (or, ``done``, complete) the call of a built-in tool item the client executes."""
        call_id = need_text(item.get("call_id"), at(here, "call_id"), "a call_id")
        slot = self.calls.start(position, call_id, client_tool_name(str(item["type"])))
        slot.id = slot.id or call_id
        self._builtin.add(slot.id)
        if done or item.get("type") == "computer_call":
            if done and item.get("status") == "incomplete" and not slot.done:  # the token limit ended it (.cut_off)
                self._cut(slot.id, "status incomplete")
            client = read_item(item, slot.index, here)
            refuse_unanswerable([(client, here)])
            self.client[slot.id] = client
            self.calls.complete(position, client.call.arguments)

    def _end(self, final: dict[str, Any], where: str) -> None:
        """The terminal event's ``response``: its calls still open complete with the arguments it
        gives (those the token limit cut off, :func:`.cut_off.responses_cut_calls`, do not run), and
        its calls the stream never announced are taken whole, in output order."""
        output = need_list(final.get("output"), at(where, "output"), "output")
        cut = set(responses_cut_calls(final))
        self._stopped = safety_stop("openai_responses", final)  # every call still open: a safety stop
        if self._stopped is not None:
            cut |= {i.get("call_id") for i in map(as_dict, output) if isinstance(i, dict) and i.get("type") in RUNNABLE}
        answered = answered_ids(output)
        self._index, self._matched = {}, set()
        for position, known in enumerate(self._items):
            self._remember(position, known)
        for n, item in enumerate(output):
            here = at(at(where, "output"), n)
            item = need_object(item, here, "an output item")
            builtin = is_client_call(item, answered)
            if item.get("type") not in ("function_call", "custom_tool_call") and not builtin:
                continue
            position = self._announced(item)
            if position is None:  # a call only the terminal response carries: taken whole, in output order
                position = len(self._items)
                self._items.append(dict(item))
                self._remember(position, self._items[position])
                self._matched.add(position)
                if isinstance(item.get("id"), str) and item["id"]:
                    self._keys[item["id"]] = position
                if item.get("type") == "function_call":
                    self.calls.start(position, need_text(item.get("call_id"), at(here, "call_id"), "a call_id"),
                                     need_text(item.get("name"), at(here, "name"), "a function name"))
            slot = self.calls.get(position)
            if item.get("type") == "custom_tool_call" or builtin or slot is None or slot.done:
                if builtin and item.get("call_id") in cut and not (slot is not None and slot.done):
                    item = {**item, "status": "incomplete"}  # still open at the token limit (.cut_off)
                self._call(item, position, here, done=True)
                continue
            self._namespace(item, slot.id)
            if item.get("call_id") in cut:
                self._cut(slot.id, "status incomplete")
            self.calls.complete(position, _text(item.get("arguments"), at(here, "arguments")))

    def _remember(self, position: int, known: dict[str, Any]) -> None:
        """Index the item at ``position`` by (type, field, value) for :meth:`_announced` (linear in the
        stream: the terminal response's items are looked up, not searched for)."""
        assert self._index is not None
        kind_ = known.get("type")
        for field in ("call_id", "id"):
            value = known.get(field)
            if isinstance(value, str) and value and isinstance(kind_, str):
                self._index.setdefault((kind_, field, value), deque()).append(position)

    def _announced(self, item: dict[str, Any]) -> int | None:
        """The position of the call item the stream already announced that ``item`` is (the same
        non-empty ``call_id``, whatever its item id: a gateway may write new ones in its summary;
        else the same item ``id``, unless both have call ids that differ), or None. Each position is
        found once: a second item of one call id in the terminal response is another call (a
        repeated id, refused as the whole response would be), not the first one again."""
        def text(value: Any) -> str:
            return value if isinstance(value, str) else ""

        assert self._index is not None
        kind_ = item.get("type")
        for field, other in (("call_id", None), ("id", "call_id")):
            value = text(item.get(field))
            if not value or not isinstance(kind_, str):
                continue
            found = self._index.get((kind_, field, value), deque())
            while found and found[0] in self._matched:  # linear: each is passed over once
                found.popleft()
            for position in found:
                known = self._items[position]
                if position in self._matched or (other and text(known.get(other)) and text(item.get(other))
                                                 and known[other] != item[other]):
                    continue  # one item id on two calls: the call ids tell them apart
                self._matched.add(position)
                return position
        return None

    def _namespace(self, item: dict[str, Any], call_id: str) -> None:
        namespace = item_namespace(item)
        if namespace is not None and call_id:
            self.namespaces.setdefault(call_id, namespace)

    def _cut(self, call_id: str, why: str) -> None:
        if call_id not in self.cut_off:
            self.cut_off.append(call_id)
            self.cut_why[call_id] = self._stopped or why

    def _key(self, data: dict[str, Any], where: str) -> Any:
        """The position of the item an argument event is for: its ``item_id`` first, else its
        ``output_index`` (docs/streams.md)."""
        index = need_index(data.get("output_index"), at(where, "output_index"), "output_index")
        item_id = data.get("item_id")
        if isinstance(item_id, str) and item_id in self._keys:
            return self._keys[item_id]
        return self._at.get(index)

    def finish(self) -> list[ToolCall]:
        for slot in self.calls.open_slots():
            self.cut_off.append(slot.id)
            slot.done = True
        return self.calls.release()

    def response(self) -> dict[str, Any]:
        output = []
        for position, item in enumerate(self._items):
            item = dict(item)
            slot = self.calls.get(position)
            if slot is not None and slot.id not in self.custom and slot.id not in self._builtin:  # a call stays one
                item.update(type="function_call", call_id=slot.id, name=slot.name)
                item["arguments"] = slot.arguments()
                item["status"] = "incomplete" if slot.id in self.cut_off else "completed"
            output.append(item)
        final = self._final if self._final and self._final.get("output") else None
        if (final is not None and len(final["output"]) >= len(output)
                and _call_ids(final["output"]) == _call_ids(output)):
            return final  # the server's own summary, when it names the calls the stream carried, in order
        return {**self._base, "object": "response", "output": output}


def _call_ids(items: list[Any]) -> list[Any]:
    """The (type, call_id) of every item that carries a call id: function, custom and client calls
    alike (comparing function calls only took a summary that lacked a custom call: a breaker's find)."""
    return [(i.get("type"), i.get("call_id")) for i in items if isinstance(i, dict) and i.get("call_id")]


def _text(value: Any, pointer: str) -> str | None:
    """Whole arguments given at the end: text as is, an object as its JSON text, None if missing."""
    if value is None:
        return None
    if isinstance(value, str):
        return join_surrogates(value)
    if isinstance(value, dict):
        return dumps(value) or "{}"
    raise reject(pointer, f"arguments must be a string, not {kind_of(value)}")


class OpenAIResponsesStreamAdapter(StreamFormat, OpenAIResponsesAdapter):
    name = "openai_responses_stream"
    streamed = True

    def parser(self) -> OpenAIResponsesStreamParser:
        return OpenAIResponsesStreamParser()

    def custom_call_ids(self, payload: Any) -> set[str]:
        return super().custom_call_ids(self.whole(payload))

    def client_calls(self, payload: Any) -> dict[str, ClientCall]:
        return super().client_calls(self.whole(payload))


def _another_item(known: dict[str, Any], item: dict[str, Any]) -> bool:
    """Whether ``item``, seen at the output index of ``known``, is another item: their types, ids or
    call ids differ (a server that numbers every item 0, or sends no item ids)."""
    for field in ("type", "id", "call_id"):
        if known.get(field) and item.get(field) and known.get(field) != item.get(field):
            return True
    return False
