"""Issue 12's cases at the adapter level: payloads and streams as providers and gateways really send
them. (Case 7, grep over a file cut mid-UTF-8, is tools/files.py's and tested with it.) The same
streams run end to end through real workers in tests/test_cases_gateway_streams.py."""

from __future__ import annotations

import json

import pytest

from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.history import repair_history
from toolfleet.errors import BatchRejected
from toolfleet.models import ErrorCode, ToolCall
from toolfleet.tools.validation import check_call, parse_arguments

from .conftest import CASES, make_registry
from .sdk_types import check_messages
from .test_cases_gateway_streams import without_extensions

STREAMS = CASES / "gateway_streams"


def events(name: str) -> list[dict]:
    return [json.loads(line) for line in (STREAMS / name).read_text().splitlines() if line.strip()]


def rebuilt(format: str, payload) -> list[dict]:
    adapter = get_adapter(format)
    messages = adapter.assistant_messages(payload)
    check_messages(adapter.name, without_extensions(messages))
    return messages


def test_case_1_interleaved_fragments_are_keyed_by_index():
    stream = events("s01_interleaved_fragments.jsonl")
    parser = get_adapter("openai_chat_stream").replay(stream)
    calls = get_adapter("openai_chat_stream").parse(stream)
    assert [(c.id, c.arguments) for c in calls] == [("call_A", '{"path": "README.md"}'), ("call_B", '{"path": "src"}')]
    assert parser.warnings == []
    assert [parse_arguments(c) for c in calls] == [{"path": "README.md"}, {"path": "src"}]
    arguments = [c["function"]["arguments"] for c in rebuilt("openai_chat_stream", stream)[0]["tool_calls"]]
    assert arguments == ['{"path": "README.md"}', '{"path": "src"}']


def test_case_1_a_call_is_released_when_its_object_is_complete_not_when_another_starts():
    stream = events("s01_interleaved_fragments.jsonl")
    parser = get_adapter("openai_chat_stream").parser()
    released = {i: [c.id for c in parser.feed(e)] for i, e in enumerate(stream)}
    assert released == {0: [], 1: [], 2: [], 3: ["call_A"], 4: ["call_B"], 5: []}


def test_case_2_provider_fields_survive_the_rebuild_in_every_format():
    stream = events("s03_gemini_indexless.jsonl")
    message = rebuilt("openai_chat_stream", stream)[0]
    assert message["tool_calls"][0]["extra_content"] == {"google": {"thought_signature": "c2lnLTE="}}
    assert "extra_content" not in message["tool_calls"][1]
    assert [c.id for c in get_adapter("openai_chat_stream").parse(stream)] == ["function-call-1", "function-call-2"]
    # the non-streamed formats keep fields they do not read, on calls and blocks
    chat = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"},
         "extra_content": {"google": {"thought_signature": "x"}}}]}}]}
    assert get_adapter("chat").assistant_messages(chat)[0]["tool_calls"][0]["extra_content"]["google"]
    block = {"type": "tool_use", "id": "t1", "name": "list_dir", "input": {}, "cache_control": {"type": "ephemeral"}}
    assert get_adapter("anthropic").assistant_messages({"content": [block]})[0]["content"][0] == block
    item = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "list_dir", "arguments": "{}",
            "status": "completed"}
    assert get_adapter("responses").assistant_messages({"output": [item]}) == [item]


def test_case_2_anthropic_and_responses_streams_keep_block_and_item_fields():
    anthropic = [
        {"type": "message_start", "message": {"id": "m", "role": "assistant", "content": []}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "t1", "name": "list_dir", "input": {}, "caller": {"x": 1}}},
        {"type": "content_block_stop", "index": 0},
    ]
    assert get_adapter("anthropic_stream").assistant_messages(anthropic)[0]["content"][0]["caller"] == {"x": 1}
    responses = [
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "list_dir", "arguments": "",
                  "namespace": "fs"}},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "delta": "{}"},
        {"type": "response.function_call_arguments.done", "output_index": 0, "item_id": "fc_1", "arguments": "{}"},
    ]
    assert get_adapter("openai_responses_stream").assistant_messages(responses)[0]["namespace"] == "fs"


