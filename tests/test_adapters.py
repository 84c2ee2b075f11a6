"""Adapters in and out for every provider format, streamed or not (no worker needed).

Payloads are the case files, as plain dicts and as the official SDK objects; output shapes are
checked against the SDKs' request param types (tests/sdk_types.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from toolfleet import ErrorCode, ToolCall, ToolResult, default_registry, get_adapter
from toolfleet.dispatcher.adapters import ADAPTERS, detect
from toolfleet.errors import BatchRejected
from toolfleet.tools.validation import parse_arguments

from .conftest import CASES
from .sdk_types import check_messages, check_tools

FILES = {
    "openai_chat": CASES / "openai_chat" / "01_parallel_reads.json",
    "openai_responses": CASES / "openai_responses" / "06_parallel_reads.json",
    "anthropic": CASES / "anthropic" / "07_mixed.json",
    "openai_chat_stream": CASES / "openai_chat_stream" / "08_parallel_reads.jsonl",
    "anthropic_stream": CASES / "anthropic_stream" / "09_two_reads.jsonl",
    "openai_responses_stream": CASES / "openai_responses_stream" / "10_parallel_reads.jsonl",
}
SDK = {
    "openai_chat": ChatCompletion.model_validate,
    "openai_responses": Response.model_validate,
    "anthropic": Message.model_validate,
    "openai_chat_stream": ChatCompletionChunk.model_validate,
    "anthropic_stream": TypeAdapter(RawMessageStreamEvent).validate_python,
    "openai_responses_stream": TypeAdapter(ResponseStreamEvent).validate_python,
}


def load(path: Path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def as_sdk(name: str, payload):
    make = SDK[name]
    return [make(e) for e in payload] if isinstance(payload, list) else make(payload)


def expected_order(path: Path) -> list[str]:
    return json.loads(path.with_name(path.name.split(".")[0] + ".expect.json").read_text())["order"]


@pytest.mark.parametrize("name", list(FILES))
def test_each_case_is_told_apart_and_parsed_from_dicts_and_sdk_objects(name):
    payload = load(FILES[name])
    for given in (payload, as_sdk(name, payload)):
        adapter = detect(given)
        assert adapter.name == name
        calls = adapter.parse(given)
        assert [c.id for c in calls] == expected_order(FILES[name])
        assert [c.index for c in calls] == list(range(len(calls)))
        assert all(c.name for c in calls)


@pytest.mark.parametrize("name", list(FILES))
def test_assistant_message_and_results_validate_against_the_sdk_types(name):
    adapter = get_adapter(name)
    payload = load(FILES[name])
    for given in (payload, as_sdk(name, payload)):
        calls = adapter.parse(given)
        results = [ToolResult(call_id=c.id, name=c.name, status="ok", content="fine") if i % 2 == 0 else
                   ToolResult.failure(c.id, c.name, ErrorCode.EXECUTION_ERROR, "it broke")
                   for i, c in enumerate(calls)]
        assistant = adapter.assistant_messages(given)
        check_messages(name, assistant + adapter.format_results(results))


def test_the_non_streamed_assistant_message_comes_back_unchanged():
    for name in ("openai_chat", "openai_responses", "anthropic"):
        payload = load(FILES[name])
        assistant = get_adapter(name).assistant_messages(payload)
        if name == "openai_chat":
            assert assistant == [payload["choices"][0]["message"]]
        elif name == "openai_responses":
            assert assistant == payload["output"]
        else:
            assert assistant == [{"role": "assistant", "content": payload["content"]}]


def test_result_shapes_per_provider():
    ok = ToolResult(call_id="a", name="t", status="ok", content="A")
    bad = ToolResult.failure("b", "t", ErrorCode.TIMEOUT, "too slow")
    assert get_adapter("chat").format_results([ok, bad]) == [
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "b", "content": bad.content}]
    assert get_adapter("responses").format_results([ok, bad]) == [
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call_output", "call_id": "b", "output": bad.content}]
    assert get_adapter("anthropic").format_results([ok, bad]) == [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
        {"type": "tool_result", "tool_use_id": "b", "content": bad.content, "is_error": True}]}]


def test_responses_pair_by_call_id_not_item_id():
    calls = get_adapter("openai_responses").parse(load(FILES["openai_responses"]))
    assert calls[0].id == "call_x1_contacts"  # the item id is fc_01


@pytest.mark.parametrize("name", ["openai_chat", "openai_responses", "anthropic"])
def test_tools_lists_from_the_registry_validate_against_the_sdk_types(name):
    registry = default_registry()
    tools = get_adapter(name).tools(registry)
    check_tools(name, tools)
    assert len(tools) == len(registry)
    first = tools[0]
    spec = registry.get("read_file")
    if name == "openai_chat":
        assert first == {"type": "function", "function": {"name": "read_file", "description": spec.description,
                                                          "parameters": spec.parameters}}
    elif name == "openai_responses":
        assert first == {"type": "function", "name": "read_file", "description": spec.description,
                         "parameters": spec.parameters, "strict": False}
    else:
        assert first == {"name": "read_file", "description": spec.description, "input_schema": spec.parameters}


def released_at(name: str, events: list) -> dict[str, int]:
    """Which event (0-based) released each call."""
    parser = get_adapter(name).parser()
    at = {}
    for i, event in enumerate(events):
        for call in parser.feed(event):
            at[call.id] = i
    for call in parser.finish():
        at[call.id] = len(events)
    assert parser.cut_off == [] and parser.warnings == []
    return at


def test_chat_stream_releases_a_call_as_soon_as_its_arguments_are_a_complete_object():
    events = load(FILES["openai_chat_stream"])
    # event 4 closes call_st1's JSON; event 9 closes call_st2's; event 10 (finish_reason) is the last
    assert released_at("openai_chat_stream", events) == {"call_st1": 4, "call_st2": 9}
    assert released_at("openai_chat_stream", as_sdk("openai_chat_stream", events)) == {"call_st1": 4, "call_st2": 9}


def test_chat_stream_a_later_call_starting_does_not_close_an_earlier_one():
    """The index is the key (OpenAI's streaming docs): fragments of two calls may interleave, so a
    call with no complete object yet stays open until the choice finishes (issue 12, case 1)."""
    def chunk(index, fragment, id=None, name=None, finish=None):
        call = {"index": index, "function": {"arguments": fragment}}
        if id:
            call.update(id=id, type="function")
            call["function"]["name"] = name
        return {"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"tool_calls": [call]} if fragment is not None else {}, "finish_reason": finish}]}

    events = [chunk(0, "", "a", "list_dir"), chunk(1, "", "b", "list_dir"), chunk(1, "  ", None),
              chunk(0, None, finish="tool_calls")]
    parser = get_adapter("openai_chat_stream").parser()
    assert [c.id for c in parser.feed(events[0])] == []
    assert parser.feed(events[1]) == []  # b started: a may still get its arguments
    assert parser.feed(events[2]) == []
    assert [c.id for c in parser.feed(events[3])] == ["a", "b"]
    assert parse_arguments(ToolCall(id="b", name="list_dir", arguments="  ")) == {}


def test_anthropic_stream_releases_at_content_block_stop_and_empty_input_means_empty_object():
    events = load(FILES["anthropic_stream"])
    assert released_at("anthropic_stream", events) == {"toolu_st1": 7, "toolu_st2": 10}
    calls = get_adapter("anthropic_stream").parse(events)
    assert calls[1].arguments == "" and parse_arguments(calls[1]) == {}
    rebuilt = get_adapter("anthropic_stream").assistant_messages(events)
    assert rebuilt == [{"role": "assistant", "content": [
        {"type": "text", "text": "Checking two files."},
        {"type": "tool_use", "id": "toolu_st1", "name": "read_file", "input": {"path": "config/settings.toml"}},
        {"type": "tool_use", "id": "toolu_st2", "name": "list_dir", "input": {}}]}]


@pytest.mark.parametrize("start, deltas, arguments", [
    ('{"path": "secret_dir"}', [], {"path": "secret_dir"}),  # whole input at the start, as JSON text
    ({"path": "d"}, [], {"path": "d"}),                      # ... as an object
    ({}, ['{"path":', ' "x"}'], {"path": "x"}),             # Anthropic's own: {} then the deltas
    ("", [], {}),
    ('{"path": "start"}', ['{"path": "delta"}'], {"path": "delta"}),  # deltas win
])
def test_anthropic_stream_reads_a_whole_input_sent_at_the_block_start(start, deltas, arguments):
    """A gateway's tool_use block that carried its input as JSON text at content_block_start, with
    no deltas, ran with {} (list_dir of the workspace root instead of the directory asked for: a
    breaker's find); it is read as the same block sent whole would be."""
    events = [{"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "t1", "name": "list_dir", "input": start}},
              *({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": d}}
                for d in deltas),
              {"type": "content_block_stop", "index": 0}, {"type": "message_stop"}]
    [call] = get_adapter("anthropic_stream").parse(events)
    assert parse_arguments(call) == arguments
    whole = get_adapter("anthropic").parse({"type": "message", "role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "list_dir", "input": start}]})
    if not deltas:
        assert parse_arguments(whole[0]) == arguments


def test_responses_stream_releases_at_arguments_done():
    events = load(FILES["openai_responses_stream"])
    done = [i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.done"]
    assert list(released_at("openai_responses_stream", events).values()) == done


def _fc(call_id: str, item_id: str | None = None, **extra) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "list_dir", "arguments": "{}",
            **({"id": item_id} if item_id else {}), **extra}


@pytest.mark.parametrize("events, ids", [
    # the item's done event without its output_index: the same item, known by its id (docs/streams.md)
    ([{"type": "response.output_item.added", "output_index": 0, "item": _fc("c1", "fc_1", arguments="")},
      {"type": "response.output_item.done", "item": _fc("c1", "fc_1")},
      {"type": "response.completed", "response": {"output": [_fc("c1", "fc_1")]}}], ["c1"]),
    # a server that numbers every item 0 and sends no item ids: two calls, told apart by call_id
    ([{"type": "response.output_item.added", "output_index": 0, "item": _fc("c1")},
      {"type": "response.output_item.done", "output_index": 0, "item": _fc("c1")},
      {"type": "response.output_item.added", "output_index": 0, "item": _fc("c2")},
      {"type": "response.output_item.done", "output_index": 0, "item": _fc("c2")},
      {"type": "response.completed", "response": {"output": [_fc("c1"), _fc("c2")]}}], ["c1", "c2"]),
])
def test_responses_stream_items_are_known_by_item_id_then_output_index(events, ids):
    """The parser keyed items by output_index first: a done event without its index made a second
    c1 (a live stream was refused as duplicate_call_id), and a second call at index 0 without item
    ids was merged into the first and never ran (a breaker's finds)."""
    adapter = get_adapter("openai_responses_stream")
    assert [c.id for c in adapter.parse(events)] == ids
    assert [i["call_id"] for i in adapter.whole(events)["output"]] == ids
    results = [ToolResult(call_id=i, name="list_dir", status="ok", content="ok") for i in ids]
    check_messages("openai_responses", adapter.assistant_messages(events) + adapter.format_results(results, events))


def test_a_stream_adapter_answers_custom_and_client_calls_from_the_events_too():
    """format_results(results, response=events) answered a custom_tool_call and a local_shell_call
    with function_call_output (only a rebuilt response was read): the events are replayed now."""
    custom = {"type": "custom_tool_call", "call_id": "k1", "name": "apply", "input": "x", "id": "ct_1"}
    shell = {"type": "local_shell_call", "call_id": "s1", "id": "ls_1", "status": "completed",
             "action": {"type": "exec", "command": ["ls"], "env": {}}}
    events = [{"type": f"response.output_item.{step}", "output_index": n, "item": item}
              for n, item in enumerate((custom, shell)) for step in ("added", "done")]
    events.append({"type": "response.completed", "response": {"output": [custom, shell]}})
    adapter = get_adapter("openai_responses_stream")
    results = [ToolResult(call_id=c.id, name=c.name, status="ok", content="ok") for c in adapter.parse(events)]
    assert [m["type"] for m in adapter.format_results(results, response=events)] == [
        "custom_tool_call_output", "local_shell_call_output"]
    assert adapter.format_results(results, response=events) == adapter.format_results(results, adapter.whole(events))


def test_a_call_completed_early_waits_for_earlier_ones_so_model_order_holds():
    events = load(FILES["openai_responses_stream"])
    first_done = next(i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.done")
    second_item = next(i for i, e in enumerate(events)
                       if e["type"] == "response.output_item.added" and e["output_index"] == 1)
    second_done = next(i for i, e in enumerate(events)
                       if e["type"] == "response.function_call_arguments.done" and e["output_index"] == 1)
    # the second call is done before the first: it is held back until the first is
    reordered = events[:first_done] + events[second_item:second_done + 1] + events[first_done:second_item] \
        + events[second_done + 1:]
    parser = get_adapter("openai_responses_stream").parser()
    released = [[c.id for c in parser.feed(e)] for e in reordered]
    non_empty = [r for r in released if r]
    assert non_empty[0] == ["call_s1_contacts", "call_s2_grep"]


def test_a_stream_cut_short_reports_the_open_call():
    events = load(FILES["anthropic_stream"])[:6]  # toolu_st1 opened, never stopped
    parser = get_adapter("anthropic_stream").parser()
    for event in events:
        assert parser.feed(event) == []
    assert [c.id for c in parser.finish()] == ["toolu_st1"] and parser.cut_off == ["toolu_st1"]


def test_unknown_or_single_event_payloads_are_refused_with_a_reason():
    with pytest.raises(BatchRejected, match="cannot tell the provider format"):
        detect({"hello": "world"})
    with pytest.raises(BatchRejected, match="one stream event"):
        detect(load(FILES["anthropic_stream"])[4])
    with pytest.raises(BatchRejected, match="unknown format"):
        get_adapter("gemini")


def test_every_format_has_a_name_and_short_names_work():
    assert set(ADAPTERS) == set(FILES)
    assert get_adapter("chat").name == "openai_chat"
    assert get_adapter("responses").name == "openai_responses"
    assert get_adapter("messages").name == "anthropic"


# Events of openai-python's Chat stream helper (client.chat.completions.stream()), recorded as plain
# data (model_dump(mode="json", exclude_unset=True)) from its ChatCompletionStreamState fed the four
# chunks below; the helper's snapshot is one object it keeps updating, so each ChunkEvent shows its
# last state. A tester's find: these gave no call and no warning, and no format told from them.
_RAW_HELPER_CHUNKS = [
    {"id": "c1", "choices": [{"delta": {"content": "Reading."}, "index": 0, "finish_reason": None}], "created": 1,
     "model": "gpt-4.1", "object": "chat.completion.chunk"},
    {"id": "c1", "choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_a", "function": {
        "arguments": "", "name": "read_file"}, "type": "function"}]}, "index": 0, "finish_reason": None}],
     "created": 1, "model": "gpt-4.1", "object": "chat.completion.chunk"},
    {"id": "c1", "choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
        "arguments": '{"path":"README.md"}'}}]}, "index": 0, "finish_reason": None}], "created": 1,
     "model": "gpt-4.1", "object": "chat.completion.chunk"},
    {"id": "c1", "choices": [{"delta": {}, "index": 0, "finish_reason": "tool_calls"}], "created": 1,
     "model": "gpt-4.1", "object": "chat.completion.chunk"},
]
_HELPER_SNAPSHOT = {"id": "c1", "choices": [{"finish_reason": "tool_calls", "index": 0, "message": {
    "content": "Reading.", "refusal": None, "role": None, "annotations": None, "audio": None, "function_call": None,
    "tool_calls": [{"id": "call_a", "function": {"arguments": '{"path":"README.md"}', "name": "read_file",
                                                 "parsed_arguments": None}, "type": "function", "index": 0}]}}],
    "created": 1, "model": "gpt-4.1", "object": "chat.completion", "system_fingerprint": None, "usage": None}
