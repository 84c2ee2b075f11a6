"""Stream parsers cost each event its own size, and rebuild what they rebuilt before: no Redis needed.

Each reference below is the code as it was (anthropic_stream.py concatenating text, thinking,
citations and usage at each delta; openai_chat_stream.py's ``_merge`` searching every item so
far; ``CallAssembler.open_slots`` looking at every call so far), compared with the parsers on
random streams; then a size that took tens of seconds must finish within a lax bound."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.dispatcher.adapters import anthropic_stream
from toolfleet.dispatcher.adapters.anthropic_stream import AnthropicStreamParser
from toolfleet.dispatcher.adapters.base import CallAssembler
from toolfleet.dispatcher.adapters.openai_chat_stream import OpenAIChatStreamParser, _final, _merge
from toolfleet.dispatcher.adapters.wire import at, kind, need_object

CASES = Path("/work/shared/cases/anthropic_stream")


class ConcatenatingParser(AnthropicStreamParser):
    """The parser as it was: every text, thinking, citations and usage delta concatenated at once."""

    def feed(self, event: Any) -> Any:
        if isinstance(event, dict) and event.get("type") == "message_delta":
            self._events += 1
            where = f"/{self._events}"
            self._message.update(need_object(event.get("delta"), at(where, "delta"), "delta", optional=True))
            usage = need_object(event.get("usage"), at(where, "usage"), "usage", optional=True)
            if usage:
                old = self._message.get("usage")
                self._message["usage"] = {**(old if isinstance(old, dict) else {}), **usage}
            return self.calls.release()
        return super().feed(event)

    def _delta(self, index: Any, delta: dict[str, Any], where: str) -> None:
        kind_ = delta.get("type")
        position = self._at.get(index)
        if position is None or kind_ == "input_json_delta":
            return super()._delta(index, delta, where)
        block = self._blocks[position]
        for key, field in (("text_delta", "text"), ("thinking_delta", "thinking")):
            if kind_ == key:
                text = delta.get(field)
                if isinstance(text, str):
                    old = block.get(field)
                    block[field] = (old if isinstance(old, str) else "") + text
                elif text is not None:
                    self.warnings.append(f"{at(where, field)}: ignored {kind(text)} (text expected)")
        if kind_ == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind_ == "citations_delta":
            citations = block.get("citations")
            block["citations"] = [*(citations if isinstance(citations, list) else []), delta.get("citation")]

    def response(self) -> dict[str, Any]:
        content = []
        for position, block in enumerate(self._blocks):
            block = dict(block)
            slot = self.calls.get(position)
            if slot is not None:
                block.update(type="tool_use", id=slot.id, name=slot.name,
                             input=anthropic_stream._object(slot.arguments()))
            if block.get("type") == "text" and not (isinstance(block.get("text"), str) and block["text"].strip()):
                continue
            content.append(block)
        return {**self._message, "type": "message", "role": "assistant", "content": content}


odd = st.one_of(st.none(), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=2))
texts = st.one_of(st.text(alphabet="ab \ud83d", max_size=3), odd)
blocks = st.fixed_dictionaries({"type": st.sampled_from(["text", "thinking", "tool_use", "server_tool_use", "image"])},
                               optional={"text": texts, "thinking": texts, "citations": odd,
                                         "id": st.sampled_from(["t1", "t2"]), "name": st.just("f")})
usage = st.dictionaries(st.sampled_from(["input_tokens", "output_tokens", "cache"]), st.integers(0, 9), max_size=2)
index = st.integers(0, 2)
anthropic_events = st.lists(st.one_of(
    st.builds(lambda m: {"type": "message_start", "message": m},
              st.fixed_dictionaries({"id": st.just("m")}, optional={"usage": st.one_of(usage, odd)})),
    st.builds(lambda i, b: {"type": "content_block_start", "index": i, "content_block": b}, index, blocks),
    st.builds(lambda i, k, v: {"type": "content_block_delta", "index": i, "delta": {"type": f"{k}_delta", k: v}},
              index, st.sampled_from(["text", "thinking"]), texts),
    st.builds(lambda i, c: {"type": "content_block_delta", "index": i, "delta": {"type": "citations_delta",
                                                                                "citation": c}},
              index, st.one_of(odd, st.fixed_dictionaries({"url": st.just("u")}))),
    st.builds(lambda i, s: {"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta",
                                                                                "signature": s}},
              index, st.text(max_size=2)),
    st.builds(lambda i, p: {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta",
                                                                                "partial_json": p}},
              index, st.sampled_from(['{"a"', ': 1}', "", "{}"])),
    st.builds(lambda i: {"type": "content_block_stop", "index": i}, index),
    st.builds(lambda d, u: {"type": "message_delta", "delta": d, "usage": u},
              st.one_of(st.just({}), st.just({"stop_reason": "tool_use"}), st.builds(lambda u: {"usage": u}, usage)),
              usage),
    st.just("rebuild"),  # the message rebuilt mid-stream: it must not change with the events after it
), max_size=25)


def run(parser: AnthropicStreamParser, events: list[Any]) -> tuple[list[Any], list[Any]]:
    out, taken = [], []
    for event in events:
        if event == "rebuild":
            message = parser.response()
            taken.append((message, copy.deepcopy(message)))
            out.append(repr(message))
        else:
            out.append([c.model_dump() for c in parser.feed(copy.deepcopy(event))])
    out.append([c.model_dump() for c in parser.finish()])
    out += [repr(parser.response()), parser.warnings, parser.cut_off]
    return out, taken


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anthropic_events)
def test_anthropic_rebuilds_what_concatenating_rebuilt(events):
    new, taken = run(AnthropicStreamParser(), events)
    old, _ = run(ConcatenatingParser(), events)
    assert new == old
    for message, then in taken:
        assert message == then  # a message handed out is not changed by later deltas


def test_the_recorded_anthropic_streams_rebuild_as_before():
    files = sorted(CASES.glob("*.jsonl")) if CASES.is_dir() else []
    for path in files:
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert run(AnthropicStreamParser(), events)[0] == run(ConcatenatingParser(), events)[0], path.name


def _timed(parser: Any, events: Any) -> float:
    started = time.perf_counter()
    for event in events:
        parser.feed(event)
    parser.finish()
    parser.response()
    return time.perf_counter() - started


def test_a_long_anthropic_message_costs_its_size():
    """800 kB of text in 8-byte deltas took 5.1 s, 100,000 citation deltas 38 s: 1.6 MB of each now."""
    def deltas(n: int, delta: dict[str, Any]) -> Any:
        yield {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1}}}
        yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        for _ in range(n):
            yield {"type": "content_block_delta", "index": 0, "delta": delta}
        for i in range(n // 10):
            yield {"type": "message_delta", "delta": {}, "usage": {f"k{i}": i}}

    parser = AnthropicStreamParser()
    assert _timed(parser, deltas(200_000, {"type": "text_delta", "text": "x" * 8})) < 8.0
    assert len(parser.response()["content"][0]["text"]) == 1_600_000
    assert _timed(AnthropicStreamParser(), deltas(200_000, {"type": "citations_delta", "citation": {"u": 1}})) < 8.0


# ---- openai_chat_stream ----

def searching_merge(old: Any, new: Any, join_text: bool = True) -> Any:
    """``_merge`` as it was, lists searched item by item (text kept joined: the same result)."""
    if old is None:
        return copy.deepcopy(new)
    if join_text and isinstance(new, str) and isinstance(old, str):
        return old + new
    if isinstance(old, list) and isinstance(new, list):
        for item in new:
            same = None
            if isinstance(item, dict) and "index" in item:
                same = next((i for i, o in enumerate(old) if isinstance(o, dict) and o.get("index") == item["index"]
                             and o.get("type") == item.get("type")), None)
            if same is None:
                old.append(copy.deepcopy(item))
            else:
                old[same] = searching_merge(old[same], item)
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        for key, value in new.items():
            if key in ("index", "type", "id", "format") or value is None:
                old.setdefault(key, copy.deepcopy(value))
            else:
                old[key] = searching_merge(old.get(key), value, join_text)
        return old
    return copy.deepcopy(new)


keys = st.one_of(st.none(), st.integers(0, 2), st.just(1.0), st.just(True), st.just(float("nan")),
                 st.lists(st.integers(0, 1), max_size=1), st.sampled_from(["a", "b"]))
items = st.fixed_dictionaries({}, optional={"index": keys, "type": keys, "text": st.text(alphabet="xy", max_size=2),
                                            "data": st.lists(st.integers(0, 2), max_size=2)})
values = st.recursive(st.one_of(st.text(alphabet="xy", max_size=2), st.integers(0, 2), items, st.none()),
                      lambda inner: st.one_of(st.lists(st.one_of(items, inner), max_size=3),
                                              st.dictionaries(st.sampled_from(["details", "index", "type", "x"]),
                                                              inner, max_size=2)),
                      max_leaves=8)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(values, min_size=1, max_size=8), st.booleans())
def test_chat_merge_merges_what_searching_merged(deltas, join_text):
    new = old = None
    for delta in deltas:
        new = _merge(new, delta, join_text)
        old = searching_merge(old, delta, join_text)
    assert repr(_final(new)) == repr(old)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "complete", "release"]), st.integers(0, 9)), max_size=40))
def test_open_slots_are_the_slots_not_complete(ops):
    calls = CallAssembler()
    for op, n in ops:
        if op == "start":
            calls.start(("k", len(calls)), f"c{len(calls)}", "f")
        elif op == "complete":
            calls.complete(("k", n))
        else:
            calls.release()
        assert calls.open_slots() == [s for s in calls.slots() if not s.done]
        assert calls.open_before(n) == [s for s in calls.slots()[:n] if not s.done]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_long_chat_stream_costs_its_size():
    """20,000 reasoning_details items each with a new index took 37 s, 20,000 chunks each ending the
    choice 9.9 s, 20,000 calls without an index 4.5 s; now each stays within a lax bound."""
    n = 20_000
    details = (_chunk({"reasoning_details": [{"type": "reasoning.text", "index": i, "text": "x"}]}) for i in range(n))
    assert _timed(OpenAIChatStreamParser(), details) < 8.0
    def call(i: int, arguments: str) -> dict[str, Any]:
        return {"tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": arguments}}]}

    ending = (_chunk(call(i, "{}"), "tool_calls") for i in range(n))
    assert _timed(OpenAIChatStreamParser(), ending) < 8.0
    indexless = (_chunk(call(i, "{")) for i in range(n))
    assert _timed(OpenAIChatStreamParser(), indexless) < 8.0


class RereadingParser(OpenAIChatStreamParser):
    """The parser as it was: arguments balanced and closed are read whole at every such fragment."""

    def _fragment(self, fragment: dict[str, Any], where: str) -> None:
        super()._fragment(fragment, where)
        for slot in self.calls.slots():
            slot.scan.never_json = False


json_bits = ['{', '}', '"a"', ':', '1', ',', ' ', '[', ']', 'x', '"', '\\', '{}', '"}"']
argument_pieces = st.lists(st.sampled_from(json_bits), max_size=4).map("".join)
fragment_streams = st.lists(st.tuples(st.integers(0, 1), argument_pieces), max_size=20)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fragment_streams)
def test_chat_arguments_complete_where_rereading_completed_them(fragments):
    def stream() -> list[dict[str, Any]]:
        events = [_chunk({"tool_calls": [{"index": i, "id": f"c{i}", "type": "function",
                                          "function": {"name": "f", "arguments": ""}}]}) for i in (0, 1)]
        events += [_chunk({"tool_calls": [{"index": i, "function": {"arguments": text}}]}) for i, text in fragments]
        return [*events, _chunk({}, "tool_calls")]

    def run(parser: OpenAIChatStreamParser) -> list[Any]:
        out: list[Any] = [[c.model_dump() for c in parser.feed(e)] for e in stream()]
        return [*out, [c.model_dump() for c in parser.finish()], parser.response(), parser.warnings, parser.cut_off]

    assert run(OpenAIChatStreamParser()) == run(RereadingParser())


def test_arguments_that_cannot_become_json_are_not_reread_at_each_fragment():
    """A call whose arguments closed at depth 0 without being JSON, followed by 8,000 "{}"
    fragments, took 5.4 s (2,000: 0.53 s): each one read the whole text again. 16,000 now."""
    broken = '{"a": "' + "x" * 160_000 + '", b}'
    head = _chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                   "function": {"name": "f", "arguments": broken}}]})
    rest = (_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}) for _ in range(16_000))
    parser = OpenAIChatStreamParser()
    assert _timed(parser, [head, *rest]) < 8.0
    call = parser.response()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == broken + "{}" * 16_000


def test_a_long_responses_stream_and_its_answers_cost_their_size():
    """Each item looked over every earlier one (the answered ids, the terminal response's items
    matched by search), and format_results(results, events) replays the stream: 8,000 calls took
    29 s to answer, 69 s with a terminal response listing them (a breaker's find)."""
    from toolfleet.dispatcher.adapters import get_adapter
    from toolfleet.models import ToolResult

    n = 8_000
    items = [{"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}", "id": f"fc_{i}"}
             for i in range(n)]
    shells = [{"type": "local_shell_call", "call_id": f"s{i}", "id": f"ls_{i}", "status": "completed",
               "action": {"type": "exec", "command": ["ls"], "env": {}}} for i in range(n // 4)]
    events = [{"type": f"response.output_item.{step}", "output_index": i, "item": item}
              for i, item in enumerate(items + shells) for step in ("added", "done")]
    events.append({"type": "response.completed", "response": {"output": items + shells}})
    adapter = get_adapter("openai_responses_stream")
    started = time.perf_counter()
    calls = adapter.parse(events)
    results = [ToolResult(call_id=c.id, name=c.name, status="ok", content="x") for c in calls]
    answers = adapter.format_results(results, events)
    assert len(answers) == n + n // 4 and answers[-1]["type"] == "local_shell_call_output"
    assert time.perf_counter() - started < 8.0