def test_case_3_no_empty_text_block_goes_back_streamed_or_not_and_repair_history_drops_it():
    stream = events("s06_anthropic_empty_text_and_input.jsonl")
    content = rebuilt("anthropic_stream", stream)[0]["content"]
    assert [b["type"] for b in content] == ["tool_use", "tool_use"]
    assert content[0]["input"] == {}
    message = {"role": "assistant", "content": [{"type": "text", "text": ""}, {"type": "text", "text": " \n"},
                                                {"type": "tool_use", "id": "t1", "name": "list_dir", "input": {}}]}
    assert [b["type"] for b in rebuilt("anthropic", message)[0]["content"]] == ["tool_use"]
    history = [{"role": "user", "content": "hi"}, message,
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
    repaired = repair_history(history, "anthropic")
    assert [r.kind for r in repaired.repairs] == ["empty_text_removed"]
    assert repaired.messages[1]["content"] == [message["content"][2]]
    check_messages("anthropic", repaired.messages)
    assert repair_history(repaired.messages, "anthropic").ok


def test_case_4_a_surrogate_pair_cut_between_fragments_is_joined():
    stream = events("s15_split_surrogate.jsonl")
    assert stream[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].endswith("\ud83d")
    (call,) = get_adapter("openai_chat_stream").parse(stream)
    assert call.arguments == '{"path": "notes/emoji.txt", "content": "ship it \U0001F600 today"}'
    assert parse_arguments(call)["content"] == "ship it \U0001F600 today"
    message = rebuilt("openai_chat_stream", stream)[0]
    json.dumps(message, ensure_ascii=False).encode("utf-8")  # what the SDK sends: must encode


def test_case_4_a_lone_surrogate_is_that_calls_invalid_argument_and_goes_back_escaped():
    chat = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": '{"content": "a\ud83d"}'}}]}
    (call,) = get_adapter("chat").parse(chat)
    result = parse_arguments(call)
    assert result.code == ErrorCode.INVALID_ARGUMENT and "surrogate" in result.content
    echoed = rebuilt("chat", chat)[0]["tool_calls"][0]["function"]["arguments"]
    assert echoed == '{"content": "a\\ud83d"}'  # the JSON escape: what the model wrote, encodable
    echoed.encode("utf-8")


@pytest.mark.parametrize("arguments", [None, "MISSING"])
def test_case_5_null_or_missing_arguments_run_as_empty_and_go_back_as_a_string(arguments):
    function = {"name": "list_dir"} if arguments == "MISSING" else {"name": "list_dir", "arguments": None}
    chat = {"choices": [{"message": {"role": "assistant", "content": None,
                                     "tool_calls": [{"id": "c1", "type": "function", "function": function}]}}]}
    (call,) = get_adapter("chat").parse(chat)
    assert parse_arguments(call) == {}
    assert rebuilt("chat", chat)[0]["tool_calls"][0]["function"]["arguments"] == "{}"
    item = {"type": "function_call", "call_id": "c1", "name": "list_dir"}
    if arguments is None:
        item["arguments"] = None
    assert rebuilt("responses", {"output": [item]})[0]["arguments"] == "{}"
    history = [{"role": "user", "content": "x"}, chat["choices"][0]["message"],
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    repaired = repair_history(history, "openai_chat")
    assert [r.kind for r in repaired.repairs] == ["arguments_normalized"]
    check_messages("openai_chat", repaired.messages)


@pytest.mark.parametrize("arguments", ["", " \n", "null"])
def test_case_5_empty_arguments_run_as_empty_and_go_back_as_an_empty_object(arguments):
    """OpenAI-compatible servers (vLLM, Ollama: pipecat-ai/pipecat#4060) write the call of a tool
    without parameters as ``arguments: ""`` (streamed: null or empty fragments). It runs as ``{}``
    but went back in the assistant message as ``""``, which servers reading the history's arguments
    as JSON refuse (Claude behind OpenAI-compatible gateways, labring/FastGPT#4754; Databricks,
    agno-agi/agno#9229; vLLM before it read empty text as ``{}``). It goes back as ``"{}"``, how it
    ran, whole or streamed, in Chat and Responses, and repair_history writes it so. Groq writes such a
    call as ``"null"`` (langchain-ai/langchain#33896): it runs as ``{}`` too (it was INVALID_ARGUMENT)
    and goes back as ``"{}"`` (Gemini refuses ``"null"``: "Expected a valid JSON object",
    langroid/langroid#988)."""
    tc = {"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": arguments}}
    chat = {"choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [tc]}}]}
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                          "function": {"name": "list_dir", "arguments": None}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
              chunk({}, "tool_calls")]
    item = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "list_dir", "arguments": arguments,
            "status": "completed"}
    responses_events = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress"}},
        {"type": "response.function_call_arguments.done", "output_index": 0, "item_id": "fc_1",
         "arguments": arguments},
        {"type": "response.output_item.done", "output_index": 0, "item": item}]
    for format, payload in (("chat", chat), ("openai_chat_stream", chunks)):
        (call,) = get_adapter(format).parse(payload)
        assert parse_arguments(call) == {}
        assert rebuilt(format, payload)[0]["tool_calls"][0]["function"]["arguments"] == "{}"
    for format, payload in (("responses", {"output": [item]}), ("openai_responses_stream", responses_events)):
        (call,) = get_adapter(format).parse(payload)
        assert parse_arguments(call) == {}
        assert rebuilt(format, payload)[0]["arguments"] == "{}"
    chat_history = [{"role": "user", "content": "x"}, chat["choices"][0]["message"],
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    responses_history = [{"role": "user", "content": "x"}, item,
                         {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    for format, history, written in (("openai_chat", chat_history, lambda m: m[1]["tool_calls"][0]["function"]),
                                     ("openai_responses", responses_history, lambda m: m[1])):
        repaired = repair_history(history, format)
        assert [r.kind for r in repaired.repairs] == ["arguments_normalized"]
        assert written(repaired.messages)["arguments"] == "{}"
        check_messages(format, repaired.messages)


def nested(depth: int, leaf=1):
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


WRONG_TYPES = [
    ("chat", {"choices": [{"message": {"tool_calls": [None]}}]}, "/choices/0/message/tool_calls/0"),
    ("chat", {"choices": "x"}, "/choices"),
    ("chat", {"choices": [{"message": {"tool_calls": [{"id": ["x"], "function": {}}]}}]},
     "/choices/0/message/tool_calls/0/id"),
    ("chat", {"choices": [{"message": {"tool_calls": [{"id": "a", "function": "f"}]}}]},
     "/choices/0/message/tool_calls/0/function"),
    ("responses", {"output": [{"type": "function_call", "call_id": 7}]}, "/output/0/call_id"),
    ("anthropic", {"content": [{"type": "tool_use", "id": "t", "name": {"x": 1}}]}, "/content/0/name"),
    ("anthropic", {"content": ["text"]}, "/content/0"),
    ("openai_chat_stream", [{"choices": [{"index": 0, "delta": "x"}]}], "/0/choices/0/delta"),
    ("openai_chat_stream", [{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {
        "tool_calls": [{"index": [0], "id": "a", "function": {"name": "n", "arguments": ""}}]}}]}],
     "/0/choices/0/delta/tool_calls/0/index"),
    ("openai_chat_stream", [{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": 5}}]}}]}],
     "/0/choices/0/delta/tool_calls/0/function/arguments"),
    ("anthropic_stream", [{"type": "message_start", "message": "x"}], "/0/message"),
    ("anthropic_stream", [{"type": "content_block_start", "index": "0", "content_block": {}}], "/0/index"),
    ("anthropic_stream", [{"type": "content_block_start", "index": 0,
                           "content_block": {"type": "tool_use", "id": "t", "name": "n"}},
                          {"type": "content_block_delta", "index": 0,
                           "delta": {"type": "input_json_delta", "partial_json": ["{"]}}], "/1/delta/partial_json"),
    ("openai_responses_stream", [{"type": "response.output_item.added", "output_index": 0, "item": "x"}], "/0/item"),
    ("openai_responses_stream", [{"type": "response.output_item.added", "output_index": {}, "item": {}}],
     "/0/output_index"),
]


@pytest.mark.parametrize("format, payload, pointer", WRONG_TYPES, ids=[p for _, _, p in WRONG_TYPES])
def test_case_6_wrong_types_are_refused_with_a_json_pointer(format, payload, pointer):
    adapter = get_adapter(format)
    for read in (adapter.parse, adapter.assistant_messages):
        with pytest.raises(BatchRejected) as refused:
            read(payload)
        assert refused.value.pointer == pointer and refused.value.reason == "unreadable_payload"
        assert str(refused.value).startswith(pointer)


@pytest.mark.parametrize("arguments, says", [
    ('{"path": ' + "9" * 5001 + "}", "5001 digits"),
    ("[" * 10_000 + "]" * 10_000, "more than 100 levels"),
    (json.dumps(nested(101)), "more than 100 levels"),
    (nested(900), "more than 100 levels"),
    ('{"path": "\\ud800"}', "surrogate"),
])
def test_case_6_unreadable_arguments_are_that_calls_invalid_argument(arguments, says):
    registry = make_registry()
    payload = {"content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": arguments},
                           {"type": "tool_use", "id": "t2", "name": "list_dir", "input": {"path": "."}}]}
    if isinstance(arguments, str):
        payload = {"role": "assistant", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "read_file", "arguments": arguments}},
            {"id": "t2", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]}
    format = "anthropic" if isinstance(arguments, dict) else "chat"
    first, second = get_adapter(format).parse(payload)
    outcome = check_call(registry, first)
    assert outcome.code == ErrorCode.INVALID_ARGUMENT and says in outcome.content
    assert not hasattr(check_call(registry, second), "code")  # the other call runs
    messages = rebuilt(format, payload)
    json.dumps(messages).encode("utf-8")