SDK_HELPER_EVENTS = [
    {"type": "chunk", "chunk": _RAW_HELPER_CHUNKS[0], "snapshot": _HELPER_SNAPSHOT},
    {"type": "content.delta", "delta": "Reading.", "snapshot": "Reading.", "parsed": None},
    {"type": "chunk", "chunk": _RAW_HELPER_CHUNKS[1], "snapshot": _HELPER_SNAPSHOT},
    {"type": "tool_calls.function.arguments.delta", "name": "read_file", "index": 0, "arguments": "",
     "parsed_arguments": None, "arguments_delta": ""},
    {"type": "content.done", "content": "Reading.", "parsed": None},
    {"type": "chunk", "chunk": _RAW_HELPER_CHUNKS[2], "snapshot": _HELPER_SNAPSHOT},
    {"type": "tool_calls.function.arguments.delta", "name": "read_file", "index": 0,
     "arguments": '{"path":"README.md"}', "parsed_arguments": None, "arguments_delta": '{"path":"README.md"}'},
    {"type": "chunk", "chunk": _RAW_HELPER_CHUNKS[3], "snapshot": _HELPER_SNAPSHOT},
    {"type": "tool_calls.function.arguments.done", "name": "read_file", "index": 0,
     "arguments": '{"path":"README.md"}', "parsed_arguments": None},
]


