"""OpenAI Chat Completions, streamed (``stream=True``): ``chat.completion.chunk`` events.

Source: OpenAI API reference, "Streaming" for Chat Completions: each chunk's
``choices[0].delta.tool_calls`` holds fragments keyed by ``index``; the first fragment of a call
carries its ``id``, ``type`` and ``function.name``, the following ones pieces of
``function.arguments`` to be joined in order; ``finish_reason`` ends the choice. Only choice 0 is
read, as for the non-streamed format; a choice whose ``index`` is ``null`` or missing is choice 0
(servers that fill only one choice send it so, and the OpenAI SDK's users read ``choices[0]``
whatever its index).

Events of openai-python's stream helper (``client.chat.completions.stream()``) are read too: its
``ChunkEvent`` (``type: "chunk"``) carries the raw chunk in ``chunk``, which is read as above, and its
other events (:data:`SDK_HELPER_EVENTS`: ``content.delta``, ``tool_calls.function.arguments.done``,
...) repeat what the chunks say and are skipped. Any other event without ``choices`` is ignored with
a warning naming it.

What compatible servers do, and how each is read (docs/streams.md has the sources):

- fragments of several calls interleaved: the ``index`` is the key, a later call starting never
  closes an earlier one (OpenAI; vLLM);
- the ``id`` (and ``type``, ``name``) repeated on every fragment (LiteLLM, SGLang): the same id
  at the same index is the same call;
- an ``index`` reused with a new ``id`` and a function name (vLLM with some tool parsers): a new call;
- a new ``id`` on every fragment, the name only on the first (LiteLLM's OCI provider, ``name: ""``):
  a fragment that names no function continues the call at its index, whatever its id;
- no ``index`` (Gemini's OpenAI-compatible endpoint, older Ollama): a fragment with a new id and a
  name starts a new call, one without an id (or without a name) continues the last one; once the
  last one is complete, a fragment that brings argument text and names a function is a new call
  (under no id or the last one's: refused as ``missing_call_id`` / ``duplicate_call_id``, as with an
  index, never dropped), but for the last call sent again whole (its id, name and arguments);
- ``{}`` first, then the real arguments as a second object (some providers behind gateways, e.g.
  Bedrock: openai/openai-agents-js#712): a call whose arguments are ``{}`` so far waits for the next
  event; an object that comes next for it replaces the ``{}`` (said in a warning);
- a whole call in one fragment (Ollama), ``arguments`` as an object instead of text: its JSON text;
- provider fields the parser does not interpret (``extra_content.google.thought_signature`` of
  Gemini, ``reasoning``/``reasoning_details`` of OpenRouter, ``reasoning_content`` of vLLM) are kept
  in the rebuilt message: on a call, as they came; on the delta, text joined, lists extended
  (items with the same ``index`` merged), objects merged.

A call is complete, and released at once, when its joined arguments form a complete JSON object
(nothing can be appended to one and stay valid JSON; ``{}``: at the next event that brings it no
text), when its index is reused by a new call, or at ``finish_reason``. The calls
``finish_reason: "length"`` completes (the output token limit ended the choice while they were
being written) are listed in ``cut_off`` and do not run, as the same call does not when the
response comes whole (:mod:`.cut_off`). Text for a call after it was complete is ignored with a
warning (white space silently). A fragment of the wrong type raises BatchRejected with the JSON
pointer of the field, the event's position first (``/3/choices/0/delta/tool_calls/0/index``).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from ...models import ToolCall
from .base import CallAssembler, JsonDepth, StreamFormat, as_dict, parses_as_object
from .openai_chat import OpenAIChatAdapter, for_chat_wire
from .wire import (
    at,
    cut,
    join_surrogates,
    kind,
    need_index,
    need_list,
    need_object,
    need_text,
    refuse_legacy_function_call,
    short,
)

_EMPTY_OBJECT = re.compile(r"\s*\{\s*\}\s*")  # arguments "{}": the real ones may follow (see above)
_DELTA_READ = frozenset({"role", "content", "refusal", "tool_calls"})
_CALL_READ = frozenset({"index", "id", "type", "function", "custom"})
_META = ("id", "created", "model", "system_fingerprint", "service_tier")
SDK_HELPER_EVENTS = frozenset({
    "content.delta", "content.done", "refusal.delta", "refusal.done", "tool_calls.function.arguments.delta",
    "tool_calls.function.arguments.done", "logprobs.content.delta", "logprobs.content.done",
    "logprobs.refusal.delta", "logprobs.refusal.done"})
"""Events openai-python's stream helper (``client.chat.completions.stream()``,
``openai/lib/streaming/chat/_events.py``) derives from the chunks it reads; each raw chunk comes in
its ``ChunkEvent`` (``type: "chunk"``, the chunk in ``chunk``), so these repeat what the chunks say."""


class OpenAIChatStreamParser:
    def __init__(self) -> None:
        self.calls = CallAssembler()
        self.cut_off: list[str] = []
        self.cut_why: dict[str, str] = {}  # call id -> what cut it off at the token limit (.cut_off)
        self.custom: set[str] = set()  # ids of custom tool calls (type "custom": name and free-form input)
        self.warnings: list[str] = []
        self._meta: dict[str, Any] = {}
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._extra: dict[str, Any] = {}  # delta fields not interpreted, merged
        self._call_extra: dict[int, dict[str, Any]] = {}  # slot index -> fields of its fragments
        self._finish: str | None = None
        self._keys: dict[Any, Any] = {}  # index (or indexless position) -> assembler key
        self._last_key: Any = None
        self._events = -1
        self._empty: dict[int, tuple[Any, int]] = {}  # slot index -> (slot, event): arguments "{}" so far

    def feed(self, event: Any) -> list[ToolCall]:
        self._events += 1
        chunk = as_dict(event)
        if not isinstance(chunk, dict):
            self.warnings.append(f"ignored an event that is not an object: {cut(str(chunk), 60)}")
            return []
        if chunk.get("type") == "chunk" and isinstance(chunk.get("chunk"), dict):
            chunk = chunk["chunk"]  # the SDK stream helper's ChunkEvent: the raw chunk inside
        elif "choices" not in chunk and chunk.get("object") != "chat.completion.chunk":
            if chunk.get("type") not in SDK_HELPER_EVENTS:  # the helper's own events repeat the chunks
                self.warnings.append(f"event {self._events}: ignored an event that is neither a chat.completion.chunk "
                                     f"nor one of the SDK stream helper's: {short(chunk, 80)}")
            return []
        where = f"/{self._events}"
        for key in _META:
            if chunk.get(key) is not None:
                self._meta.setdefault(key, chunk[key])
        for n, choice in enumerate(need_list(chunk.get("choices"), at(where, "choices"), "choices")):
            here = at(at(where, "choices"), n)
            choice = need_object(choice, here, "a choice")
            if choice.get("index") not in (0, None):  # null or missing: the first choice
                continue
            delta = need_object(choice.get("delta"), at(here, "delta"), "delta", optional=True)
            self._delta(delta, at(here, "delta"))
            finish = choice.get("finish_reason")
            if finish is not None:
                self._finish = need_text(finish, at(here, "finish_reason"), "finish_reason") or self._finish
                self._complete_empty(self._events + 1)  # complete calls of "{}": not cut off
                for slot in self.calls.open_slots():
                    if finish in ("length", "content_filter"):  # the token limit, or the content filter
                        self.cut_off.append(slot.id)  # (.cut_off), ended the choice while this call was open
                        self.cut_why[slot.id] = f"finish_reason {finish}"
                    slot.done = True
        self._complete_empty(self._events)
        return self.calls.release()

    def _complete_empty(self, before: int) -> None:
        """Complete the calls whose arguments were ``{}`` at an event before ``before`` and got no text since."""
        for index, (slot, event) in list(self._empty.items()):
            if event < before or slot.done:
                slot.done = True
                del self._empty[index]

    def _delta(self, delta: dict[str, Any], where: str) -> None:
        for key, value in delta.items():
            if key in ("content", "refusal"):
                if isinstance(value, str):
                    (self._content if key == "content" else self._refusal).append(value)
                elif value is not None:
                    self.warnings.append(f"{at(where, key)}: ignored {kind(value)} (text expected)")
            elif key not in _DELTA_READ and value is not None:
                self._extra[key] = _merge(self._extra.get(key), value)
        fragments = need_list(delta.get("tool_calls"), at(where, "tool_calls"), "tool_calls")
        if not fragments and not self.calls.slots():  # a call of the deprecated functions API: no id
            refuse_legacy_function_call(delta.get("function_call"), at(where, "function_call"))
        for n, fragment in enumerate(fragments):
            here = at(at(where, "tool_calls"), n)
            self._fragment(need_object(fragment, here, "a tool call fragment"), here)

    def _fragment(self, fragment: dict[str, Any], where: str) -> None:
        call_id = need_text(fragment.get("id"), at(where, "id"), "a call id")
        custom = fragment.get("type") == "custom" or fragment.get("custom") is not None
        if custom:  # a custom tool's call: its free-form input streams in custom.input
            function = need_object(fragment.get("custom"), at(where, "custom"), "custom", optional=True)
            name = need_text(function.get("name"), at(at(where, "custom"), "name"), "a tool name")
            text = need_text(function.get("input"), at(at(where, "custom"), "input"), "input")
        else:
            function = need_object(fragment.get("function"), at(where, "function"), "function", optional=True)
            name = need_text(function.get("name"), at(at(where, "function"), "name"), "a function name")
            text = function.get("arguments")
            if isinstance(text, dict):  # a whole call as an object (some servers)
                text = json.dumps(text, ensure_ascii=False)
            text = need_text(text, at(at(where, "function"), "arguments"), "arguments")
        index = need_index(fragment.get("index"), at(where, "index"))
        slot = self._slot(index, call_id, name, text)
        slot.id = slot.id or call_id
        slot.name = slot.name or name
        if custom or slot.id in self.custom:
            self.custom.add(slot.id)
            if text and not slot.done:
                slot.parts.append(text)  # complete at the stream's finish_reason: free text never closes
            return
        extra = self._call_extra.setdefault(slot.index, {})
        for key, value in fragment.items():
            if key not in _CALL_READ and value is not None:
                extra[key] = _merge(extra.get(key), value, join_text=False)
        for key, value in function.items():
            if key not in ("name", "arguments") and value is not None:
                extra.setdefault("function", {})[key] = value
        if fragment.get("type") is not None:
            extra["type"] = fragment["type"]
        if not text:
            return
        if slot.index in self._empty:  # "{}" so far: an object next is the real arguments
            del self._empty[slot.index]
            if text.lstrip().startswith("{"):
                self.warnings.append(f"call {slot.id or slot.index}: arguments {{}} followed by an object: the "
                                     "object was read as its arguments")
                slot.parts.clear()
                slot.scan = JsonDepth()
        if slot.done:
            if text.strip():
                self.warnings.append(f"call {slot.id or slot.index}: argument text after its arguments were "
                                     f"complete was ignored: {short(text, 60)}")
            return
        slot.parts.append(text)
        if slot.scan.feed(text) and not slot.scan.never_json:  # read whole only when its brackets may have closed
            joined = join_surrogates("".join(slot.parts))
            if _EMPTY_OBJECT.fullmatch(joined):
                self._empty[slot.index] = (slot, self._events)  # complete at the next event without text for it
            elif parses_as_object(joined):
                slot.done = True
            else:  # closed at depth 0 yet not an object: nothing appended can make it one, so it
                slot.scan.never_json = True  # is not read whole again at each fragment (quadratic)

    def _slot(self, index: int | None, call_id: str, name: str, text: str = "") -> Any:
        if index is None:  # no index: a new id starts a new call, no id continues the last one
            last = self.calls.get(self._last_key)
            if last is not None and (not call_id or call_id == last.id or self._renamed(last, call_id, name)):
                complete = last.done or last.index in self._empty
                # a complete call goes on no more: argument text with a function name is a new call,
                # but for the same call sent again whole (its id, name and arguments)
                again = call_id == last.id and name == last.name and text.strip() == "".join(last.parts).strip()
                if not (complete and name and text.strip() and not again):
                    return last
            key = ("position", len(self.calls))
            if last is not None:
                last.done = True  # nothing can address it any more
        else:
            key = self._keys.get(index)
            current = self.calls.get(key)
            if current is not None and not (call_id and current.id and call_id != current.id
                                            and not self._renamed(current, call_id, name)):
                self._last_key = key
                return current
            if current is not None:  # the index reused with a new id: a new call
                current.done = True
            key = ("index", index, len(self.calls))
            self._keys[index] = key
        self._last_key = key
        return self.calls.start(key, call_id, name)

    def _renamed(self, slot: Any, call_id: str, name: str) -> bool:
        """Whether a fragment of another id than ``slot``'s, at its index (or after it, without
        index), is ``slot``'s own all the same: it names no function. A new call names its function
        in its first fragment (vLLM's index reuse); a gateway that gives every fragment a new id
        (LiteLLM's OCI provider, ``name: ""``: BerriAI/litellm#40040) sends the call's next text."""
        if name:
            return False
        self.warnings.append(f"call {cut(slot.id, 60)}: a fragment of id {cut(call_id, 60)} that names no function "
                             "was read as its continuation (its id ignored)")
        return True

    def finish(self) -> list[ToolCall]:
        self._complete_empty(self._events + 1)
        for slot in self.calls.open_slots():
            if self._finish is None:
                self.cut_off.append(slot.id)
            slot.done = True
        return self.calls.release()

    def response(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": join_surrogates("".join(self._content)) or None}
        if self._refusal:
            message["refusal"] = join_surrogates("".join(self._refusal))
        message.update({k: _final(v) for k, v in self._extra.items() if k not in message})
        tool_calls = []
        for slot in self.calls.slots():
            extra = _final(self._call_extra.get(slot.index, {}))
            if slot.id in self.custom:
                tool_calls.append({"id": slot.id, "type": "custom",
                                   "custom": {"name": slot.name, "input": join_surrogates("".join(slot.parts))}})
                continue
            function = {**extra.pop("function", {}), "name": slot.name, "arguments": slot.arguments()}
            tool_calls.append({"id": slot.id, "type": extra.pop("type", "function"), "function": function, **extra})
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {**self._meta, "object": "chat.completion",
                "choices": [{"index": 0, "message": for_chat_wire(message), "finish_reason": self._finish}]}


class _Joined(list):
    """Text of a delta field not interpreted, its pieces kept apart until :func:`_final` (joining
    at each delta was quadratic in a long field, e.g. ``reasoning_content``)."""


class _Items(list):
    """A list field not interpreted (``reasoning_details``), with the position of the first item of
    each ``(index, type)``: a delta's item finds the one it extends without a search of every item
    so far (which was quadratic in a stream whose items each bring a new index). Keys that cannot
    be hashed, or are not equal to themselves (NaN), are searched for as before."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self._first: dict[tuple[Any, Any], int] = {}
        self._odd: list[int] = []  # positions of dict items whose key cannot be a dict key
        for position, item in enumerate(items):
            self._note(position, item)

    def _note(self, position: int, item: Any) -> None:
        if not isinstance(item, dict):
            return
        k = (item.get("index"), item.get("type"))
        if _usable(k):
            self._first.setdefault(k, position)
        else:
            self._odd.append(position)

    def add(self, item: Any) -> None:
        self.append(item)
        self._note(len(self) - 1, item)

    def find(self, item: dict[str, Any]) -> int | None:
        """The position of the first dict item with ``item``'s ``index`` and ``type``, or None."""
        k = (item["index"], item.get("type"))
        if _usable(k):
            return self._first.get(k)
        return next((i for i in self._odd if self[i].get("index") == k[0] and self[i].get("type") == k[1]), None)


def _usable(k: tuple[Any, Any]) -> bool:
    try:
        hash(k)
    except TypeError:
        return False
    return all(x == x for x in k)  # NaN is not equal to itself: never found by equality, so not by the dict


def _merge(old: Any, new: Any, join_text: bool = True) -> Any:
    """A delta field not interpreted, accumulated: text joined (``join_text``; as a :class:`_Joined`
    until :func:`_final`), lists extended (dict items with the same ``index`` merged into one),
    objects merged, anything else replaced. What it returns is its own (``new`` is deep-copied:
    the caller's event is never changed), so later deltas extend it in place: linear in the stream."""
    if old is None:
        return copy.deepcopy(new)
    if join_text and isinstance(new, str) and isinstance(old, (str, _Joined)):
        if isinstance(old, str):
            return _Joined([old, new])
        old.append(new)
        return old
    if isinstance(old, list) and not isinstance(old, _Joined) and isinstance(new, list):
        if not isinstance(old, _Items):
            old = _Items(old)
        for item in new:
            same = old.find(item) if isinstance(item, dict) and "index" in item else None
            if same is None:
                old.add(copy.deepcopy(item))
            else:
                old[same] = _merge(old[same], item)
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        for key, value in new.items():
            if key in ("index", "type", "id", "format") or value is None:
                old.setdefault(key, copy.deepcopy(value))
            else:
                old[key] = _merge(old.get(key), value, join_text)
        return old
    return copy.deepcopy(new)


def _final(value: Any) -> Any:
    """``value`` with each :class:`_Joined` text joined."""
    if isinstance(value, _Joined):
        return "".join(value)
    if isinstance(value, dict):
        return {k: _final(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_final(v) for v in value]
    return value


class OpenAIChatStreamAdapter(StreamFormat, OpenAIChatAdapter):
    name = "openai_chat_stream"
    streamed = True

    def parser(self) -> OpenAIChatStreamParser:
        return OpenAIChatStreamParser()

    def custom_call_ids(self, payload: Any) -> set[str]:
        return super().custom_call_ids(self.whole(payload))
