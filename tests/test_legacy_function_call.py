"""A Chat message whose call is a ``function_call`` of the deprecated ``functions`` API (no call id;
answered by a ``role: "function"`` message) refuses the batch, reason ``missing_call_id``, streamed
or not: it used to read as no call at all, so the caller was told the model asked for nothing.
``null`` and ``{}`` (SDK dumps, gateways) and a ``function_call`` beside ``tool_calls`` still read
the tool calls. The streamed case runs on a real Redis, with no worker: nothing may run."""

from __future__ import annotations

import pytest
from hypothesis import given

from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.errors import BatchRejected

from . import input_strategies as s

LEGACY = {"name": "read_file", "arguments": '{"path": "a.txt"}'}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}


def completion(**message) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "function_call", "message": {"role": "assistant", "content": None, **message}}]}


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


LEGACY_STREAM = [chunk({"role": "assistant", "content": None, "function_call": {"name": "read_file", "arguments": ""}}),
                 chunk({"function_call": {"arguments": '{"path": "a.txt"}'}}), chunk({}, "function_call")]


@pytest.mark.parametrize("read", ["parse", "assistant_messages"])
def test_a_legacy_function_call_refuses_the_batch_naming_where_it_is(read):
    with pytest.raises(BatchRejected) as refused:
        getattr(get_adapter("openai_chat"), read)(completion(function_call=LEGACY))
    assert refused.value.reason == "missing_call_id"
    assert refused.value.pointer == "/choices/0/message/function_call"
    assert "deprecated functions API" in str(refused.value) and "tools" in str(refused.value)


def test_a_streamed_legacy_function_call_refuses_at_its_first_fragment():
    with pytest.raises(BatchRejected) as refused:
        get_adapter("openai_chat_stream").parse(LEGACY_STREAM)
    assert refused.value.reason == "missing_call_id" and refused.value.pointer == "/0/choices/0/delta/function_call"


@pytest.mark.parametrize("absent", [None, {}, {"name": None, "arguments": None}, {"name": "", "arguments": ""}])
def test_no_function_call_null_or_empty_reads_the_tool_calls(absent):
    adapter = get_adapter("openai_chat")
    assert adapter.parse(completion(function_call=absent)) == []
    assert [c.id for c in adapter.parse(completion(function_call=absent, tool_calls=[TOOL_CALL]))] == ["c1"]


def test_a_function_call_beside_tool_calls_reads_the_tool_calls():
    """Some gateways mirror the first tool call in ``function_call``: the tool calls are the calls."""
    assert [c.id for c in get_adapter("openai_chat").parse(completion(function_call=LEGACY, tool_calls=[TOOL_CALL]))] \
        == ["c1"]
    streamed = [chunk({"tool_calls": [{"index": 0, **TOOL_CALL}]}), chunk({"function_call": LEGACY}),
                chunk({}, "tool_calls")]
    assert [c.id for c in get_adapter("openai_chat_stream").parse(streamed)] == ["c1"]


@given(function_call=s.GARBAGE)
def test_any_function_call_value_reads_or_refuses_never_crashes(function_call):
    try:
        assert get_adapter("openai_chat").parse(completion(function_call=function_call)) == []
    except BatchRejected as refused:
        assert refused.reason == "missing_call_id"


@pytest.fixture
def settings(settings):
    """No worker: a call taken would stay queued, not fail at once."""
    return settings.model_copy(update={"require_live_worker": False})


def test_a_legacy_stream_submitted_takes_no_call_and_is_refused(dispatcher, workspace):
    stream = dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace))
    with pytest.raises(BatchRejected) as refused:
        for event in LEGACY_STREAM:
            stream.feed(event)
    assert refused.value.reason == "missing_call_id"
    assert stream.turn is None or (stream.turn.closed and stream.turn.results(10) == [])