def test_the_openai_sdk_chat_stream_helpers_events_give_the_calls_of_their_chunks():
    adapter = get_adapter("openai_chat_stream")
    parser = adapter.replay(SDK_HELPER_EVENTS)
    assert parser.warnings == []
    assert adapter.parse(SDK_HELPER_EVENTS) == adapter.parse(_RAW_HELPER_CHUNKS) == [
        ToolCall(id="call_a", name="read_file", arguments='{"path":"README.md"}', index=0)]
    assert adapter.assistant_messages(SDK_HELPER_EVENTS) == adapter.assistant_messages(_RAW_HELPER_CHUNKS)
    assert adapter.assistant_messages(SDK_HELPER_EVENTS)[0]["tool_calls"][0]["id"] == "call_a"
    assert detect(SDK_HELPER_EVENTS).name == "openai_chat_stream"  # no format given: told from the ChunkEvents


def test_a_chat_stream_event_neither_a_chunk_nor_the_sdk_helpers_is_ignored_with_a_warning():
    parser = get_adapter("openai_chat_stream").parser()
    assert parser.feed({"type": "chunk", "chunk": "not an object"}) == []
    assert parser.feed({"error": {"message": "overloaded"}}) == []
    assert len(parser.warnings) == 2 and all("ignored an event" in w for w in parser.warnings)
    assert "overloaded" in parser.warnings[1]


