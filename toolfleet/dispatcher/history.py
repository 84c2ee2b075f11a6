"""History check and repair before a request is sent (docs/design.md, error code ``ABORTED``).

Providers refuse a request whose history has a tool call without its result, or a result without
its call (OpenAI: "An assistant message with 'tool_calls' must be followed by tool messages
responding to each 'tool_call_id'"; Anthropic: "tool_use ids were found without tool_result blocks
immediately after"). A run that was interrupted, or a history edited by hand, leaves exactly that.
:func:`repair_history` mends it, in all three formats, and reports every change:

- ``missing_result``: a call without a result gets an ``ABORTED`` placeholder result, placed right
  after its call (Chat: among the tool messages after the assistant message; Responses: the item
  after the ``function_call``, or after a built-in tool item the client executes, in that item's
  answer shape, :mod:`.adapters.client_tools`; Anthropic: in the ``user`` message after the assistant message,
  which is inserted when there is none);
- ``duplicate_result``: a second result for one call id is dropped (the first is kept);
- ``orphan_result``: a result whose call id no call has is dropped;
- ``moved_result``: a result not where the provider wants it (Chat: not in the tool messages right
  after its assistant message; Anthropic: not in the user message right after; Responses: before
  its call) is moved there;
- ``empty_text_removed`` (Anthropic): a text block with no text but white space is dropped (the API
  refuses one: "text content blocks must be non-empty");
- ``arguments_normalized`` (Chat, Responses): a call's ``arguments`` that are not a JSON string
  (``null``, an object) are written as one (``null`` as ``"{}"``), as the APIs require;
- ``empty_message_removed``: a message left with no content by the above is removed.

The input is never changed; messages may be plain dicts or SDK objects. A history whose shape cannot
be read (a message that is not an object, ``tool_calls`` that are not a list of objects, an id that
is not a string) raises :class:`~toolfleet.errors.BatchRejected` with the JSON pointer of the field.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BatchRejected
from ..models import ErrorCode, ToolResult
from .adapters import as_dict, get_adapter
from .adapters.anthropic import result_block
from .adapters.client_tools import CLIENT_CALLS, history_roles, placeholder_answer
from .adapters.openai_responses import OUTPUT_OF
from .adapters.wire import arguments_for_wire, need_list, need_object, need_text

PLACEHOLDER_MESSAGE = ("this call has no result in the history: the run that made it was interrupted "
                       "or its result was lost")
PLACEHOLDER_HINT = "it may or may not have taken effect; check the state before repeating it"


@dataclass(frozen=True)
class Repair:
    """One change: ``kind`` (see the module docstring), the ``call_id`` concerned, ``position``
    (index in the input history of the message or item concerned) and a sentence."""

    kind: str
    call_id: str
    position: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.call_id} at {self.position}: {self.detail}"


@dataclass(frozen=True)
class RepairedHistory:
    """The history to send (``messages``), in ``format``, and what was changed (``repairs``)."""

    format: str
    messages: list[dict[str, Any]]
    repairs: list[Repair]

    @property
    def ok(self) -> bool:
        """True when the history needed no repair."""
        return not self.repairs


def repair_history(history: Sequence[Any], format: str | None = None) -> RepairedHistory:
    """Check ``history`` (the messages or input items of the next request) and mend it.

    ``format`` is ``openai_chat``, ``openai_responses`` or ``anthropic`` (stream names and short
    names work too), or None to tell it from the history. Raises
    :class:`~toolfleet.errors.BatchRejected` for an unknown format or a history that is not a list.
    """
    try:
        items = as_dict(list(history)) if not isinstance(history, (str, bytes, dict)) else None
    except TypeError:
        items = None
    if items is None or (format is not None and not isinstance(format, str)):
        raise BatchRejected("a history is a list of messages or items", reason="unreadable_payload", pointer="/")
    try:
        items = [copy.deepcopy(i) for i in items]
    except RecursionError:
        raise BatchRejected("the history nests too deep to be read", reason="unreadable_payload",
                            pointer="/") from None
    name = get_adapter(format).name.removesuffix("_stream") if format else detect_history_format(items)
    _check_shape(items, name)
    repairs: list[Repair] = []
    if name == "anthropic":
        return RepairedHistory(format=name, messages=_anthropic_text(items, repairs), repairs=repairs)
    items = _normalize_arguments(items, name, repairs)
    fix = {"openai_chat": _chat, "openai_responses": _responses}[name]
    return RepairedHistory(format=name, messages=fix(items, repairs), repairs=repairs)


def _check_shape(items: list[Any], name: str) -> None:
    """Raise BatchRejected (with the pointer) where the history cannot be read in format ``name``."""
    for n, item in enumerate(items):
        here = f"/{n}"
        item = need_object(item, here, "a message or item")
        if name == "openai_chat":
            calls = need_list(item.get("tool_calls"), f"{here}/tool_calls", "tool_calls")
            for k, call in enumerate(calls):
                call = need_object(call, f"{here}/tool_calls/{k}", "a tool call")
                need_text(call.get("id"), f"{here}/tool_calls/{k}/id", "a call id")
                need_object(call.get("function"), f"{here}/tool_calls/{k}/function", "function", optional=True)
            if item.get("role") == "tool":
                need_text(item.get("tool_call_id"), f"{here}/tool_call_id", "tool_call_id")
        elif name == "openai_responses":
            if item.get("type") in (*OUTPUT_OF, *OUTPUT_OF.values(), *CLIENT_CALLS, *CLIENT_CALLS.values()):
                need_text(item.get("call_id"), f"{here}/call_id", "a call_id")
        else:
            content = item.get("content")
            if not isinstance(content, str):
                for k, block in enumerate(need_list(content, f"{here}/content", "content")):
                    block = need_object(block, f"{here}/content/{k}", "a content block")
                    if block.get("type") == "tool_use":
                        need_text(block.get("id"), f"{here}/content/{k}/id", "a tool_use id")
                    elif block.get("type") == "tool_result":
                        need_text(block.get("tool_use_id"), f"{here}/content/{k}/tool_use_id", "a tool_use_id")


def _normalize_arguments(items: list[Any], name: str, repairs: list[Repair]) -> list[Any]:
    out = []
    for position, item in enumerate(items):
        if name == "openai_chat" and item.get("tool_calls"):
            calls = []
            for call in item["tool_calls"]:
                function = call.get("function") or {}
                if not isinstance(function.get("arguments"), str):
                    repairs.append(Repair("arguments_normalized", str(call.get("id")), position,
                                          "its arguments were not a JSON string; written as one"))
                    written = arguments_for_wire(function.get("arguments"))
                    call = {**call, "function": {**function, "arguments": written}}
                calls.append(call)
            item = {**item, "tool_calls": calls}
        elif name == "openai_responses" and item.get("type") == "function_call" and not isinstance(
                item.get("arguments"), str):
            repairs.append(Repair("arguments_normalized", str(item.get("call_id")), position,
                                  "its arguments were not a JSON string; written as one"))
            item = {**item, "arguments": arguments_for_wire(item.get("arguments"))}
        out.append(item)
    return out


def _anthropic_text(items: list[Any], repairs: list[Repair]) -> list[Any]:
    """Anthropic: drop text blocks without text (``empty_text_removed``), mend calls and results,
    then drop a message left with no content (``empty_message_removed``)."""
    stripped, positions = [], {}
    for position, message in enumerate(items):
        content = message.get("content")
        if isinstance(content, list):
            kept = [b for b in content if not _empty_text(b)]
            if len(kept) != len(content):
                repairs.append(Repair("empty_text_removed", "", position,
                                      "a text block without text was dropped (the API refuses one)"))
                message = {**message, "content": kept}
        positions[id(message)] = position
        stripped.append(message)
    out = []
    for message in _anthropic(stripped, repairs):
        if isinstance(message.get("content"), list) and not message["content"]:
            repairs.append(Repair("empty_message_removed", "", positions.get(id(message), -1),
                                  "a message left with no content was removed"))
            continue
        out.append(message)
    return out


def _empty_text(block: dict[str, Any]) -> bool:
    return block.get("type") == "text" and not (isinstance(block.get("text"), str) and block["text"].strip())


def detect_history_format(items: Sequence[Any]) -> str:
    """``openai_responses``, ``anthropic`` or ``openai_chat`` (also for a history without calls)."""
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") in (*OUTPUT_OF, *OUTPUT_OF.values(), *CLIENT_CALLS, *CLIENT_CALLS.values(), "reasoning"):
            return "openai_responses"
        if item.get("role") == "tool" or item.get("tool_calls"):
            return "openai_chat"
        content = item.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
        ):
            return "anthropic"
    return "openai_chat"


def _placeholder(call_id: str, name: str) -> ToolResult:
    return ToolResult.failure(call_id, name, ErrorCode.ABORTED, PLACEHOLDER_MESSAGE, PLACEHOLDER_HINT)


class _Results:
    """The results of a history by call id, in history order: the first is kept, the rest are
    duplicates; ``take`` hands out the first result of an id once. Results of an id are handed
    out in order, so each id keeps where the next one is: a history whose calls all share one id
    (servers that send none, or reuse ``call_0``) is not searched from its start at every call."""

    def __init__(self) -> None:
        self.by_id: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        self.taken: set[int] = set()
        self._next: dict[str, int] = {}  # call id -> how many of its results were handed out
        self._before: dict[str, int] = {}  # call id -> where take_before looks next

    def add(self, call_id: str, position: int, result: Any) -> None:
        self.by_id[call_id].append((position, result))

    def take(self, call_id: str) -> tuple[int, Any] | None:
        found = self.by_id.get(call_id, ())
        n = self._next.get(call_id, 0)
        while n < len(found):
            position, result = found[n]
            n += 1
            if id(result) not in self.taken:  # one object listed twice is handed out once
                self._next[call_id] = n
                self.taken.add(id(result))
                return position, result
        self._next[call_id] = n
        return None

    def take_before(self, call_id: str, position: int) -> tuple[int, Any] | None:
        """The first result of ``call_id`` not handed out yet, if it stands before ``position``.
        Asked with growing positions (calls in history order): a cursor per id keeps it linear."""
        found = self.by_id.get(call_id, ())
        n = self._before.get(call_id, 0)
        while n < len(found) and id(found[n][1]) in self.taken:
            n += 1
        self._before[call_id] = n
        if n == len(found) or found[n][0] >= position:
            return None
        self.taken.add(id(found[n][1]))
        self._before[call_id] = n + 1
        return found[n]

    def leftovers(self, calls: set[str], repairs: list[Repair]) -> None:
        for call_id, found in self.by_id.items():
            for position, result in found:
                if id(result) in self.taken:
                    continue
                if call_id in calls:
                    repairs.append(Repair("duplicate_result", call_id, position,
                                          "a second result for this call was dropped; the first is kept"))
                else:
                    repairs.append(Repair("orphan_result", call_id, position,
                                          "a result for a call that is not in the history was dropped"))


def _chat(items: list[Any], repairs: list[Repair]) -> list[Any]:
    results = _Results()
    calls: set[str] = set()
    for position, message in enumerate(items):
        if isinstance(message, dict) and message.get("role") == "tool":
            results.add(str(message.get("tool_call_id") or ""), position, message)
        elif isinstance(message, dict):
            calls.update(str(as_dict(c).get("id") or "") for c in message.get("tool_calls") or [])
    out: list[Any] = []
    tool_message = get_adapter("openai_chat").format_results
    for position, message in enumerate(items):
        if isinstance(message, dict) and message.get("role") == "tool":
            continue  # every result is placed after its call below
        out.append(message)
        tool_calls = [as_dict(c) for c in (message.get("tool_calls") or [])] if isinstance(message, dict) else []
        block_end = position + 1
        while block_end < len(items) and isinstance(items[block_end], dict) and items[block_end].get("role") == "tool":
            block_end += 1
        for call in tool_calls:
            call_id = str(call.get("id") or "")
            found = results.take(call_id)
            if found is None:
                name = str((call.get("function") or {}).get("name") or "")
                out.extend(tool_message([_placeholder(call_id, name)]))
                repairs.append(Repair("missing_result", call_id, position,
                                      "the call had no result; an ABORTED placeholder was added after it"))
                continue
            at, result = found
            if not position < at < block_end:
                repairs.append(Repair("moved_result", call_id, at,
                                      f"its result was moved right after its assistant message (at {position})"))
            out.append(result)
    results.leftovers(calls, repairs)
    return out


def _responses(items: list[Any], repairs: list[Repair]) -> list[Any]:
    results = _Results()
    calls: list[tuple[str, int]] = []  # every call item, in history order (an id may repeat across turns)
    kinds, answers = tuple(OUTPUT_OF), tuple(OUTPUT_OF.values())  # compared, not hashed: a type may be any JSON value
    roles = history_roles(items)  # built-in tool items the client executes, and their answers (.adapters.client_tools)
    unanswered: dict[str, list[int]] = defaultdict(list)  # call id -> positions of its calls without a result yet
    answer_of: dict[int, tuple[int, Any]] = {}  # position of a call -> its result after it (position, item)
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") in answers or roles.get(position, ("",))[0] == "result":
            call_id = roles[position][1] if position in roles else str(item.get("call_id") or "")
            results.add(call_id, position, item)
            waiting = unanswered.get(call_id)
            if waiting and id(item) not in results.taken:  # the latest call of its id before it (ids repeat)
                answer_of[waiting.pop()] = (position, item)
                results.taken.add(id(item))
        elif item.get("type") in kinds or position in roles:
            call_id = str(item.get("call_id") or "")
            calls.append((call_id, position))
            unanswered[call_id].append(position)
    placed: dict[int, Any] = {}  # position of a call -> the result to put right after it
    in_place: set[int] = set()
    for call_id, at_call in calls:
        found = answer_of.get(at_call) or results.take_before(call_id, at_call)  # else one before it, if any
        if found is None:
            name = str(items[at_call].get("name") or "")
            if at_call in roles:
                placed[at_call] = placeholder_answer(items[at_call]["type"], _placeholder(call_id, name))
            else:
                placed[at_call] = {**get_adapter("openai_responses").format_results([_placeholder(call_id, name)])[0],
                                   "type": OUTPUT_OF[items[at_call]["type"]]}
            repairs.append(Repair("missing_result", call_id, at_call,
                                  "the call had no result; an ABORTED placeholder was added after it"))
        elif found[0] < at_call:
            placed[at_call] = found[1]
            repairs.append(Repair("moved_result", call_id, found[0],
                                  f"its result came before its call; moved right after the call (at {at_call})"))
        else:
            in_place.add(found[0])
    out: list[Any] = []
    for position, item in enumerate(items):
        if isinstance(item, dict) and (item.get("type") in answers or roles.get(position, ("",))[0] == "result") \
                and position not in in_place:
            continue
        out.append(item)
        if position in placed:
            out.append(placed[position])
    results.leftovers({call_id for call_id, _ in calls}, repairs)
    return out


def _anthropic(items: list[Any], repairs: list[Repair]) -> list[Any]:
    results = _Results()
    calls: set[str] = set()
    for position, message in enumerate(items):
        for block in _blocks(message):
            if block.get("type") == "tool_result":
                results.add(str(block.get("tool_use_id") or ""), position, block)
            elif block.get("type") == "tool_use":
                calls.add(str(block.get("id") or ""))
    out: list[Any] = []
    position = 0
    while position < len(items):
        message = items[position]
        uses = [b for b in _blocks(message) if b.get("type") == "tool_use"] if _role(message) == "assistant" else []
        if not uses:
            kept = _without_results(message, position, repairs)
            if kept is not None:
                out.append(kept)
            position += 1
            continue
        out.append(message)
        following = items[position + 1] if position + 1 < len(items) else None
        answered = following if _role(following) == "user" else None
        blocks = []
        for use in uses:
            call_id = str(use.get("id") or "")
            found = results.take(call_id)
            if found is None:
                blocks.append(result_block(_placeholder(call_id, str(use.get("name") or ""))))
                repairs.append(Repair("missing_result", call_id, position,
                                      "the tool_use had no tool_result; an ABORTED placeholder was added after it"))
                continue
            if answered is None or found[0] != position + 1:
                repairs.append(Repair("moved_result", call_id, found[0],
                                      f"its tool_result was moved into the user message after its tool_use "
                                      f"(at {position})"))
            blocks.append(found[1])
        if answered is None:
            out.append({"role": "user", "content": blocks})
            position += 1
            continue
        rest = [b for b in _blocks(answered) if b.get("type") != "tool_result"]
        text = answered.get("content") if isinstance(answered.get("content"), str) else None
        if text:
            rest = [{"type": "text", "text": text}]
        out.append({**answered, "content": blocks + rest})
        position += 2
    results.leftovers(calls, repairs)
    return out


def _without_results(message: Any, position: int, repairs: list[Repair]) -> Any:
    """``message`` without tool_result blocks (they are placed after their calls); None when
    nothing else is left in it."""
    blocks = _blocks(message)
    if not any(b.get("type") == "tool_result" for b in blocks):
        return message
    rest = [b for b in blocks if b.get("type") != "tool_result"]
    if not rest:
        repairs.append(Repair("empty_message_removed", "", position,
                              "a user message that held only misplaced tool_result blocks was removed"))
        return None
    return {**message, "content": rest}


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None
