"""The seam between provider wire formats and toolfleet's provider-neutral calls and results.

Every format is one module with one adapter class (:class:`Adapter`); every streamed format adds a
parser (:class:`StreamParser`) that turns the stream's events into calls as their arguments
complete. Payloads are plain dicts or the official SDK objects (anything with pydantic's
``model_dump``), so no SDK is needed at run time.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import BatchRejected
from ...models import ToolCall, ToolResult
from ...tools.spec import ToolSpec


class Adapter(Protocol):
    """One provider format, in and out.

    - ``parse(payload)``: the provider's response -> the calls in model order. Raises
      :class:`~toolfleet.errors.BatchRejected` when the payload has no readable calls list; a
      single malformed call is not a reason (it becomes an error result).
    - ``assistant_messages(payload)``: the model's own message(s) or items, unchanged, to put
      into the next request before the results.
    - ``format_results(results, response=None)``: results in model order -> the messages (or
      items) to append; ``response``, the payload the calls came from, tells a call's kind where
      the answer's shape depends on it (Responses: ``custom_tool_call_output``).
    - ``tools(source)``: the request's ``tools`` list from a registry (or tool descriptions).
    - ``streamed``: True for a stream format, whose ``parser()`` reads the events one by one.
    """

    name: str
    streamed: bool

    def parse(self, payload: Any) -> list[ToolCall]: ...

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]: ...

    def format_results(self, results: Sequence[ToolResult], response: Any = None) -> list[dict[str, Any]]: ...

    def tools(self, source: Any) -> list[dict[str, Any]]: ...


class StreamParser(Protocol):
    """Reads one stream, event by event.

    - ``feed(event)``: the calls whose arguments this event completed, in model order (a call is
      held back while an earlier one is still open, so calls always come out in model order).
    - ``finish()``: the calls still open when the stream ended. Those whose end was never
      signalled are also listed in ``cut_off`` (their arguments may be truncated).
    - ``response()``: the non-streamed payload the events add up to (for the assistant message).
    - ``warnings``: what the parser ignored and why.
    """

    cut_off: list[str]
    warnings: list[str]

    def feed(self, event: Any) -> list[ToolCall]: ...

    def finish(self) -> list[ToolCall]: ...

    def response(self) -> dict[str, Any]: ...


def results_for(adapter: Any, results: Sequence[ToolResult], response: Any = None) -> list[dict[str, Any]]:
    """``adapter.format_results(results, response=response)``, or without ``response`` for an
    adapter written before that parameter (a user's own, matching the older protocol)."""
    try:
        takes = "response" in inspect.signature(adapter.format_results).parameters
    except (TypeError, ValueError):  # no signature to read: the older protocol
        takes = False
    return adapter.format_results(results, response=response) if takes else adapter.format_results(results)


def as_dict(payload: Any) -> Any:
    """Plain data from a dict or an SDK object (pydantic ``model_dump``), without importing the SDK.

    SDK objects are dumped with the fields the provider actually sent (``exclude_unset``), so an
    assistant message goes back as it came; fields the SDK added on the client and never sends
    (openai-python's ``__api_exclude__``: ``parsed_arguments`` of a ``responses.parse()`` function
    call, ``parsed`` of its output text, which the API refuses: openai-python#2374) are left out,
    at any depth, as the SDK leaves them out of a request."""
    if hasattr(payload, "model_dump"):
        return payload.model_dump(mode="json", exclude_unset=True, by_alias=True, exclude=_api_exclude(payload))
    if isinstance(payload, (list, tuple)):
        return [as_dict(item) for item in payload]
    return payload


def _api_exclude(model: Any) -> dict[Any, Any] | None:
    """The ``exclude`` of pydantic's ``model_dump`` that leaves out each nested SDK object's
    ``__api_exclude__`` fields (a set of field names; openai-python), or None when there are none.
    Walked without recursion (a model from a stream may hold a long list)."""
    root: dict[Any, Any] = {}
    stack: list[tuple[Any, dict[Any, Any]]] = [(model, root)]
    while stack:
        item, out = stack.pop()
        own = getattr(type(item), "__api_exclude__", None)
        if isinstance(own, (set, frozenset)):
            out.update({name: True for name in own if isinstance(name, str)})
        values = getattr(item, "__dict__", {})
        for name, value in values.items() if hasattr(item, "model_dump") else ():
            if out.get(name) is True:
                continue
            children = [(None, value)] if hasattr(value, "model_dump") else (
                list(enumerate(value)) if isinstance(value, (list, tuple)) else [])
            for index, child in children:
                if hasattr(child, "model_dump"):
                    place = out.setdefault(name, {})
                    stack.append((child, place if index is None else place.setdefault(index, {})))
    return _pruned(root) or None


def _pruned(tree: dict[Any, Any]) -> dict[Any, Any]:
    """``tree`` without its empty branches (pydantic reads an empty dict as "exclude nothing" only
    at some depths)."""
    out: dict[Any, Any] = {}
    for key, value in tree.items():
        if value is True:
            out[key] = True
        elif isinstance(value, dict):
            kept = _pruned(value)
            if kept:
                out[key] = kept
    return out


def tool_descriptions(source: Any) -> list[dict[str, Any]]:
    """``[{"name", "description", "parameters"}]`` from a :class:`Registry`, ToolSpecs, or
    descriptions already in that shape (a worker catalog's ``tools``)."""
    out = []
    for item in source:
        described = item.describe() if isinstance(item, ToolSpec) else dict(item)
        out.append({
            "name": described["name"],
            "description": described.get("description") or "",
            "parameters": described.get("parameters") or {"type": "object", "properties": {}},
        })
    return out


def arguments_text(value: Any) -> str | dict[str, Any]:
    """A call's arguments as :class:`ToolCall` takes them (see :func:`.wire.call_arguments`)."""
    from .wire import call_arguments

    return call_arguments(value)


@dataclass
class _Slot:
    index: int
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    final: str | dict[str, Any] | None = None
    done: bool = False
    released: bool = False
    scan: JsonDepth = field(default_factory=lambda: JsonDepth())

    def arguments(self) -> str | dict[str, Any]:
        """The final arguments if given, else the fragments joined (surrogate pairs cut between
        two fragments joined too)."""
        if self.final is not None:
            return self.final
        from .wire import join_surrogates

        return join_surrogates("".join(self.parts))

    def call(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.name, arguments=self.arguments(), index=self.index)


class CallAssembler:
    """The calls of one stream: started in model order, completed in any order, released in model
    order (a completed call waits for every earlier one, so planning stays exact)."""

    def __init__(self) -> None:
        self._slots: dict[Any, _Slot] = {}
        self._order: list[_Slot] = []
        self._next = 0

    def __contains__(self, key: Any) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        """The calls started so far."""
        return len(self._order)

    def get(self, key: Any) -> _Slot | None:
        return self._slots.get(key)

    def start(self, key: Any, call_id: str = "", name: str = "") -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = _Slot(index=len(self._order), id=call_id, name=name)
            self._slots[key] = slot
            self._order.append(slot)
        return slot

    def slots(self) -> list[_Slot]:
        return list(self._order)

    def complete(self, key: Any, final: str | dict[str, Any] | None = None) -> None:
        slot = self._slots.get(key)
        if slot is not None and not slot.done:
            if final is not None:
                slot.final = final
            slot.done = True

    def open_before(self, index: int) -> list[_Slot]:
        """Slots started before position ``index`` and not yet complete."""
        return [s for s in self._order[self._next:index] if not s.done]

    def release(self) -> list[ToolCall]:
        """The completed calls not yet released whose earlier calls are all released."""
        out = []
        while self._next < len(self._order) and self._order[self._next].done:
            slot = self._order[self._next]
            slot.released = True
            out.append(slot.call())
            self._next += 1
        return out

    def open_slots(self) -> list[_Slot]:
        """Slots not yet complete (those released are: a stream that ends a choice at every chunk
        does not look at every call so far each time)."""
        return [s for s in self._order[self._next:] if not s.done]


class StreamFormat:
    """Mixin for a stream format's adapter: ``parser()`` makes a :class:`StreamParser`;
    ``parse``/``assistant_messages`` also take the whole list of events (a recorded stream).
    Results go back in the same shape as the non-streamed format's."""

    streamed = True

    def parser(self) -> StreamParser:
        raise NotImplementedError

    def replay(self, payload: Any) -> StreamParser:
        """A parser that has read every event of ``payload`` (a list of events) to its end."""
        events = as_dict(payload)
        if not isinstance(events, list):
            raise BatchRejected("expected the stream's events as a list", reason="unreadable_payload", pointer="/")
        parser = self.parser()
        for event in events:
            parser.feed(event)
        parser.finish()
        return parser

    def parse(self, payload: Any) -> list[ToolCall]:
        events = as_dict(payload)
        if not isinstance(events, list):
            raise BatchRejected("expected the stream's events as a list", reason="unreadable_payload", pointer="/")
        parser = self.parser()
        calls = [call for event in events for call in parser.feed(event)]
        return calls + parser.finish()

    def whole(self, payload: Any) -> Any:
        """``payload`` as the non-streamed format's response: a list of events is replayed
        (``replay(...).response()``); anything else (a rebuilt response, None) as it is."""
        return self.replay(payload).response() if isinstance(as_dict(payload), list) else payload

    def assistant_messages(self, payload: Any) -> list[dict[str, Any]]:
        """From a rebuilt response (``parser.response()``) or the list of events itself."""
        return super().assistant_messages(self.whole(payload))  # type: ignore[misc]

    def format_results(self, results: Sequence[ToolResult], response: Any = None) -> list[dict[str, Any]]:
        """As the non-streamed format's, ``response`` a rebuilt response or the list of events itself."""
        return super().format_results(results, self.whole(response))  # type: ignore[misc]


def parses_as_object(text: str) -> bool:
    """True when ``text`` is a complete JSON object: no later fragment can make it valid JSON
    again, so a streamed call's arguments are complete (the rule the Vercel AI SDK uses for
    OpenAI-compatible streams). Text too deep or with too long a number for Python's reader is
    complete too when it ends with ``}`` and its brackets balance (validation then says why it
    cannot be read)."""
    if not text.rstrip().endswith("}"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except RecursionError:
        return _balanced(text)
    except ValueError as exc:
        return not isinstance(exc, json.JSONDecodeError) and _balanced(text)


class JsonDepth:
    """The bracket depth of JSON text fed in pieces (strings and escapes followed), so a stream need
    not join and read all its fragments again at each one to learn whether its arguments may be
    complete: :meth:`feed` is linear in the fragment."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped, self.opened, self.last = 0, False, False, False, ""
        # the text was balanced and closed with ``}`` yet no JSON object: an object ends where its
        # first bracket closes, so the rest can only be extra data (the reader's business)
        self.never_json = False

    def feed(self, text: str) -> bool:
        """Take the next fragment; True when the text so far may be a whole JSON object (brackets
        balanced outside strings, ending with ``}``): then :func:`parses_as_object` decides."""
        depth, in_string, escaped = self.depth, self.in_string, self.escaped
        for char in text:
            if in_string:
                escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
            elif char == '"':
                in_string = True
            elif char in "{[":
                depth += 1
                self.opened = True
            elif char in "}]":
                depth -= 1
        self.depth, self.in_string, self.escaped = depth, in_string, escaped
        stripped = text.rstrip()
        if stripped:
            self.last = stripped[-1]
        return self.opened and depth == 0 and not in_string and self.last == "}"


def _balanced(text: str) -> bool:
    """Brackets of ``text`` balanced outside strings (:class:`JsonDepth` fed it whole)."""
    scan = JsonDepth()
    scan.feed(text)
    return scan.depth == 0 and not scan.in_string