def test_a_responses_list_that_holds_a_calls_answer_does_not_run_it_again():
    """A function_call followed by its own function_call_output in the list given (an input list
    passed as the response) was run again and answered twice (a breaker's find): it is not a call
    to run; a call_0 reused by a later turn still is, told apart by position."""
    fc = {"type": "function_call", "call_id": "call_0", "name": "read_file", "arguments": "{}"}
    answer = {"type": "function_call_output", "call_id": "call_0", "output": "x"}
    custom = {"type": "custom_tool_call", "call_id": "k", "name": "apply", "input": "y"}
    adapter = get_adapter("openai_responses")
    assert [c.id for c in adapter.parse({"output": [fc, answer, {**fc, "call_id": "b"}]})] == ["b"]
    assert [c.id for c in adapter.parse({"output": [custom, {"type": "custom_tool_call_output", "call_id": "k",
                                                             "output": "z"}]})] == []
    later = adapter.parse({"output": [fc, answer, {"role": "user", "content": "again"}, dict(fc)]})
    assert [(c.id, c.index) for c in later] == [("call_0", 0)]


def test_a_chat_call_of_another_type_goes_back_as_the_function_it_ran_as():
    """A tool call typed "web_search" (a gateway's) was run as a function and went back with that
    type, which the API refuses (a breaker's find)."""
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "web_search", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]}
    adapter = get_adapter("openai_chat")
    [call] = adapter.parse(message)
    assistant = adapter.assistant_messages(message)
    assert assistant[0]["tool_calls"][0]["type"] == "function"
    result = ToolResult(call_id=call.id, name=call.name, status="ok", content="ok")
    check_messages("openai_chat", assistant + adapter.format_results([result]))