def test_case_6_a_stream_whose_arguments_are_too_deep_still_completes_the_call():
    deep = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "read_file", "arguments": deep[:7]}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": deep[7:]}}]}}]}]
    parser = get_adapter("openai_chat_stream").parser()
    released = [c for chunk in chunks for c in parser.feed(chunk)]
    assert [c.id for c in released] == ["c1"] and released[0].arguments == deep
    assert parse_arguments(released[0]).code == ErrorCode.INVALID_ARGUMENT


def test_an_index_reused_with_a_new_id_starts_a_new_call_and_a_repeated_id_continues():
    def fragment(index, id, arguments, name=None):
        function = {"arguments": arguments, **({"name": name} if name else {})}
        return {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": index, "id": id, "type": "function", "function": function}]}}]}

    stream = [fragment(0, "a", '{"path":', "read_file"), fragment(0, "a", ' "x"}'),  # LiteLLM: id repeated
              fragment(0, "b", "", "list_dir"), fragment(0, "", '{"path": "."}'),  # vLLM: index 0 reused
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    calls = get_adapter("openai_chat_stream").parse(stream)
    assert [(c.id, c.name, c.arguments) for c in calls] == [("a", "read_file", '{"path": "x"}'),
                                                          ("b", "list_dir", '{"path": "."}')]


def test_a_fragment_with_a_new_id_but_no_name_continues_the_call_at_its_index():
    """LiteLLM's OCI provider gives every argument fragment of a call a new random id (name "",
    BerriAI/litellm#40040): the fragments are one call, as the index says; a new call names its
    function (vLLM's index reuse, above), a continuation does not."""
    def fragment(id, arguments, name, finish=None):
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "finish_reason": finish, "delta": {
            "tool_calls": [{"index": 0, "id": id, "type": "function",
                            "function": {"arguments": arguments, "name": name}}]}}]}

    stream = [fragment("chatcmpl-tool-a91e", "", "read_file"), fragment("call_b49e", '{"path": "', ""),
              fragment("call_ed82", 'README.md"}', ""), fragment("call_72b4", "", "", finish="stop")]
    parser = get_adapter("openai_chat_stream").replay(stream)
    calls = get_adapter("openai_chat_stream").parse(stream)
    assert [(c.id, c.name, c.arguments) for c in calls] == [("chatcmpl-tool-a91e", "read_file",
                                                           '{"path": "README.md"}')]
    assert parser.cut_off == []
    assert [parse_arguments(c) for c in calls] == [{"path": "README.md"}]
    (message,) = rebuilt("openai_chat_stream", stream)
    assert [(c["id"], c["function"]) for c in message["tool_calls"]] == [
        ("chatcmpl-tool-a91e", {"name": "read_file", "arguments": '{"path": "README.md"}'})]
    # without an index (Gemini, Ollama) the same: a new id without a name is the last call's fragment
    indexless = [{"choices": [{"index": 0, "delta": {"tool_calls": [
        {k: v for k, v in f["choices"][0]["delta"]["tool_calls"][0].items() if k != "index"}]}}]} for f in stream]
    assert [(c.id, c.arguments) for c in get_adapter("openai_chat_stream").parse(indexless)] == [
        ("chatcmpl-tool-a91e", '{"path": "README.md"}')]


