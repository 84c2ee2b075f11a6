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
- ``duplicate_result``: a further result for one call is dropped (the one kept: Responses, the one
  right after the call, else the first; Chat and Anthropic, the first);
- ``orphan_result``: a result whose call id no call has is dropped (Responses: not in an input whose
  calls are on the server, see :func:`repair_history`);
- ``moved_result``: a result not where the provider wants it (Chat: not in the tool messages right
  after its assistant message; Anthropic: not in the user message right after; Responses: before
  its call) is moved there;
- ``reordered_results`` (Chat, Anthropic): results right after an assistant message that a repair
  among them rewrites are put in the order of its calls (all in place and complete, they keep their
  order: the APIs take any); Anthropic: put first in the user message, which the API requires
  ("tool_result blocks must come first");
- ``retyped_result`` (Responses): a ``function_call`` answered by a ``custom_tool_call_output``, or
  the other way round, gets its answer as the type its call needs (the API pairs a call with an
  output of its own kind only); a built-in tool's answer pairs only with a call of its kind;
- ``empty_text_removed`` (Anthropic): a text block with no text but white space is dropped (the API
  refuses one: "text content blocks must be non-empty");
- ``arguments_normalized`` (Chat, Responses): a call's ``arguments`` that are not a JSON string
  (``null``, an object) or are empty text or the text ``null`` are written as one (those as
  ``"{}"``, how the call ran), as the APIs require;
- ``empty_tool_calls_removed`` (Chat): an empty ``tool_calls`` list is dropped (OpenAI refuses one:
  "Invalid 'messages[1].tool_calls': empty array");
- ``empty_message_removed``: a message left with no content by the above is removed.

Call ids may repeat across turns (servers and gateways that number calls per response, ``call_0``
in every turn): a result answers a call of its id in the latest turn before it that has one, never
an earlier turn's, so each turn's results stay with its own calls (:class:`~.history_pairing.Pairing`). A Chat call of
``type: "custom"`` (``custom: {"name", "input"}``) is left as it is (it has no ``arguments``).

