"""A call whose arguments Python cannot read (nested past its recursion limit) is that call's own
``INVALID_ARGUMENT`` on the dispatcher's real path (``submit_response`` and ``open_stream``), with
a real worker running the batch's other call: the batch is not sunk and every call id the
assistant message carries gets exactly one result (found by a helper trying to break the adapters:
``submit_response`` raised RecursionError, and a stream's ``feed`` did too, leaving the deep call
without a result, which the next Chat request is refused for)."""

from __future__ import annotations

import pytest

from toolfleet.models import ErrorCode

DEEP_TEXT = '{"path": "README.md", "x": ' + "[" * 5000 + "]" * 5000 + "}"


def _nested_object(depth: int) -> dict:
    leaf: object = 1
    for _ in range(depth):
        leaf = {"a": leaf}
    return {"path": "README.md", "x": leaf}


def _chat(arguments: str) -> dict:
    return {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call_ok", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}},
            {"id": "call_deep", "type": "function", "function": {"name": "read_file", "arguments": arguments}}]}}]}


def _chunk(tool_calls=None, finish=None) -> dict:
    return {"id": "s", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"tool_calls": tool_calls} if tool_calls else {},
                         "finish_reason": finish}]}


def _check(turn) -> None:
    by_id = {r.call_id: r for r in turn.results(timeout_s=60)}
    assert by_id["call_ok"].status == "ok", by_id["call_ok"]
    deep = by_id["call_deep"]
    assert deep.code == ErrorCode.INVALID_ARGUMENT and "nested" in deep.content and deep.attempts == 0
    asked = [c["id"] for m in turn.assistant_messages() for c in m.get("tool_calls") or []]
    assert [m["tool_call_id"] for m in turn.messages()] == asked == ["call_ok", "call_deep"]


def test_a_call_nested_past_the_recursion_limit_is_its_own_invalid_argument(worker, dispatcher, workspace):
    _check(dispatcher.submit_response(_chat(DEEP_TEXT), workspace=str(workspace)))


def test_an_anthropic_input_object_nested_past_the_recursion_limit_is_its_own_invalid_argument(
        worker, dispatcher, workspace):
    payload = {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "call_ok", "name": "list_dir", "input": {"path": "."}},
        {"type": "tool_use", "id": "call_deep", "name": "read_file", "input": _nested_object(3000)}]}
    turn = dispatcher.submit_response(payload, workspace=str(workspace))
    by_id = {r.call_id: r for r in turn.results(timeout_s=60)}
    assert by_id["call_ok"].status == "ok" and by_id["call_deep"].code == ErrorCode.INVALID_ARGUMENT
    (answer,) = turn.messages()
    assert [b["tool_use_id"] for b in answer["content"]] == ["call_ok", "call_deep"]


