"""Property-based tests (hypothesis) over every adapter, stream parser, ``repair_history`` and, as
their caller, redaction (issue 12). A fixed seed (``derandomize=True``, no example database) and
``PROPERTY_EXAMPLES`` examples in all (at least 10,000; set TOOLFLEET_PROPERTY_SCALE to run more or
fewer), so CI runs the same inputs every time.

The properties:

- no raw exception: every payload, stream or history gives calls (or a repaired history) or
  :class:`BatchRejected`; validating each call gives exactly one outcome (its arguments, or its
  error result), and redacting what the audit shows never raises;
- reassembly: a stream's calls come out once each, in model order, with arguments equal to the
  concatenated fragments after joining surrogate pairs (so equal to what the model wrote), in every
  server style (OpenAI, LiteLLM, vLLM reusing an index, Gemini/Ollama without index, interleaved,
  whole calls; Responses calls announced item by item, or only in the terminal ``response.completed``);
- what goes back validates against the SDKs' request types (openai's ``ChatCompletionMessageParam``
  and ``ResponseInputItemParam``, anthropic's ``MessageParam``) and the providers' rules: string
  arguments, no empty text block, each call's result right after it.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.dispatcher.adapters import ADAPTERS, detect, get_adapter
from toolfleet.dispatcher.history import repair_history
from toolfleet.dispatcher.wire import checked_call
from toolfleet.errors import BatchRejected
from toolfleet.models import ErrorCode, ToolCall, ToolResult
from toolfleet.tools.redact import redact_arguments, redact_text, redact_value

from . import input_strategies as s
from .conftest import CASES, make_registry
from .sdk_types import MESSAGES, _drain, check_messages
from .test_cases_gateway_streams import without_extensions

SCALE = float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))
BUDGET = {  # examples per test; the sum is PROPERTY_EXAMPLES
    "garbage": 900,  # x 6 formats
    "chat_stream": 1200, "anthropic_stream": 500, "responses_stream": 500, "whole": 250,  # whole: x 3 formats
    "history": 300,  # x 3 formats
    "history_garbage": 800,
    "arguments": 400,
}
PROPERTY_EXAMPLES = int(SCALE * (6 * BUDGET["garbage"] + BUDGET["chat_stream"] + BUDGET["anthropic_stream"]
                                 + BUDGET["responses_stream"] + 3 * BUDGET["whole"] + 3 * BUDGET["history"]
                                 + BUDGET["history_garbage"] + BUDGET["arguments"]))
RAN: Counter[str] = Counter()
REGISTRY = make_registry()


def budget(name: str):
    return settings(max_examples=max(1, int(SCALE * BUDGET[name])), derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def sdk_accepts(format: str, messages: list[dict]) -> None:
    """Validate without requiring every key to be declared (garbage may sit in fields we keep)."""
    _drain(MESSAGES[format.removesuffix("_stream")].validate_python(messages, strict=True))


def outcomes(calls) -> list:
    """Validate each call, as the dispatcher does (``checked_call``, what ``Turn.add_calls`` runs),
    and redact what the audit shows: one outcome each."""
    found = []
    for call in calls:
        outcome = checked_call(REGISTRY, call)
        if isinstance(outcome, ToolResult):
            assert outcome.call_id == call.id and outcome.code in (ErrorCode.UNKNOWN_TOOL, ErrorCode.INVALID_ARGUMENT)
            redact_text(call.arguments) if isinstance(call.arguments, str) else redact_value(call.arguments)
        else:
            spec, arguments = outcome
            assert isinstance(arguments, dict)
            redact_arguments(arguments, spec.sensitive)
        found.append(outcome)
    assert len(found) == len(calls)
    return found


def results_for(calls) -> list[ToolResult]:
    return [ToolResult(call_id=c.id, name=c.name, status="ok", content="done") if n % 2 else
            ToolResult.failure(c.id, c.name, ErrorCode.INVALID_ARGUMENT, "bad", "fix it")
            for n, c in enumerate(calls)]


def call_parts(format: str, assistant: list[dict]) -> list[dict]:
    """The parts of the rebuilt assistant message that carry calls (the rest is kept as it came)."""
    base = format.removesuffix("_stream")
    if base == "openai_chat":
        return [{"role": "assistant", "tool_calls": m["tool_calls"]} for m in assistant if m.get("tool_calls")]
    if base == "anthropic":
        blocks = [b for m in assistant for b in m["content"] if b.get("type") == "tool_use"]
        return [{"role": "assistant", "content": blocks}] if blocks else []
    return [i for i in assistant if i.get("type") == "function_call"]


def paired(format: str, assistant: list[dict], messages: list[dict], calls) -> None:
    """Provider rules: string arguments, no empty text block, results right after, in call order."""
    base = format.removesuffix("_stream")
    ids = [c.id for c in calls]
    if base == "openai_chat":
        echoed = [c["id"] for m in assistant for c in m.get("tool_calls") or []]
        assert all(isinstance(c["function"]["arguments"], str) for m in assistant for c in m.get("tool_calls") or [])
        assert [m["tool_call_id"] for m in messages] == ids
    elif base == "anthropic":
        blocks = [b for m in assistant for b in m["content"]]
        assert all(b.get("type") != "text" or (isinstance(b["text"], str) and b["text"].strip()) for b in blocks)
        echoed = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        assert [b["tool_use_id"] for b in messages[0]["content"]] == ids if ids else messages == []
    else:
        echoed = [i["call_id"] for i in assistant if i.get("type") == "function_call"]
        assert all(isinstance(i["arguments"], str) for i in assistant if i.get("type") == "function_call")
        assert [m["call_id"] for m in messages] == ids
    assert echoed == ids


def usable(calls) -> bool:
    """Ids a batch can be run with (the dispatcher refuses a batch with a missing or repeated id)."""
    ids = [c.id for c in calls]
    return all(ids) and len(set(ids)) == len(ids)


def _recorded(folder: str) -> list:
    out = []
    for path in sorted((CASES / folder).iterdir()):
        if path.suffix == ".json" and not path.name.endswith(".expect.json"):
            out.append(json.loads(path.read_text()))
        elif path.suffix == ".jsonl":
            out.append([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    return out


# what garbage is made from: the recorded cases of each format (mutated anywhere)
BASES = {
    "openai_chat": _recorded("openai_chat"), "openai_responses": _recorded("openai_responses"),
    "anthropic": _recorded("anthropic"), "anthropic_stream": _recorded("anthropic_stream") + [
        e for e in _recorded("gateway_streams") if e[0].get("type") == "message_start"],
    "openai_chat_stream": _recorded("openai_chat_stream") + [
        e for e in _recorded("gateway_streams") if e[0].get("type") != "message_start"],
    "openai_responses_stream": _recorded("openai_responses_stream"),
}
GARBAGE_BASES = {
    "openai_chat": s.chat_payload, "openai_responses": s.responses_payload, "anthropic": s.anthropic_payload,
}


@pytest.mark.parametrize("format", list(ADAPTERS))
@budget("garbage")
@given(data=st.data())
def test_any_payload_or_stream_gives_calls_or_batch_rejected(format, data):
    RAN["garbage"] += 1
    adapter = get_adapter(format)
    payload = data.draw(s.mutated(data.draw(st.sampled_from(BASES[format]))) | s.GARBAGE)
    try:  # telling the format from the shape: an adapter or BatchRejected
        assert detect(payload).name in ADAPTERS
    except BatchRejected as exc:
        assert exc.reason == "unknown_format"
    try:
        calls = adapter.parse(payload)
        assistant = adapter.assistant_messages(payload)
    except BatchRejected as exc:
        assert exc.reason == "unreadable_payload" and exc.pointer.startswith("/"), exc
        return
    outcomes(calls)
    json.dumps(assistant, ensure_ascii=False).encode("utf-8")  # what an SDK sends: must encode
    if usable(calls):
        messages = adapter.format_results(results_for(calls))
        paired(format, assistant, messages, calls)
        sdk_accepts(format, call_parts(format, assistant) + messages)


def check_reassembly(format: str, events: list, made: list[dict], warnings_ok: bool = False) -> None:
    adapter = get_adapter(format)
    parser = adapter.parser()
    released = [c for event in events for c in parser.feed(event)] + parser.finish()
    assert [c.id for c in released] == [c["id"] for c in made], "each call once, in model order"
    assert [c.index for c in released] == list(range(len(made)))
    assert parser.cut_off == [] and (warnings_ok or parser.warnings == [])
    for call, want in zip(released, made, strict=True):
        text = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, ensure_ascii=False)
        joined = s.utf16_units(want["text"])
        assert "".join(want["fragments"]) == joined
        # the concatenated fragments, surrogate pairs joined, are what the model wrote
        assert (text == want["text"]) or (want["text"] in ("{}",) and text in ("", "{}"))
        assert call.name == want["name"]
    found = outcomes(released)
    for outcome, want in zip(found, made, strict=True):
        if not isinstance(outcome, ToolResult):
            assert outcome[1] == want["arguments"]
    assistant = adapter.assistant_messages(events)
    messages = adapter.format_results(results_for(released))
    paired(format, assistant, messages, released)
    check_messages(format, without_extensions(assistant) + messages)


@budget("chat_stream")
@given(stream=s.chat_streams())
def test_chat_stream_reassembly_in_every_server_style(stream):
    RAN["chat_stream"] += 1
    events, made, style = stream
    check_reassembly("openai_chat_stream", events, made)
    assistant = get_adapter("openai_chat_stream").assistant_messages(events)[0]
    first = events[1:]
    signature = next((f["extra_content"] for e in first for c in e["choices"]
                      for f in c["delta"].get("tool_calls") or [] if "extra_content" in f), None)
    assert assistant["tool_calls"][0].get("extra_content") == signature  # kept where it came
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [c["text"] for c in made]


@budget("anthropic_stream")
@given(stream=s.anthropic_streams())
def test_anthropic_stream_reassembly(stream):
    RAN["anthropic_stream"] += 1
    events, made = stream
    check_reassembly("anthropic_stream", events, made)


@budget("responses_stream")
@given(stream=s.responses_streams())
def test_responses_stream_reassembly(stream):
    RAN["responses_stream"] += 1
    events, made = stream
    check_reassembly("openai_responses_stream", events, made)


@pytest.mark.parametrize("format", ["openai_chat", "openai_responses", "anthropic"])
@budget("whole")
@given(made=s.calls())
def test_whole_payloads_round_trip(format, made):
    RAN["whole"] += 1
    adapter = get_adapter(format)
    payload = GARBAGE_BASES[format](made)
    calls = adapter.parse(payload)
    assert [c.id for c in calls] == [c["id"] for c in made]
    for outcome, want in zip(outcomes(calls), made, strict=True):
        if not isinstance(outcome, ToolResult):
            assert outcome[1] == want["arguments"]
    assistant = adapter.assistant_messages(payload)
    messages = adapter.format_results(results_for(calls))
    paired(format, assistant, messages, calls)
    check_messages(format, assistant + messages)


@st.composite
def histories(draw, format: str) -> list[dict]:
    """A conversation of turns with calls, then results missing, repeated, moved or orphaned, empty
    text blocks and null arguments."""
    history: list[dict] = [{"role": "user", "content": "start"}] if format != "openai_responses" else [
        {"role": "user", "content": "start"}]
    pending: list[dict] = []
    for turn, made in enumerate(draw(st.lists(s.calls(max_calls=3), min_size=1, max_size=3))):
        made = [{**c, "id": f"t{turn}_{c['id']}"} for c in made]  # ids are unique in a conversation
        if format == "openai_chat":
            calls = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": draw(st.sampled_from([c["text"], None, c["arguments"]]))}}
                for c in made]
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
            results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in made]
        elif format == "anthropic":
            text = draw(st.sampled_from(["", " ", "Calling."]))
            history.append({"role": "assistant", "content": [{"type": "text", "text": text}, *(
                {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]} for c in made)]})
            results = [{"type": "tool_result", "tool_use_id": c["id"], "content": "ok"} for c in made]
        else:
            history += [{"type": "function_call", "call_id": c["id"], "name": c["name"],
                         "arguments": draw(st.sampled_from([c["text"], None]))} for c in made]
            results = [{"type": "function_call_output", "call_id": c["id"], "output": "ok"} for c in made]
        kept = []
        for result in results:
            fate = draw(st.sampled_from(["keep", "keep", "drop", "twice", "later"]))
            if fate in ("keep", "twice"):
                kept.append(result)
            if fate == "twice":
                kept.append(result)
            if fate == "later":
                pending.append(result)
        if draw(st.booleans()):
            kept.append({"role": "tool", "tool_call_id": "orphan", "content": "x"} if format == "openai_chat" else
                        {"type": "tool_result", "tool_use_id": "orphan", "content": "x"} if format == "anthropic" else
                        {"type": "function_call_output", "call_id": "orphan", "output": "x"})
        if format == "anthropic":
            history.append({"role": "user", "content": kept or "go on"})
        else:
            history += kept
            history.append({"role": "user", "content": "go on"})
    if pending:
        history += pending if format != "anthropic" else [{"role": "user", "content": pending}]
    return history


@pytest.mark.parametrize("format", ["openai_chat", "openai_responses", "anthropic"])
@budget("history")
@given(data=st.data())
def test_repair_history_gives_what_the_provider_accepts(format, data):
    RAN["history"] += 1
    history = data.draw(histories(format))
    repaired = repair_history(history, format)
    check_messages(format, repaired.messages)
    again = repair_history(repaired.messages, format)
    assert again.ok, again.repairs  # one repair is enough
    ids = Counter()
    for message in repaired.messages:
        if message.get("role") == "tool":
            ids[message["tool_call_id"]] += 1
        if message.get("type") == "function_call_output":
            ids[message["call_id"]] += 1
        if isinstance(message.get("content"), list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    ids[block["tool_use_id"]] += 1
    assert all(n == 1 for n in ids.values()), "one result per call id"


HISTORIES = {  # what garbage histories are made from
    "openai_chat": [[{"role": "user", "content": "x"}, payload["choices"][0]["message"],
                     {"role": "tool", "tool_call_id": "call_01", "content": "ok"}] for payload in BASES["openai_chat"]],
    "openai_responses": [[{"role": "user", "content": "x"}, *payload["output"],
                          {"type": "function_call_output", "call_id": "call_r1", "output": "ok"}]
                         for payload in BASES["openai_responses"]],
    "anthropic": [[{"role": "user", "content": "x"}, {"role": "assistant", "content": payload["content"]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"},
                                                {"type": "text", "text": ""}]}]
                  for payload in BASES["anthropic"]],
}


@budget("history_garbage")
@given(data=st.data())
def test_repair_history_of_anything_gives_a_history_or_batch_rejected(data):
    RAN["history_garbage"] += 1
    format = data.draw(st.sampled_from(["openai_chat", "openai_responses", "anthropic", None]))
    base = data.draw(st.sampled_from(HISTORIES[format or "openai_chat"]))
    history = data.draw(s.mutated(base) | s.GARBAGE)
    try:
        repaired = repair_history(history, format)
    except BatchRejected as exc:
        assert exc.reason == "unreadable_payload"
        return
    json.dumps(repaired.messages, default=str)


def _nested(depth: int, leaf: object) -> object:
    for n in range(depth):
        leaf = {"a": leaf} if n % 2 else [leaf]
    return {"x": leaf}


ANY_ARGUMENTS = (s.ANY_TEXT | s.HOSTILE_TEXT | st.text(max_size=40) | s.JSON.map(json.dumps) | s.GARBAGE.map(str)
                 | s.ARGUMENTS | st.builds(_nested, st.integers(90, 3000), s.GARBAGE))


@budget("arguments")
@given(name=s.NAMES, arguments=ANY_ARGUMENTS)
def test_any_arguments_text_or_object_give_the_call_exactly_one_outcome(name, arguments):
    """Whatever a call's arguments hold (text or an object; nested past Python's recursion limit,
    digits past its int limit, lone surrogates), the dispatcher's checks give that call one
    outcome and raise nothing: a bad call cannot sink its batch (issue 12's 5000-deep arguments
    raised RecursionError out of submit_response)."""
    RAN["arguments"] += 1
    outcomes([ToolCall(id="c1", name=name, arguments=arguments)])


PYTHON_BUILT = st.recursive(  # what a payload built in Python (YAML, msgpack, an SDK object) may hold
    st.none() | st.integers() | st.text(max_size=5) | st.binary(max_size=4) | st.frozensets(st.integers(), max_size=2),
    lambda inner: st.dictionaries(st.integers() | st.text(max_size=3) | st.tuples(st.integers()), inner, max_size=3)
    | st.lists(inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(objects=st.lists(st.dictionaries(st.integers() | st.text(max_size=3) | st.tuples(st.integers()),
                                        PYTHON_BUILT, min_size=1, max_size=3), min_size=1, max_size=3))
def test_python_built_arguments_that_are_not_json_are_each_calls_error(objects):
    """An Anthropic ``input`` {1: "a"} raised pydantic's ValidationError out of parse: the whole
    batch failed (a breaker's find). Arguments objects that JSON could not carry (keys that are not
    strings, sets, bytes), in every whole format, are each that call's INVALID_ARGUMENT now; plain
    ones still run."""
    for format in ("anthropic", "openai_chat", "openai_responses"):
        if format == "anthropic":
            payload = {"type": "message", "role": "assistant", "content": [
                {"type": "tool_use", "id": f"t{n}", "name": "read_file", "input": o} for n, o in enumerate(objects)]}
        elif format == "openai_chat":
            payload = {"role": "assistant", "tool_calls": [
                {"id": f"t{n}", "type": "function", "function": {"name": "read_file", "arguments": o}}
                for n, o in enumerate(objects)]}
        else:
            payload = {"output": [{"type": "function_call", "call_id": f"t{n}", "name": "read_file", "arguments": o}
                                  for n, o in enumerate(objects)]}
        calls = get_adapter(format).parse(payload)
        assert [c.id for c in calls] == [f"t{n}" for n in range(len(objects))]
        for outcome, o in zip(outcomes(calls), objects, strict=True):
            try:
                plain = json.loads(json.dumps(o)) == o
            except (TypeError, ValueError):
                plain = False
            if not plain:
                assert isinstance(outcome, ToolResult) and outcome.code == ErrorCode.INVALID_ARGUMENT, (o, outcome)


def test_zz_the_property_run_had_its_examples():
    """Runs last in this file: the count of examples that ran (printed for the record)."""
    total = sum(RAN.values())
    print(f"\nhypothesis examples run: {total} ({dict(RAN)}), budget {PROPERTY_EXAMPLES}")
    if len(RAN) < len(BUDGET):
        pytest.skip("only part of the file ran")
    assert total >= 0.9 * PROPERTY_EXAMPLES
    if SCALE >= 1:
        assert total >= 10_000


def test_arguments_holding_a_cycle_or_a_shared_list_end_as_that_calls_error():
    """A dict holding itself made the plain-JSON walk loop for ever, and a list held twice at each
    of 40 levels walk 2**40 items (a breaker's find): each container is walked once."""
    import threading

    cyclic: dict = {}
    cyclic["a"] = cyclic
    shared: list = [1]
    for _ in range(40):
        shared = [shared, shared]
    found: list = []

    def parse() -> None:
        for arguments in (cyclic, {"x": shared}):
            found.append(ToolCall(id="c", name="read_file", arguments=arguments).arguments)
            found.append(get_adapter("anthropic").parse({"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "read_file", "input": arguments}]})[0].arguments)

    worker = threading.Thread(target=parse, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the walk did not end"
    assert len(found) == 4 and all(isinstance(a, str) for a in found), found
    found_outcomes = outcomes([ToolCall(id="c", name="read_file", arguments=a) for a in found])
    assert all(isinstance(o, ToolResult) and o.code == ErrorCode.INVALID_ARGUMENT for o in found_outcomes)
    assert all("JSON cannot carry" in o.content for o in found_outcomes), found_outcomes[0].content
    # a tuple is written as an array (Python shares equal constant tuples: not a cycle)
    assert ToolCall(id="c", name="read_file", arguments={"a": (1, 2), "b": (1, 2)}).arguments == {"a": (1, 2),
                                                                                                 "b": (1, 2)}