def test_a_responses_stream_summary_missing_a_custom_call_is_not_trusted():
    """response.completed listing [reasoning, c2] for a stream that carried custom call c1 and
    function call c2 was taken as the history: c1 vanished from it (a breaker's find)."""
    custom = {"type": "custom_tool_call", "call_id": "c1", "name": "apply", "input": "x", "id": "ct_1"}
    fc = _fc("c2", "fc_2")
    events = [{"type": f"response.output_item.{step}", "output_index": n, "item": item}
              for n, item in enumerate((custom, fc)) for step in ("added", "done")]
    events.append({"type": "response.completed", "response": {"output": [
        {"type": "reasoning", "id": "rs_1", "summary": []}, fc]}})
    adapter = get_adapter("openai_responses_stream")
    assert [i.get("call_id") for i in adapter.whole(events)["output"]] == ["c1", "c2"]


def test_a_responses_stream_message_at_a_calls_output_index_is_another_item():
    """Every item at output_index 0, no item ids: a message after a call was merged into it (gone
    from the history; with a terminal response the call came twice, refused as duplicate_call_id)."""
    fc = _fc("c1", status="completed")
    message = {"type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
    events = [{"type": f"response.output_item.{step}", "output_index": 0, "item": item}
              for item in (fc, message) for step in ("added", "done")]
    adapter = get_adapter("openai_responses_stream")
    for stream in (events, [*events, {"type": "response.completed", "response": {"output": [fc, message]}}]):
        assert [c.id for c in adapter.parse(stream)] == ["c1"]
        assert [i["type"] for i in adapter.whole(stream)["output"]] == ["function_call", "message"]