def test_a_streamed_call_nested_past_the_recursion_limit_is_its_own_invalid_argument(worker, dispatcher, workspace):
    stream = dispatcher.open_stream(workspace=str(workspace))
    stream.feed(_chunk([{"index": 0, "id": "call_ok", "type": "function",
                         "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]))
    stream.feed(_chunk([{"index": 1, "id": "call_deep", "type": "function",
                         "function": {"name": "read_file", "arguments": DEEP_TEXT}}]))
    stream.feed(_chunk(finish="tool_calls"))
    _check(stream.close())


def _cut_anthropic() -> dict:
    return {"role": "assistant", "stop_reason": "max_tokens", "content": [
        {"type": "tool_use", "id": "call_ok", "name": "list_dir", "input": {"path": "."}},
        {"type": "tool_use", "id": "call_cut", "name": "grep", "input": {"pattern": "TODO"}}]}


def test_calls_cut_off_at_the_token_limit_do_not_run(worker, dispatcher, workspace):
    """A response stopped at its output token limit returns the call being written closed with the
    fields written so far: here a grep whose path was cut, which would search the whole workspace.
    The last call of such a response is INVALID_ARGUMENT, unrun; the calls before it run."""
    turn = dispatcher.submit_response(_cut_anthropic(), workspace=str(workspace))
    by_id = {r.call_id: r for r in turn.results(timeout_s=60)}
    assert by_id["call_ok"].ok
    cut = by_id["call_cut"]
    assert cut.code is ErrorCode.INVALID_ARGUMENT and "output token limit" in cut.content and cut.attempts == 0, cut
    (answer,) = turn.messages()
    assert [b["tool_use_id"] for b in answer["content"]] == ["call_ok", "call_cut"]


@pytest.mark.parametrize("format, payload, cut", [
    ("anthropic", _cut_anthropic(), ["call_cut"]),
    ("anthropic", {**_cut_anthropic(), "stop_reason": "tool_use"}, []),
    ("anthropic", {**_cut_anthropic(), "stop_reason": "model_context_window_exceeded"}, ["call_cut"]),
    ("anthropic", {**_cut_anthropic(), "content": [*_cut_anthropic()["content"], {"type": "text", "text": "x"}]},
     []),  # text after the last call: that call was finished
    ("openai_chat", {"choices": [{"finish_reason": "length", "message": {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}}]}}]}, ["b"]),
    ("openai_chat", {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]}}]}, []),
    ("openai_responses", {"status": "incomplete", "output": [
        {"type": "function_call", "call_id": "a", "name": "list_dir", "arguments": "{}", "status": "completed"},
        {"type": "function_call", "call_id": "b", "name": "grep", "arguments": '{"pattern": "x"}'}]}, ["b"]),
    ("openai_responses", {"status": "completed", "output": [
        {"type": "function_call", "call_id": "a", "name": "list_dir", "arguments": "{}", "status": "incomplete"},
        {"type": "function_call", "call_id": "b", "name": "grep", "arguments": "{}", "status": "completed"}]}, ["a"]),
    ("openai_responses", {"status": "incomplete", "output": [
        {"type": "function_call", "call_id": "a", "name": "list_dir", "arguments": "{}", "status": "completed"},
        {"type": "message", "role": "assistant", "content": []}]}, []),
    # incomplete for content_filter: not the token limit, a safety stop (tests/test_safety_stops.py)
    ("openai_responses", {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": [
        {"type": "function_call", "call_id": "b", "name": "grep", "arguments": '{"pattern": "x"}'}]}, ["b"]),
])
def test_which_calls_the_token_limit_cut_off(format, payload, cut):
    from toolfleet.dispatcher.adapters import get_adapter
    from toolfleet.dispatcher.adapters.cut_off import cut_off_results

    results = cut_off_results(format, payload, get_adapter(format).parse(payload))
    assert list(results) == cut
    assert all(r.code is ErrorCode.INVALID_ARGUMENT for r in results.values())


def test_a_failed_result_given_under_another_id_still_answers_its_call(worker, dispatcher, workspace):
    """``submit(failed=...)``: the result is the call's whatever id it carries (a reviewer's case:
    one under another id left the call without a result and ``results()`` waiting for ever)."""
    from toolfleet.models import ToolCall, ToolResult

    calls = [ToolCall(id="a", name="list_dir", arguments='{"path": "."}', index=0),
             ToolCall(id="b", name="list_dir", arguments='{"path": "."}', index=1)]
    wrong = ToolResult.failure("b", "other", ErrorCode.INVALID_ARGUMENT, "decided by the caller", "")
    by_id = {r.call_id: r for r in dispatcher.submit(calls, failed={"a": wrong, "zzz": wrong},
                                                     workspace=str(workspace)).results(timeout_s=60)}
    assert by_id["a"].code is ErrorCode.INVALID_ARGUMENT and by_id["a"].name == "list_dir"
    assert by_id["b"].ok


# The same cut, streamed: the stream itself says so as the call completes (a tester's find: the
# Chat call completed by finish_reason "length", and the Responses item done with status
# "incomplete", ran with {} streamed, while the same responses whole got INVALID_ARGUMENT).
_OK_FRAGMENT = {"index": 0, "id": "call_ok", "type": "function",
                "function": {"name": "list_dir", "arguments": '{"path": "."}'}}
