"""Pairing a history's results with its calls, for :mod:`.history`: one change reported
(:class:`Repair`), the results of a history by call id (:class:`Results`), which result answers
which call when call ids repeat across turns (:class:`Pairing`, all three formats), and the repair
of a Responses history (:func:`responses`), whose call items are of several kinds."""

from __future__ import annotations

from collections import defaultdict, deque
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


class Pairing:
    """Which result answers which call, when call ids repeat across turns (servers and gateways that
    number calls per response, ``call_0`` in every turn): a result answers a call of its key in the
    latest turn before it that has one, the first there that no result answered yet (``last_first``:
    the last); when all of them are answered, it answers none (it is a duplicate: a result never
    passes a call of its key to reach an earlier turn's). A call left without one takes the first
    result of its key before it that nothing took (to be moved after it), else none (a placeholder).
    A turn: the calls of one message (Chat, Anthropic: results in call order), a run of call items
    (Responses, ``last_first``: a placeholder goes right after its call, so the calls before it
    and their results make a run of their own when repaired again). Feed each message's results,
    then its calls, in history order (``result``, ``call``); then ask ``answer`` for each call, in order."""

    def __init__(self, last_first: bool = False) -> None:
        self.last_first = last_first
        self.results = Results()
        self.calls: list[tuple[Hashable, int]] = []  # (key, position) of every call, in history order
        # key -> (the latest turn with a call of it, the numbers of its calls there no result answered yet)
        self._latest: dict[Hashable, tuple[int, deque[int]]] = {}
        self._answer_of: dict[int, tuple[int, Any]] = {}  # call number -> its result after it (position, result)

    def call(self, key: Hashable, position: int, turn: int | None = None) -> int:
        """A call of ``key`` in the message or item at ``position``, of ``turn`` (by default: the
        message at ``position``); returns the call's number."""
        number = len(self.calls)
        self.calls.append((key, position))
        turn = position if turn is None else turn
        latest = self._latest.get(key)
        if latest is not None and latest[0] == turn:
            latest[1].append(number)
        else:
            self._latest[key] = (turn, deque([number]))
        return number

    def result(self, key: Hashable, position: int, result: Any, label: str | None = None) -> None:
        """A result of ``key`` (``label``: its call id, when the key is not) at ``position``."""
        self.results.add(key, position, result, label)
        latest = self._latest.get(key)
        if latest is not None and latest[1] and id(result) not in self.results.taken:
            self._answer_of[latest[1].pop() if self.last_first else latest[1].popleft()] = (position, result)
            self.results.taken.add(id(result))

    def answer(self, number: int) -> tuple[int, Any] | None:
        """The result of call ``number`` (position, result): the one after it, else one before it."""
        key, position = self.calls[number]
        return self._answer_of.get(number) or self.results.take_before(key, position)

    def keep_orphans(self) -> set[int]:
        """Hand out every result whose key no call has; the positions of those results."""
        calls = {key for key, _ in self.calls}
        kept = set()
        for key, found in self.results.by_id.items():
            if key not in calls:
                for position, result in found:
                    self.results.taken.add(id(result))
                    kept.add(position)
        return kept

    def leftovers(self, repairs: list[Repair]) -> None:
        """Report each result not handed out: ``duplicate_result``, or ``orphan_result`` (no call of its key)."""
        self.results.leftovers({key for key, _ in self.calls}, repairs)


def responses(items: list[Any], repairs: list[Repair]) -> list[Any]:
    """Responses: results pair with calls as :class:`Pairing` says, keyed by (kind, call id):
    ``function_call`` and ``custom_tool_call`` are one kind (an answer of the other type is
    re-typed); each built-in tool the client runs is its own. An input whose calls are on the
    server (it holds no call item, or an ``item_reference``: a request with ``previous_response_id``)
    keeps each result whose call is not in it where it is."""
    pairing = Pairing(last_first=True)
    kinds, answers = tuple(OUTPUT_OF), tuple(OUTPUT_OF.values())  # compared, not hashed: a type may be any JSON value
    roles = history_roles(items)  # built-in tool items the client executes, and their answers (.adapters.client_tools)
    referenced, turn = False, 0  # turn: a run of call items ends at a result or an input message
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        referenced = referenced or item.get("type") == "item_reference"
        if item.get("type") in answers or roles.get(position, ("",))[0] == "result":
            key = (str(item["type"]), roles[position][1]) if position in roles else \
                (_FUNCTION, str(item.get("call_id") or ""))
            pairing.result(key, position, item, label=key[1])
            turn += 1
        elif item.get("type") in kinds or position in roles:
            pairing.call((CLIENT_CALLS[item["type"]], str(item.get("call_id") or "")) if position in roles else
                         (_FUNCTION, str(item.get("call_id") or "")), position, turn)
        elif item.get("role") in ("user", "system", "developer"):
            turn += 1
    placed: dict[int, Any] = {}  # position of a call -> the result to put right after it
    in_place = pairing.keep_orphans() if referenced or not pairing.calls else set()  # their calls: on the server
    for number, (key, at_call) in enumerate(pairing.calls):
        call_id = key[1]
        found = pairing.answer(number)
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
    pairing.leftovers(repairs)
    return out


_FUNCTION = "function"  # the kind of function_call and custom_tool_call items and their outputs
_OUTPUT_FIELDS = {"function_call_output": ("call_id", "output", "status"),
                  "custom_tool_call_output": ("call_id", "output")}  # as input items (openai-python's types)