def test_call_ids_of_the_model_are_never_invented():
    stream = [{"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]}}]}]
    (call,) = get_adapter("openai_chat_stream").parse(stream)
    assert call == ToolCall(id="", name="list_dir", arguments="{}", index=0)  # check_ids refuses the batch


def test_anthropic_and_responses_streams_start_a_new_call_when_an_index_is_reused():
    def block(index, call_id, name):
        return [{"type": "content_block_start", "index": index,
                 "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}},
                {"type": "content_block_delta", "index": index,
                 "delta": {"type": "input_json_delta", "partial_json": '{"path": "."}'}},
                {"type": "content_block_stop", "index": index}]

    calls = get_adapter("anthropic_stream").parse(block(0, "t1", "list_dir") + block(0, "t2", "read_file"))
    assert [(c.id, c.name, c.arguments) for c in calls] == [("t1", "list_dir", '{"path": "."}'),
                                                          ("t2", "read_file", '{"path": "."}')]

    def item(n, item_id, call_id):
        added = {"type": "function_call", "id": item_id, "call_id": call_id, "name": "list_dir", "arguments": ""}
        return [{"type": "response.output_item.added", "output_index": n, "item": added},
                {"type": "response.function_call_arguments.delta", "output_index": n, "item_id": item_id,
                 "delta": '{"path": "."}'}]

    stream = item(0, "fc_1", "c1") + item(0, "fc_2", "c2")
    calls = get_adapter("openai_responses_stream").parse(stream)
    assert [(c.id, c.arguments) for c in calls] == [("c1", '{"path": "."}'), ("c2", '{"path": "."}')]
    items = rebuilt("openai_responses_stream", stream)
    assert [i["call_id"] for i in items] == ["c1", "c2"]


def test_sse_lines_are_read_as_events(tmp_path):
    """A stream saved as the raw server-sent-events body (comments, data: lines, [DONE])."""
    from toolfleet.cli_run import _read_payload

    path = tmp_path / "stream.sse"
    path.write_text(": OPENROUTER PROCESSING\n\nevent: chunk\ndata: {\"a\": 1}\n\ndata: [DONE]\n\n")
    assert _read_payload(path) == [{"a": 1}]


@pytest.mark.parametrize("suffix", [".jsonl", ".sse"])
def test_recorded_events_whose_text_holds_unicode_line_separators_are_read_whole(tmp_path, suffix):
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped (servers writing UTF-8 as
    ``json.dumps(..., ensure_ascii=False)`` or ``JSON.stringify`` do; text copied from web pages and
    PDFs carries them). Lines were split with ``str.splitlines``, which breaks at those too, so a
    recorded stream of such text was refused as "not JSON" and nothing ran. Events are one a line
    as JSON Lines and server-sent events define lines: ending at CR, LF or CRLF only."""
    from toolfleet.cli_run import _read_payload

    text = "para\u2028graph\u2029end \x85 mojibake"
    events = [{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]},
              {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    lines = [json.dumps(e, ensure_ascii=False) for e in events]
    body = "\n".join(lines) + "\n" if suffix == ".jsonl" else "".join(f"data: {line}\r\n\r\n" for line in lines)
    path = tmp_path / f"stream{suffix}"
    path.write_bytes((body + ("" if suffix == ".jsonl" else "data: [DONE]\r\n\r\n")).encode("utf-8"))
    assert _read_payload(path) == events


def test_a_recorded_stream_that_cannot_be_read_is_refused_before_anything_runs(dispatcher, settings, tmp_path):
    """submit_response reads a whole recorded stream first: call_A, complete before the bad event,
    never becomes a turn."""
    import redis

    stream = events("s01_interleaved_fragments.jsonl")
    stream.insert(4, {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": "x"}]})
    with pytest.raises(BatchRejected) as refused:
        dispatcher.submit_response(stream, workspace=str(tmp_path))
    assert refused.value.pointer == "/4/choices/0/delta"
    assert redis.Redis.from_url(settings.redis_url).keys(f"{settings.namespace}:*turn*") == []


def test_responses_stream_whose_summary_lost_a_call_is_rebuilt_from_the_stream():
    """Found by the property run: `response.completed` whose `output` lost the first call (an
    empty item in its place) must not replace the calls the stream carried."""
    from toolfleet.dispatcher.adapters import get_adapter

    def item(n, call_id, name, arguments):
        return {"type": "function_call", "id": f"fc_{n}", "call_id": call_id, "name": name,
                "arguments": arguments, "status": "completed"}

    made = [item(1, "call_a", "read_file", '{"path": "a"}'), item(2, "call_b", "read_file", '{"path": "b"}')]
    events = [{"type": "response.created", "response": {"id": "r", "output": []}}]
    for n, it in enumerate(made):
        events += [{"type": "response.output_item.added", "output_index": n, "item": {**it, "arguments": ""}},
                   {"type": "response.function_call_arguments.done", "item_id": it["id"], "output_index": n,
                    "arguments": it["arguments"]},
                   {"type": "response.output_item.done", "output_index": n, "item": it}]
    events.append({"type": "response.completed", "response": {"id": "r", "output": [{}, made[1]]}})
    adapter = get_adapter("openai_responses_stream")
    assert [c.id for c in adapter.parse(events)] == ["call_a", "call_b"]
    echoed = [i["call_id"] for i in adapter.assistant_messages(events) if i.get("type") == "function_call"]
    assert echoed == ["call_a", "call_b"]


def test_responses_calls_only_the_terminal_response_carries_are_the_calls_of_the_response_whole():
    """A tester's find: ``response.created`` then ``response.completed`` whose ``output`` holds the
    calls, with no ``output_item`` event for them, gave no call and no warning (and rebuilt ``[]``).
    Now they are taken from the terminal response, in output order, after any call the stream
    announced, and answered as the same response non-streamed is."""
    fc = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
          "arguments": '{"path":"README.md"}', "status": "completed"}
    custom = {"type": "custom_tool_call", "id": "ctc_2", "call_id": "call_2", "name": "patch", "input": "x"}
    fc3 = {**fc, "id": "fc_3", "call_id": "call_3", "arguments": {"path": "b"}}  # an object: its JSON text
    final = {"id": "resp_1", "object": "response", "status": "completed",
             "output": [{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": "Reading.", "annotations": []}]},
                        fc, custom, fc3]}
    base = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    only_end = [{"type": "response.created", "response": base}, {"type": "response.completed", "response": final}]
    stream, whole = get_adapter("openai_responses_stream"), get_adapter("openai_responses")
    parser = stream.replay(only_end)
    def same(calls):
        return [(c.id, c.name, parse_arguments(c), c.index) for c in calls]

    assert same(stream.parse(only_end)) == same(whole.parse(final))
    assert [c.id for c in stream.parse(only_end)] == ["call_1", "call_2", "call_3"]
    assert parser.custom == {"call_2"} and parser.cut_off == [] and parser.warnings == []
    assert [i.get("call_id") for i in rebuilt("openai_responses_stream", only_end)] == [None, "call_1", "call_2",
                                                                                        "call_3"]
    # announced and not: the announced call keeps its place, the others follow in output order
    mixed = [only_end[0], {"type": "response.output_item.added", "output_index": 1, "item": {**fc, "arguments": ""}},
             only_end[1]]
    assert [c.id for c in stream.parse(mixed)] == ["call_1", "call_2", "call_3"]
    assert stream.parse(mixed)[0].arguments == fc["arguments"]


def _server_tool_stream(second_fragment: str) -> list[dict]:
    return [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                              "model": "claude-sonnet-4-5", "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {
            "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '{"query": "weather '}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": second_fragment}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {
            "type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": '{"path": "README.md"}'}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}},
        {"type": "message_stop"}]


def test_a_streamed_server_tool_use_keeps_its_input_in_the_history():
    """The API runs server tools (web search) itself; their input streams as input_json_delta like a
    tool_use's, and the history sent back must hold it (the anthropic SDK's accumulator joins it for
    server_tool_use too). Before: ignored with a warning, and sent back as input {}."""
    events = _server_tool_stream('Paris"}')
    adapter = get_adapter("anthropic_stream")
    parser = adapter.replay(events)
    assert parser.warnings == []
    assert [c.id for c in adapter.parse(events)] == ["toolu_1"]  # only the client tool is a call to run
    server, _, tool = rebuilt("anthropic_stream", events)[0]["content"]
    assert server == {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                      "input": {"query": "weather Paris"}}
    assert tool["input"] == {"path": "README.md"}
    cut = _server_tool_stream('Par')  # not JSON when joined: kept as it started, said
    assert rebuilt("anthropic_stream", cut)[0]["content"][0]["input"] == {}
    assert any("not JSON" in w for w in adapter.replay(cut).warnings)


def test_a_responses_response_stored_as_model_dump_goes_back_without_nulls():
    """``Response.model_dump()`` (how responses are often stored) writes null for every unset field;
    the API refuses ``"status": null`` on a reasoning item (openai-python#3008), so no null field goes
    back (found by a helper: toolfleet dropped it from function_call items only)."""
    from openai.types.responses import Response

    response = Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-5", "status": "completed",
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                   {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
                    "arguments": '{"path": "README.md"}'}]})
    items = rebuilt("openai_responses", response.model_dump())
    assert items == [{"id": "rs_1", "summary": [], "type": "reasoning"},
                     {"arguments": '{"path": "README.md"}', "call_id": "call_1", "name": "read_file",
                      "type": "function_call", "id": "fc_1"}]


@pytest.mark.parametrize("choice_index", [None, "missing"])
def test_a_chat_choice_whose_index_is_null_or_missing_is_the_first_choice(choice_index):
    """A tester's find: a chunk whose choice has ``"index": null`` (servers that fill one choice
    send it so) was skipped, its calls lost. Now a null or missing choice index is choice 0, streamed
    as whole; a choice with another index is still not read."""
    def choice(body: dict) -> dict:
        return body if choice_index == "missing" else {"index": choice_index, **body}

    tc = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"a"}'}}
    whole = {"id": "c", "object": "chat.completion", "choices": [
        choice({"finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [tc]}})]}
    chunks = [{"id": "c", "object": "chat.completion.chunk",
               "choices": [choice({"delta": {"role": "assistant", "tool_calls": [{"index": 0, **tc}]}})]},
              {"id": "c", "object": "chat.completion.chunk",
               "choices": [choice({"delta": {}, "finish_reason": "tool_calls"}),
                           {"index": 1, "delta": {"tool_calls": [{"index": 0, **tc, "id": "other"}]}}]}]
    expected = [("call_1", "read_file", '{"path":"a"}')]
    assert [(c.id, c.name, c.arguments) for c in get_adapter("openai_chat").parse(whole)] == expected
    assert [(c.id, c.name, c.arguments) for c in get_adapter("openai_chat_stream").parse(chunks)] == expected
    assert [c["id"] for c in rebuilt("openai_chat_stream", chunks)[0]["tool_calls"]] == ["call_1"]
    assert [c["id"] for c in rebuilt("openai_chat", whole)[0]["tool_calls"]] == ["call_1"]


def test_a_parsed_responses_response_goes_back_without_the_sdks_client_side_fields():
    """``client.responses.parse(...)`` returns a ParsedResponse whose function_call items carry
    ``parsed_arguments`` (and output_text parts ``parsed``), fields the SDK marks ``__api_exclude__``
    and never sends: the API refuses them ("Unknown parameter: 'input[2].parsed_arguments'",
    openai-python#2374). Read as the SDK writes it: those fields are not in what goes back."""
    from openai.lib._parsing._responses import parse_response
    from openai.types.responses import Response
    from pydantic import BaseModel

    class Answer(BaseModel):
        ok: bool

    response = Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-5", "status": "completed",
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": '{"ok": true}', "annotations": []}]},
                   {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
                    "arguments": '{"path": "README.md"}', "status": "completed"}]})
    tools = [{"type": "function", "name": "read_file", "strict": True, "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
        "additionalProperties": False}}]
    parsed = parse_response(text_format=Answer, input_tools=tools, response=response)
    assert parsed.output[1].parsed_arguments == {"path": "README.md"}  # the SDK's own, client-side
    expected = [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": '{"ok": true}', "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
                 "arguments": '{"path": "README.md"}', "status": "completed"}]
    for payload in (parsed, parsed.output):  # the whole response, or its output list
        assert rebuilt("openai_responses", payload) == expected
        assert [c.arguments for c in get_adapter("openai_responses").parse(payload)] == ['{"path": "README.md"}']
    repaired = repair_history([{"role": "user", "content": "read it"}, *parsed.output], "openai_responses")
    assert repaired.messages[1:3] == expected


