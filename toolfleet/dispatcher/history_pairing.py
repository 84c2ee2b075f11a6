"""Pairing a history's results with its calls, for :mod:`.history`: one change reported
(:class:`Repair`), the results of a history by call id (:class:`Results`), and the repair of a
Responses history (:func:`responses`), whose call ids may repeat across turns and whose call items
are of several kinds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ..models import ErrorCode, ToolResult
from .adapters import get_adapter
from .adapters.client_tools import CLIENT_CALLS, history_roles, placeholder_answer
from .adapters.openai_responses import OUTPUT_OF

PLACEHOLDER_MESSAGE = ("this call has no result in the history: the run that made it was interrupted "
                       "or its result was lost")
PLACEHOLDER_HINT = "it may or may not have taken effect; check the state before repeating it"


@dataclass(frozen=True)
class Repair:
    """One change: ``kind`` (see :mod:`.history`'s docstring), the ``call_id`` concerned, ``position``
    (index in the input history of the message or item concerned) and a sentence."""

    kind: str
    call_id: str
    position: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.call_id} at {self.position}: {self.detail}"


def placeholder(call_id: str, name: str) -> ToolResult:
    """The ``ABORTED`` result standing in for a call's missing one."""
    return ToolResult.failure(call_id, name, ErrorCode.ABORTED, PLACEHOLDER_MESSAGE, PLACEHOLDER_HINT)


class Results:
    """The results of a history by call id, in history order: the first is kept, the rest are
    duplicates; ``take`` hands out the first result of an id once. Results of an id are handed
    out in order, so each id keeps where the next one is: a history whose calls all share one id
    (servers that send none, or reuse ``call_0``) is not searched from its start at every call."""

    def __init__(self) -> None:
        self.by_id: dict[Hashable, list[tuple[int, Any]]] = defaultdict(list)
        self.taken: set[int] = set()
        self._next: dict[Hashable, int] = {}  # call id -> how many of its results were handed out
        self._before: dict[Hashable, int] = {}  # call id -> where take_before looks next
        self._label: dict[Hashable, str] = {}  # a key that is not the call id itself -> the call id

    def add(self, call_id: Hashable, position: int, result: Any, label: str | None = None) -> None:
        """``call_id``: the call id, or a key holding it (``label``: the call id, for the repairs)."""
        self.by_id[call_id].append((position, result))
        if label is not None:
            self._label[call_id] = label

    def take(self, call_id: Hashable) -> tuple[int, Any] | None:
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

    def take_before(self, call_id: Hashable, position: int) -> tuple[int, Any] | None:
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

    def leftovers(self, calls: set[Hashable], repairs: list[Repair]) -> None:
        for key, found in self.by_id.items():
            call_id = self._label.get(key, key)
            for position, result in found:
                if id(result) in self.taken:
                    continue
                if key in calls:
                    repairs.append(Repair("duplicate_result", str(call_id), position,
                                          "the call has another result, which is kept; this one was dropped"))
                else:
                    repairs.append(Repair("orphan_result", str(call_id), position,
                                          "a result for a call that is not in the history (no call of its "
                                          "id and kind) was dropped"))


def responses(items: list[Any], repairs: list[Repair]) -> list[Any]:
    """Responses: each call gets the latest result of its id and kind after it that no later call
    of that id took (ids repeat across turns), else the first one before it, else a placeholder.
    Results are keyed by (kind, call id): ``function_call`` and ``custom_tool_call`` are one kind
    (an answer of the other type is re-typed); each built-in tool the client runs is its own."""
    results = Results()
    calls: list[tuple[tuple[str, str], int]] = []  # every call item's key, in history order
    kinds, answers = tuple(OUTPUT_OF), tuple(OUTPUT_OF.values())  # compared, not hashed: a type may be any JSON value
    roles = history_roles(items)  # built-in tool items the client executes, and their answers (.adapters.client_tools)
    unanswered: dict[tuple[str, str], list[int]] = defaultdict(list)  # key -> positions of its calls not answered yet
    answer_of: dict[int, tuple[int, Any]] = {}  # position of a call -> its result after it (position, item)
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") in answers or roles.get(position, ("",))[0] == "result":
            key = (str(item["type"]), roles[position][1]) if position in roles else \
                (_FUNCTION, str(item.get("call_id") or ""))
            results.add(key, position, item, label=key[1])
            waiting = unanswered.get(key)
            if waiting and id(item) not in results.taken:  # the latest call of its id before it (ids repeat)
                answer_of[waiting.pop()] = (position, item)
                results.taken.add(id(item))
        elif item.get("type") in kinds or position in roles:
            key = (CLIENT_CALLS[item["type"]], str(item.get("call_id") or "")) if position in roles else \
                (_FUNCTION, str(item.get("call_id") or ""))
            calls.append((key, position))
            unanswered[key].append(position)
    placed: dict[int, Any] = {}  # position of a call -> the result to put right after it
    in_place: set[int] = set()
    for key, at_call in calls:
        call_id = key[1]
        found = answer_of.get(at_call) or results.take_before(key, at_call)  # else one before it, if any
        if found is None:
            name = str(items[at_call].get("name") or "")
            if at_call in roles:
                placed[at_call] = placeholder_answer(items[at_call]["type"], placeholder(call_id, name))
            else:
                placed[at_call] = {**get_adapter("openai_responses").format_results([placeholder(call_id, name)])[0],
                                   "type": OUTPUT_OF[items[at_call]["type"]]}
            repairs.append(Repair("missing_result", call_id, at_call,
                                  "the call had no result; an ABORTED placeholder was added after it"))
            continue
        result = found[1]
        wanted = OUTPUT_OF.get(items[at_call]["type"]) if at_call not in roles else None
        if wanted is not None and result.get("type") != wanted:
            repairs.append(Repair("retyped_result", call_id, found[0],
                                  f"its result was a {result.get('type')} item; a {items[at_call]['type']} is "
                                  f"answered by a {wanted}, so it was written as one"))
            # the fields of the type it becomes (a custom_tool_call_output has no status; an item id
            # is of its own type's)
            result = {k: v for k, v in result.items() if k in _OUTPUT_FIELDS[wanted]} | {"type": wanted}
            placed[at_call] = result
        elif found[0] < at_call:
            placed[at_call] = result
        else:
            in_place.add(found[0])
        if found[0] < at_call:
            repairs.append(Repair("moved_result", call_id, found[0],
                                  f"its result came before its call; moved right after the call (at {at_call})"))
    out: list[Any] = []
    for position, item in enumerate(items):
        if isinstance(item, dict) and (item.get("type") in answers or roles.get(position, ("",))[0] == "result") \
                and position not in in_place:
            continue
        out.append(item)
        if position in placed:
            out.append(placed[position])
    results.leftovers({key for key, _ in calls}, repairs)
    return out


_FUNCTION = "function"  # the kind of function_call and custom_tool_call items and their outputs
_OUTPUT_FIELDS = {"function_call_output": ("call_id", "output", "status"),
                  "custom_tool_call_output": ("call_id", "output")}  # as input items (openai-python's types)