The input is never changed; messages may be plain dicts or SDK objects, or dicts holding SDK
objects (the tool calls or content blocks of a response). A history whose shape cannot
be read (a message that is not an object, ``tool_calls`` that are not a list of objects, an id that
is not a string) raises :class:`~toolfleet.errors.BatchRejected` with the JSON pointer of the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BatchRejected
from ..models import means_no_arguments
from .adapters import as_dict, get_adapter
from .adapters.anthropic import result_block
from .adapters.client_tools import CLIENT_CALLS
from .adapters.openai_responses import OUTPUT_OF
from .adapters.wire import arguments_for_wire, need_list, need_object, need_text
from .history_pairing import Pairing, Repair, placeholder, responses


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

    Responses: the input of a request with ``previous_response_id`` holds the outputs of calls
    that live on the server, not in the input. So when the input holds no call item at all
    (``function_call``, ``custom_tool_call``, a built-in tool call the client runs), or holds an
    ``item_reference`` item, an output whose call is not in it is kept where it is, unreported;
    in an input that holds its calls, such an output is an ``orphan_result`` and dropped.
    ``repaired.ok`` means ``repaired.messages == history`` (as dicts): every change is reported.
    """
    try:
        items = as_dict(list(history)) if not isinstance(history, (str, bytes, dict)) else None
    except TypeError:
        items = None
    if items is None or (format is not None and not isinstance(format, str)):
        raise BatchRejected("a history is a list of messages or items", reason="unreadable_payload", pointer="/")
    try:
        items = [_plain(i) for i in items]
    except RecursionError:
        raise BatchRejected("the history nests too deep to be read", reason="unreadable_payload",
                            pointer="/") from None
    name = get_adapter(format).name.removesuffix("_stream") if format else detect_history_format(items)
    _check_shape(items, name)
    repairs: list[Repair] = []
    if name == "anthropic":
        return RepairedHistory(format=name, messages=_anthropic_text(items, repairs), repairs=repairs)
    items = _normalize_arguments(items, name, repairs)
    fix = {"openai_chat": _chat, "openai_responses": responses}[name]
    return RepairedHistory(format=name, messages=fix(items, repairs), repairs=repairs)


def _plain(value: Any) -> Any:
    """``value`` as new dicts and lists (the input is never changed), SDK objects in it dumped
    (a message dict holding the SDK's tool calls or content blocks)."""
    if hasattr(value, "model_dump"):
        return as_dict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


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
                if call.get("type") != "custom" and not _json_text(function.get("arguments")):
                    repairs.append(Repair("arguments_normalized", str(call.get("id")), position,
                                          _normalized_why(function.get("arguments"))))
                    written = arguments_for_wire(function.get("arguments"))
                    call = {**call, "function": {**function, "arguments": written}}
                calls.append(call)  # a custom call (``custom: {name, input}``) has no arguments: as it is
            item = {**item, "tool_calls": calls}
        elif name == "openai_responses" and item.get("type") == "function_call" and not _json_text(
                item.get("arguments")):
            repairs.append(Repair("arguments_normalized", str(item.get("call_id")), position,
                                  _normalized_why(item.get("arguments"))))
            item = {**item, "arguments": arguments_for_wire(item.get("arguments"))}
        out.append(item)
    return out


def _json_text(arguments: Any) -> bool:
    """Whether a call's ``arguments`` go back as they are: text, neither empty nor ``null`` (those
    ran as ``{}`` and are written so: :func:`.adapters.wire.arguments_for_wire`)."""
    return isinstance(arguments, str) and not means_no_arguments(arguments)


def _normalized_why(arguments: Any) -> str:
    if isinstance(arguments, str):
        return 'its arguments were empty text or null (run as {}); written as "{}"'
    return "its arguments were not a JSON string; written as one"


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


def _chat(items: list[Any], repairs: list[Repair]) -> list[Any]:
    """Chat: each call's result among the tool messages right after its assistant message, in call
    order; an empty ``tool_calls`` list dropped (``empty_tool_calls_removed``), and the message
    with it when nothing else is left in it (``empty_message_removed``)."""
    pairing = Pairing()
    for position, message in enumerate(items):
        if message.get("role") == "tool":
            pairing.result(str(message.get("tool_call_id") or ""), position, message)
            continue
        for call in message.get("tool_calls") or []:
            pairing.call(str(call.get("id") or ""), position)
    out: list[Any] = []
    tool_message = get_adapter("openai_chat").format_results
    number = 0  # the number of the next call (Pairing.call's)
    for position, message in enumerate(items):
        if message.get("role") == "tool":
            continue  # every result is placed after its call below
        if message.get("tool_calls") == []:
            message = _without_tool_calls(message, position, repairs)
            if message is None:
                continue
        out.append(message)
        block_end = position + 1
        while block_end < len(items) and items[block_end].get("role") == "tool":
            block_end += 1
        in_place = []  # positions of the results already in the tool messages after the message
        answers: list[tuple[int, Any]] = []  # (where it was, the tool message) for each call, in call order
        for call in message.get("tool_calls") or []:
            call_id = str(call.get("id") or "")
            found = pairing.answer(number)
            number += 1
            if found is None:
                name = (call.get("custom") if call.get("type") == "custom" else call.get("function")) or {}
                answers += [(-1, m) for m in tool_message([placeholder(call_id, str(name.get("name") or ""))])]
                repairs.append(Repair("missing_result", call_id, position,
                                      "the call had no result; an ABORTED placeholder was added after it"))
                continue
            at, result = found
            if position < at < block_end:
                in_place.append(at)
            else:
                repairs.append(Repair("moved_result", call_id, at,
                                      f"its result was moved right after its assistant message (at {position})"))
            answers.append((at, result))
        if len(in_place) == len(answers):  # all there already: kept in their order (the API takes any)
            answers.sort(key=lambda a: a[0])
        elif in_place != sorted(in_place):
            repairs.append(Repair("reordered_results", "", position + 1,
                                  f"the tool messages after the assistant message at {position} were put in "
                                  f"the order of its calls"))
        out.extend(m for _, m in answers)
    pairing.leftovers(repairs)
    return out


def _without_tool_calls(message: dict[str, Any], position: int, repairs: list[Repair]) -> dict[str, Any] | None:
    """A Chat message without its empty ``tool_calls`` list (the API refuses one: "empty array");
    None when it then holds nothing (no content, refusal or audio)."""
    repairs.append(Repair("empty_tool_calls_removed", "", position,
                          "an empty tool_calls list was dropped (the API refuses one)"))
    message = {k: v for k, v in message.items() if k != "tool_calls"}
    if message.get("role") == "assistant" and message.get("content") is None and not any(
            message.get(k) for k in ("refusal", "audio", "function_call")):
        repairs.append(Repair("empty_message_removed", "", position,
                              "an assistant message left with no content was removed"))
        return None
    return message


def _anthropic(items: list[Any], repairs: list[Repair]) -> list[Any]:
    """Anthropic: each tool_use's tool_result in the user message right after its assistant
    message, first in it and in call order (``reordered_results`` when they were not)."""
    pairing = Pairing()
    for position, message in enumerate(items):
        for block in _blocks(message):
            if block.get("type") == "tool_result":
                pairing.result(str(block.get("tool_use_id") or ""), position, block)
        for block in _uses(message):
            pairing.call(str(block.get("id") or ""), position)
    out: list[Any] = []
    position, number = 0, 0  # number: the number of the next call (Pairing.call's)
    while position < len(items):
        message = items[position]
        uses = _uses(message)
        if not uses:
            kept = _without_results(message, position, repairs)
            if kept is not None:
                out.append(kept)
            position += 1
            continue
        out.append(_without_results(message, position, repairs))  # (never None: it holds its tool_use blocks)
        following = items[position + 1] if position + 1 < len(items) else None
        answered = following if _role(following) == "user" else None
        blocks, in_place = [], []
        for use in uses:
            call_id = str(use.get("id") or "")
            found = pairing.answer(number)
            number += 1
            if found is None:
                blocks.append(result_block(placeholder(call_id, str(use.get("name") or ""))))
                repairs.append(Repair("missing_result", call_id, position,
                                      "the tool_use had no tool_result; an ABORTED placeholder was added after it"))
                continue
            if answered is None or found[0] != position + 1:
                repairs.append(Repair("moved_result", call_id, found[0],
                                      f"its tool_result was moved into the user message after its tool_use "
                                      f"(at {position})"))
            else:
                in_place.append(found[1])
            blocks.append(found[1])
        if answered is None:
            out.append({"role": "user", "content": blocks})
            position += 1
            continue
        given = _blocks(answered)
        if len(in_place) == len(blocks):  # all there already: kept in their order (the API takes any)
            order = {id(b): n for n, b in enumerate(given)}
            blocks.sort(key=lambda b: order[id(b)])
            in_place = blocks
        rest = [b for b in given if b.get("type") != "tool_result"]
        text = answered.get("content") if isinstance(answered.get("content"), str) else None
        if text:
            rest = [{"type": "text", "text": text}]
        elif in_place:
            stayed = {id(b) for b in in_place}
            was = [id(b) for b in given if b.get("type") != "tool_result" or id(b) in stayed]
            if was != [id(b) for b in in_place + rest]:
                repairs.append(Repair("reordered_results", "", position + 1,
                                      "its tool_result blocks were put first, in the order of the tool_use "
                                      f"blocks at {position} (the API requires them first)"))
        out.append({**answered, "content": blocks + rest})
        position += 2
    pairing.leftovers(repairs)
    return out


def _uses(message: Any) -> list[dict[str, Any]]:
    """The tool_use blocks of an assistant message (the calls a user message after it answers)."""
    return [b for b in _blocks(message) if b.get("type") == "tool_use"] if _role(message) == "assistant" else []


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
