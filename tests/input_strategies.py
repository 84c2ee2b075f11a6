"""Hypothesis strategies for provider payloads and streams, shaped as providers and gateways send
them (tests/test_inputs_properties.py): calls with JSON arguments whose text is cut into fragments
at any point (also between the two halves of a surrogate pair), streamed in the styles of OpenAI,
LiteLLM, vLLM, Gemini/Ollama (no index) and interleaved; garbage made by replacing any part of a
valid payload by any JSON value; histories with results missing, repeated, moved or orphaned."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# small alphabets drawn by sampling (much cheaper than arbitrary code points, and richer where it
# matters): ASCII, JSON's special characters, controls, CJK, characters outside the BMP
ALPHABET = list("aZ0 _-./\"\\{}[],:\n\t\x00\x1f\x7fé中文") + ["😀", "🚀", "𝄞", "\u2028", "\ufeff"]
TEXT = st.text(st.sampled_from(ALPHABET), max_size=8)
ANY_TEXT = st.text(st.sampled_from([*ALPHABET, "\ud83d", "\ude00", "\udfff"]), max_size=6)  # + lone surrogates
SCALARS = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False,
                                                                               allow_infinity=False) | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=5)
# text past what Python's readers take: nested deeper than its recursion limit, digits past its int limit
HOSTILE_TEXT = st.sampled_from(['{"path": "a", "x": ' + "[" * 5000 + "]" * 5000 + "}", "[" * 3000 + "]" * 3000,
                                '{"a": ' * 1500 + "1" + "}" * 1500, '{"n": ' + "9" * 5001 + "}"])
GARBAGE = st.recursive(st.none() | st.booleans() | st.integers() | ANY_TEXT | st.floats() | HOSTILE_TEXT,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
                       max_leaves=4)
ARGUMENTS = st.dictionaries(TEXT, JSON, max_size=3)
CALL_ID = st.text(st.sampled_from("abcXYZ019_-"), min_size=1, max_size=10)
NAMES = st.sampled_from(["read_file", "list_dir", "grep", "write_file", "edit_file", "no_such_tool"])


def utf16_units(text: str) -> str:
    """``text`` with each character outside the BMP written as its two surrogates, as a JSON decoder
    gives ``"\\ud83d\\ude00"`` escapes that arrive in two different fragments."""
    return "".join(c if ord(c) < 0x10000 else
                   chr(0xD800 + ((ord(c) - 0x10000) >> 10)) + chr(0xDC00 + ((ord(c) - 0x10000) & 0x3FF))
                   for c in text)


@st.composite
def calls(draw, max_calls: int = 3) -> list[dict[str, Any]]:
    """Calls with distinct ids: ``id``, ``name``, ``arguments`` (an object), ``text`` (its JSON) and
    ``fragments`` (``text`` in UTF-16 units, cut anywhere)."""
    ids = draw(st.lists(CALL_ID, min_size=1, max_size=max_calls, unique=True))
    out = []
    for call_id in ids:
        arguments = draw(ARGUMENTS)
        text = json.dumps(arguments, ensure_ascii=draw(st.booleans()))
        units = utf16_units(text)
        cuts = sorted(draw(st.lists(st.integers(1, max(len(units) - 1, 1)), max_size=4, unique=True)))
        pieces = [units[a:b] for a, b in zip([0, *cuts], [*cuts, len(units)], strict=True) if a < b]
        out.append({"id": call_id, "name": draw(NAMES), "arguments": arguments, "text": text, "fragments": pieces})
    return out


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@st.composite
def chat_streams(draw) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """``(events, calls, style)`` for a Chat Completions stream in one of the servers' styles."""
    made = draw(calls())
    style = draw(st.sampled_from(["openai", "litellm", "vllm_index_reused", "indexless", "interleaved", "whole"]))
    signature = draw(st.none() | st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=12))
    events = [_chunk({"role": "assistant", "content": draw(st.sampled_from(["", None, "Checking."]))})]
    if draw(st.booleans()):
        events += [_chunk({"reasoning_content": part}) for part in draw(st.lists(TEXT, min_size=1, max_size=3))]
    per_call = []
    for n, call in enumerate(made):
        index = 0 if style == "vllm_index_reused" else (None if style == "indexless" else n)
        fragments = ["".join(call["fragments"])] if style == "whole" else call["fragments"]
        items = []
        for k, piece in enumerate(fragments):
            fragment: dict[str, Any] = {"function": {"arguments": piece}}
            if index is not None:
                fragment["index"] = index
            if k == 0 or style == "litellm":
                fragment.update(id=call["id"], type="function")
            elif style == "vllm_index_reused":
                fragment.update(id="", type="function")
            if k == 0:
                fragment["function"]["name"] = call["name"]
                if signature and n == 0:
                    fragment["extra_content"] = {"google": {"thought_signature": signature}}
            items.append(fragment)
        per_call.append(items)
    if style == "interleaved":  # any merge that keeps each call's order, calls starting in index order
        queues = [list(items) for items in per_call]
        fragments, started = [], 0
        while any(queues):
            ready = [n for n in range(min(started + 1, len(queues))) if queues[n]]
            n = draw(st.sampled_from(ready))
            started = max(started, n + 1)
            fragments.append(queues[n].pop(0))
    else:
        fragments = [f for items in per_call for f in items]
    batch = draw(st.integers(1, 3))
    for start in range(0, len(fragments), batch):
        events.append(_chunk({"tool_calls": fragments[start:start + batch]}))
    events.append(_chunk({}, draw(st.sampled_from(["tool_calls", "stop"]))))
    if draw(st.booleans()):
        events.append({"id": "chatcmpl-p", "object": "chat.completion.chunk", "choices": [],
                       "usage": {"total_tokens": 3}})
    return events, made, style