_CUT_FRAGMENT = {"index": 1, "id": "call_cut", "type": "function", "function": {"name": "list_dir", "arguments": ""}}
CHAT_CUT_STREAM = [_chunk([_OK_FRAGMENT]), _chunk([_CUT_FRAGMENT]), _chunk(finish="length")]
_FC_OK = {"type": "function_call", "id": "fc_ok", "call_id": "call_ok", "name": "list_dir",
          "arguments": '{"path": "."}', "status": "completed"}
_FC_CUT = {"type": "function_call", "id": "fc_cut", "call_id": "call_cut", "name": "list_dir", "arguments": "",
           "status": "incomplete"}
_CUT_RESPONSE = {"id": "resp_cut", "object": "response", "status": "incomplete",
                 "incomplete_details": {"reason": "max_output_tokens"}, "output": [_FC_OK, _FC_CUT]}


def _responses_cut_stream(item_done: bool) -> list[dict]:
    """call_ok whole; call_cut opened, then (``item_done``) done with status incomplete, or left open
    until the response.incomplete that carries it last, not marked completed."""
    events = [{"type": "response.created", "response": {**_CUT_RESPONSE, "status": "in_progress", "output": []}}]
    for n, item in enumerate([_FC_OK, _FC_CUT]):
        events.append({"type": "response.output_item.added", "output_index": n,
                       "item": {**item, "arguments": "", "status": "in_progress"}})
        if item is _FC_OK or item_done:
            events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    final = _CUT_RESPONSE if item_done else {**_CUT_RESPONSE, "output": [_FC_OK, {**_FC_CUT, "status": None}]}
    return [*events, {"type": "response.incomplete", "response": final}]


CUT_STREAMS = [("openai_chat_stream", CHAT_CUT_STREAM), ("openai_responses_stream", _responses_cut_stream(True)),
               ("openai_responses_stream", _responses_cut_stream(False))]


@pytest.mark.parametrize("format, events", CUT_STREAMS)
def test_a_streamed_call_cut_off_is_cut_off_as_the_same_response_whole(format, events):
    """The parser's ``cut_off`` names what :func:`cut_off_results` names in the response the stream
    adds up to, and names it by the event that completes the call (not only at the stream's end)."""
    from toolfleet.dispatcher.adapters import get_adapter
    from toolfleet.dispatcher.adapters.cut_off import cut_off_results

    parser = get_adapter(format).parser()
    released = []
    for event in events:
        for call in parser.feed(event):
            released.append(call.id)
            assert (call.id in parser.cut_off) == (call.id == "call_cut"), "cut off as it is released"
    assert released == ["call_ok", "call_cut"] and parser.finish() == []
    whole = format.removesuffix("_stream")
    calls = get_adapter(whole).parse(parser.response())
    assert parser.cut_off == list(cut_off_results(whole, parser.response(), calls)) == ["call_cut"]


@pytest.mark.parametrize("format, events", CUT_STREAMS)
def test_a_streamed_call_cut_off_at_the_token_limit_does_not_run(format, events, worker, dispatcher, workspace):
    turn = dispatcher.submit_response(events, workspace=str(workspace))
    by_id = {r.call_id: r for r in turn.results(timeout_s=60)}
    assert by_id["call_ok"].ok, by_id["call_ok"]
    cut = by_id["call_cut"]
    assert cut.code is ErrorCode.INVALID_ARGUMENT and "output token limit" in cut.content and cut.attempts == 0, cut
    answered = [m.get("tool_call_id") or m.get("call_id") for m in turn.messages()]
    assert answered == ["call_ok", "call_cut"]
    with dispatcher.open_stream(workspace=str(workspace)) as stream:  # fed event by event: the same answer
        for event in events:
            stream.feed(event)
    by_id = {r.call_id: r for r in stream.turn.results(timeout_s=60)}
    assert by_id["call_ok"].ok and by_id["call_cut"].code is ErrorCode.INVALID_ARGUMENT, by_id
