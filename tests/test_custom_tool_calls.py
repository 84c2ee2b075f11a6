"""Custom tool calls (free-form input: Chat ``type: "custom"``, Responses ``custom_tool_call``) are
not run (toolfleet runs function tools), but each gets its one result, UNKNOWN_TOOL, in the shape
its kind is answered with, so the next request is accepted. Found by a helper: Responses skipped
the item (no call, no result: the API refuses the next request), Chat read it as a function call
with no name and put back a made-up ``function`` beside ``custom``."""

from __future__ import annotations

from toolfleet import ErrorCode
from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.history import repair_history

from .sdk_types import check_messages
from .test_cases_gateway_streams import without_extensions

RESPONSE = {"id": "resp_1", "object": "response", "status": "completed", "output": [
    {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "function_call", "id": "fc_1", "call_id": "call_f", "name": "list_dir", "arguments": '{"path": "."}'}]}
CHAT = {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": None, "tool_calls": [
        {"id": "call_c", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}},
        {"id": "call_f", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]}}]}


def _run(dispatcher, workspace, payload):
    turn = dispatcher.submit_response(payload, workspace=str(workspace))
    by_id = {r.call_id: r for r in turn.results(timeout_s=60)}
    custom = by_id["call_c"]
    assert custom.code is ErrorCode.UNKNOWN_TOOL and "custom tool" in custom.content and custom.attempts == 0
    assert by_id["call_f"].ok, by_id["call_f"]
    return turn.assistant_messages(), turn.messages()


def test_a_responses_custom_tool_call_is_answered_with_its_own_output_type(worker, dispatcher, workspace):
    assistant, messages = _run(dispatcher, workspace, RESPONSE)
    assert [(m["type"], m["call_id"]) for m in messages] == [("custom_tool_call_output", "call_c"),
                                                             ("function_call_output", "call_f")]
    assert assistant[0] == RESPONSE["output"][0]
    check_messages("openai_responses", without_extensions(assistant) + messages)
    assert repair_history(assistant + messages, "openai_responses").repairs == []
    unanswered = repair_history(assistant + messages[1:], "openai_responses")
    assert [r.kind for r in unanswered.repairs] == ["missing_result"]
    assert unanswered.messages[1]["type"] == "custom_tool_call_output"


def test_a_chat_custom_tool_call_goes_back_as_it_came_and_is_answered(worker, dispatcher, workspace):
    assistant, messages = _run(dispatcher, workspace, CHAT)
    assert assistant[0]["tool_calls"][0] == CHAT["choices"][0]["message"]["tool_calls"][0]  # no function added
    assert [m["tool_call_id"] for m in messages] == ["call_c", "call_f"]
    check_messages("openai_chat", without_extensions(assistant) + messages)


def test_custom_calls_are_parsed_in_model_order():
    assert [(c.id, c.name) for c in get_adapter("openai_responses").parse(RESPONSE)] == [
        ("call_c", "apply_patch"), ("call_f", "list_dir")]
    assert [(c.id, c.name) for c in get_adapter("openai_chat").parse(CHAT)] == [
        ("call_c", "apply_patch"), ("call_f", "list_dir")]


def test_a_streamed_custom_tool_call_is_answered_with_its_own_output_type(worker, dispatcher, workspace):
    custom, function = RESPONSE["output"]
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "object": "response", "status": "in_progress",
                                                  "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**custom, "input": ""}},
        {"type": "response.custom_tool_call_input.delta", "output_index": 0, "item_id": "ctc_1", "delta": "*** "},
        {"type": "response.output_item.done", "output_index": 0, "item": custom},
        {"type": "response.output_item.added", "output_index": 1, "item": {**function, "arguments": ""}},
        {"type": "response.function_call_arguments.done", "output_index": 1, "item_id": "fc_1",
         "arguments": function["arguments"]},
        {"type": "response.output_item.done", "output_index": 1, "item": function},
        {"type": "response.completed", "response": {**RESPONSE}}]
    assistant, messages = _run(dispatcher, workspace, events)
    assert [(m["type"], m["call_id"]) for m in messages] == [("custom_tool_call_output", "call_c"),
                                                             ("function_call_output", "call_f")]
    assert [i["type"] for i in assistant] == ["custom_tool_call", "function_call"]
    check_messages("openai_responses", without_extensions(assistant) + messages)


def test_an_adapter_written_before_format_results_took_the_response_still_works(worker, dispatcher, workspace):
    """A user's own adapter with ``format_results(self, results)`` (the protocol before ``response``)."""
    chat = get_adapter("openai_chat")

    class OldAdapter:
        name = "old"
        streamed = False

        def parse(self, payload):
            return chat.parse(payload)

        def assistant_messages(self, payload):
            return chat.assistant_messages(payload)

        def format_results(self, results):
            return [{"id": r.call_id, "text": r.content} for r in results]

        def tools(self, source):
            return []

    payload = {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]}
    turn = dispatcher.submit(chat.parse(payload), adapter=OldAdapter(), response=payload, workspace=str(workspace))
    assert [m["id"] for m in turn.messages(timeout_s=60)] == ["a"]


def _chat_chunk(tool_calls=None, finish=None) -> dict:
    return {"id": "s", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"tool_calls": tool_calls} if tool_calls else {}, "finish_reason": finish}]}


def test_a_streamed_chat_custom_tool_call_is_joined_and_answered(worker, dispatcher, workspace):
    """A reviewer's case: the Chat stream read a custom call as a function call with no name, kept
    only the last input fragment and added a function beside custom."""
    events = [
        _chat_chunk([{"index": 0, "id": "call_c", "type": "custom", "custom": {"name": "apply_patch", "input": ""}}]),
        _chat_chunk([{"index": 0, "custom": {"input": "*** Begin"}}]),
        _chat_chunk([{"index": 0, "custom": {"input": " Patch"}}]),
        _chat_chunk([{"index": 1, "id": "call_f", "type": "function",
                      "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]),
        _chat_chunk(finish="tool_calls")]
    assistant, messages = _run(dispatcher, workspace, events)
    assert assistant[0]["tool_calls"][0] == CHAT["choices"][0]["message"]["tool_calls"][0]
    assert [m["tool_call_id"] for m in messages] == ["call_c", "call_f"]
    check_messages("openai_chat", without_extensions(assistant) + messages)


def test_a_streamed_responses_custom_call_cut_off_still_gets_its_answer(worker, dispatcher, workspace):
    custom = RESPONSE["output"][0]
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "object": "response", "status": "in_progress",
                                                  "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**custom, "input": ""}}]
    turn = dispatcher.submit_response(events, workspace=str(workspace))
    [result] = turn.results(timeout_s=60)
    assert result.call_id == "call_c" and result.code in (ErrorCode.UNKNOWN_TOOL, ErrorCode.INVALID_ARGUMENT)
    assert [(m["type"], m["call_id"]) for m in turn.messages()] == [("custom_tool_call_output", "call_c")]