@st.composite
def anthropic_streams(draw) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    made = draw(calls())
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_p", "type": "message", "role": "assistant", "model": "claude", "content": [],
        "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}]
    index = 0
    for text in draw(st.lists(st.sampled_from(["", " ", "Let me check."]), max_size=2)):
        events.append({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
        if text:
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "text_delta", "text": text}})
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    for call in made:
        events.append({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}})
        pieces = call["fragments"] if call["arguments"] or draw(st.booleans()) else []
        if draw(st.booleans()):
            pieces = ["", *pieces]
        events += [{"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": p}} for p in pieces]
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    events += [{"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
    return events, made


@st.composite
def responses_streams(draw) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    made = draw(calls())
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": "resp_p", "object": "response",
                                                                               "output": []}}]
    with_done = draw(st.booleans())
    for n, call in enumerate(made):
        item = {"type": "function_call", "id": f"fc_{n}", "call_id": call["id"], "name": call["name"],
                "arguments": "", "status": "in_progress"}
        events.append({"type": "response.output_item.added", "output_index": n, "item": item})
        events += [{"type": "response.function_call_arguments.delta", "output_index": n, "item_id": f"fc_{n}",
                    "delta": p} for p in call["fragments"]]
        if with_done:
            events.append({"type": "response.function_call_arguments.done", "output_index": n,
                           "item_id": f"fc_{n}", "arguments": call["text"]})
        events.append({"type": "response.output_item.done", "output_index": n,
                       "item": {**item, "arguments": call["text"], "status": "completed"}})
    # the terminal response: none (a stream cut before it), after the items, or the only place the
    # calls are (no output_item event for them, as some servers and proxies send)
    terminal = draw(st.sampled_from(["none", "completed", "completed_only"]))
    if terminal != "none":
        final = responses_payload(made)
        events = events[:1] if terminal == "completed_only" else events
        events.append({"type": "response.completed", "response": {**final, "status": "completed"}})
    return events, made


def chat_payload(made: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "chatcmpl-p", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["text"]}}
                for c in made]}}]}


def responses_payload(made: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "resp_p", "object": "response", "output": [
        {"type": "function_call", "id": f"fc_{n}", "call_id": c["id"], "name": c["name"], "arguments": c["text"],
         "status": "completed"} for n, c in enumerate(made)]}


def anthropic_payload(made: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "msg_p", "type": "message", "role": "assistant", "content": [
        {"type": "text", "text": "Checking."},
        *({"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]} for c in made)]}


@st.composite
def mutated(draw, base: Any) -> Any:
    """``base`` with one part (any depth, any key or position) replaced by GARBAGE, or removed."""
    if isinstance(base, (dict, list)) and base and draw(st.integers(0, 3)) > 0:
        keys = list(base) if isinstance(base, dict) else list(range(len(base)))
        key = draw(st.sampled_from(keys))
        copy = dict(base) if isinstance(base, dict) else list(base)
        if draw(st.integers(0, 9)) == 0:
            del copy[key]
        else:
            copy[key] = draw(mutated(copy[key]))
        return copy
    return draw(GARBAGE)
