"""A response the provider's safety system stopped runs none of its calls: each gets
``PERMISSION_DENIED`` saying so, and every call id still gets its one result in the provider's
shape. Anthropic ``stop_reason: "refusal"`` (a streaming classifier intervened; its docs ask to
reset the conversation), Chat ``finish_reason: "content_filter"``, Responses ``incomplete`` for
``content_filter``. Before, their calls ran as any (a write the filter had flagged landed). Real
Redis and a real prefork worker; the write the calls ask for must not happen."""

from __future__ import annotations

import json

import pytest

from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.adapters.cut_off import cut_off_results
from toolfleet.models import ErrorCode

WRITE = {"path": "flagged.txt", "content": "x"}
READ = {"path": "."}


def anthropic(stop_reason: str) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "stop_reason": stop_reason,
            "content": [{"type": "text", "text": "Sure"},
                        {"type": "tool_use", "id": "toolu_r", "name": "list_dir", "input": READ},
                        {"type": "tool_use", "id": "toolu_w", "name": "write_file", "input": WRITE}]}


def chat(finish_reason: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": finish_reason,
            "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_r", "type": "function", "function": {"name": "list_dir", "arguments": json.dumps(READ)}},
                {"id": "call_w", "type": "function",
                 "function": {"name": "write_file", "arguments": json.dumps(WRITE)}}]}}]}


def responses(reason: str | None) -> dict:
    return {"id": "resp_1", "object": "response", "status": "incomplete" if reason else "completed",
            "incomplete_details": {"reason": reason} if reason else None, "output": [
                {"type": "function_call", "id": "fc_r", "call_id": "call_r", "name": "list_dir",
                 "arguments": json.dumps(READ), "status": "completed"},
                {"type": "function_call", "id": "fc_w", "call_id": "call_w", "name": "write_file",
                 "arguments": json.dumps(WRITE), "status": "completed"}]}


STOPPED = [("anthropic", anthropic("refusal")), ("openai_chat", chat("content_filter")),
           ("openai_responses", responses("content_filter"))]


@pytest.mark.parametrize("format, payload", STOPPED + [
    ("anthropic", anthropic("tool_use")), ("openai_chat", chat("tool_calls")), ("openai_responses", responses(None))])
def test_which_responses_a_safety_system_stopped(format, payload):
    results = cut_off_results(format, payload, get_adapter(format).parse(payload))
    stopped = (format, payload) in STOPPED
    assert len(results) == (2 if stopped else 0)
    assert all(r.code is ErrorCode.PERMISSION_DENIED and "safety system" in r.content for r in results.values())


@pytest.mark.parametrize("format, payload", STOPPED, ids=[f for f, _ in STOPPED])
def test_no_call_of_a_stopped_response_runs_and_each_is_answered(format, payload, worker, dispatcher, workspace):
    turn = dispatcher.submit_response(payload, workspace=str(workspace))
    results = turn.results(timeout_s=60)
    assert {r.code for r in results} == {ErrorCode.PERMISSION_DENIED} and all(r.attempts == 0 for r in results)
    assert not (workspace / "flagged.txt").exists()
    messages = turn.messages()
    ids = [b["tool_use_id"] for m in messages for b in m["content"]] if format == "anthropic" else \
        [m.get("tool_call_id") or m.get("call_id") for m in messages]
    assert len(ids) == 2 and len(set(ids)) == 2


def _chunk(tool_calls=None, finish=None) -> dict:
    return {"id": "s", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"tool_calls": tool_calls} if tool_calls else {},
                         "finish_reason": finish}]}


CHAT_STREAM = [_chunk([{"index": 0, "id": "call_w", "type": "function",
                        "function": {"name": "write_file", "arguments": '{"path": "flagged.txt"'}}]),
               _chunk(finish="content_filter")]
_OPEN = {"type": "function_call", "id": "fc_w", "call_id": "call_w", "name": "write_file", "arguments": ""}
RESPONSES_STREAM = [
    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}},
    {"type": "response.output_item.added", "output_index": 0, "item": {**_OPEN, "status": "in_progress"}},
    {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_w",
     "delta": json.dumps(WRITE)},
    {"type": "response.incomplete", "response": {**responses("content_filter"), "output": [
        {**_OPEN, "arguments": json.dumps(WRITE), "status": None}]}}]


@pytest.mark.parametrize("format, events", [("openai_chat_stream", CHAT_STREAM),
                                            ("openai_responses_stream", RESPONSES_STREAM)])
def test_a_call_still_open_when_a_stream_says_it_was_stopped_does_not_run(format, events, worker, dispatcher,
                                                                          workspace):
    parser = get_adapter(format).parser()
    released = [c.id for e in events for c in parser.feed(e)] + [c.id for c in parser.finish()]
    assert released == ["call_w"] and parser.cut_off == ["call_w"]
    turn = dispatcher.submit_response(events, workspace=str(workspace))
    (result,) = turn.results(timeout_s=60)
    assert result.code is ErrorCode.PERMISSION_DENIED and "safety system" in result.content, result
    assert not (workspace / "flagged.txt").exists()