def test_a_chat_choice_given_for_its_completion_is_read_not_taken_for_a_message_without_calls():
    """``completion.choices[0]`` passed as the payload (``format="chat"``) read as an assistant
    message with no ``tool_calls``: no call, silently, the model's calls never ran. A choice (a
    ``message`` and no ``role``) is read as its message, with its ``finish_reason``."""
    from openai.types.chat import ChatCompletion

    from toolfleet.dispatcher.adapters.cut_off import cut_off_results

    tc = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
    completion = ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 1, "model": "gpt-5", "choices": [
            {"index": 0, "finish_reason": "tool_calls", "logprobs": None,
             "message": {"role": "assistant", "content": None, "tool_calls": [tc]}}]})
    adapter = get_adapter("openai_chat")
    plain = {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                                                                    "tool_calls": [tc]}}
    for choice in (completion.choices[0], plain):
        assert [(c.id, c.arguments) for c in adapter.parse(choice)] == [("call_1", '{"path": "a"}')]
        assert [c["id"] for c in rebuilt("openai_chat", choice)[0]["tool_calls"]] == ["call_1"]
    cut = {**plain, "finish_reason": "length"}
    assert list(cut_off_results("openai_chat", cut, adapter.parse(cut))) == ["call_1"]
    stopped = {**cut, "finish_reason": "content_filter"}
    (result,) = cut_off_results("openai_chat", stopped, adapter.parse(stopped)).values()
    assert result.error.code == ErrorCode.PERMISSION_DENIED
    with pytest.raises(BatchRejected) as refused:
        adapter.parse({"index": 0, "message": {"role": "assistant", "tool_calls": [{**tc, "id": 7}]}})
    assert refused.value.pointer == "/message/tool_calls/0/id"
