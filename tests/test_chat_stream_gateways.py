"""Chat Completions streams as gateways send them (toolfleet/dispatcher/adapters/openai_chat_stream.py),
as a breaker found them: ``{}`` first and then the real arguments (Bedrock behind some gateways,
openai/openai-agents-js#712) ran the call with ``{}``; without ``index``, a second call with no id or
the first call's id was dropped silently (with an index, or whole, it is refused)."""

from __future__ import annotations

import pytest

from toolfleet import BatchRejected
from toolfleet.dispatcher.adapters import get_adapter


def chunk(fragments=None, finish=None, index_of_choice=0) -> dict:
    delta = {"tool_calls": fragments} if fragments else {}
    return {"object": "chat.completion.chunk", "choices": [{"index": index_of_choice, "delta": delta,
                                                            "finish_reason": finish}]}


def frag(arguments: str, call_id: str | None = None, name: str | None = None, index: int | None = 0) -> dict:
    out: dict = {"function": {"arguments": arguments}}
    if index is not None:
        out["index"] = index
    if call_id is not None:
        out.update(id=call_id, type="function")
    if name is not None:
        out["function"]["name"] = name
    return out


def released(events: list[dict]) -> list[tuple[int, list]]:
    """(event number, calls it released as (id, name, arguments)), then the stream's end as -1."""
    parser = get_adapter("openai_chat_stream").parser()
    out = []
    for n, event in enumerate(events):
        calls = parser.feed(event)
        if calls:
            out.append((n, [(c.id, c.name, c.arguments) for c in calls]))
    calls = parser.finish()
    if calls:
        out.append((-1, [(c.id, c.name, c.arguments) for c in calls]))
    return out


@pytest.mark.parametrize("index", [0, None])
def test_empty_arguments_then_the_real_ones_are_read_as_the_real_ones(index):
    events = [chunk([frag("{}", "call_1", "list_dir", index)]),
              chunk([frag('{"path": "docs"}', index=index)]),
              chunk(finish="tool_calls")]
    assert released(events) == [(1, [("call_1", "list_dir", '{"path": "docs"}')])]


def test_empty_arguments_complete_at_the_next_event_without_text_for_the_call():
    events = [chunk([frag("{}", "call_1", "list_dir")]),
              chunk([frag('{"path": "a"}', "call_2", "read_file", 1)]),  # another call: call_1 is done
              chunk(finish="tool_calls")]
    assert released(events) == [(1, [("call_1", "list_dir", "{}"), ("call_2", "read_file", '{"path": "a"}')])]
    assert released([chunk([frag("{}", "c", "list_dir")]), chunk(finish="tool_calls")]) == \
        [(1, [("c", "list_dir", "{}")])]
    assert released([chunk([frag("{}", "c", "list_dir")])]) == [(-1, [("c", "list_dir", "{}")])]


def test_empty_arguments_through_a_worker_run_with_the_real_ones(dispatcher, worker, workspace):
    events = [chunk([frag("{}", "call_1", "list_dir")]), chunk([frag('{"path": "src"}')]),
              chunk(finish="tool_calls")]
    with dispatcher.open_stream(workspace=str(workspace)) as stream:
        for event in events:
            stream.feed(event)
    [result] = stream.turn.results(60)
    listing = sorted(p.name for p in (workspace / "src").iterdir())
    assert result.ok and all(name in result.content for name in listing), result.content
    [message] = stream.turn.assistant_messages()
    assert message["tool_calls"][0]["function"]["arguments"] == '{"path": "src"}'


@pytest.mark.parametrize("second_id", [None, "call_1"], ids=["no id", "the first call's id"])
def test_without_index_a_second_call_is_refused_not_dropped(second_id):
    events = [chunk([frag("{}", "call_1", "list_dir", None)]),
              chunk([frag('{"path": "README.md"}', second_id, "read_file", None)]),
              chunk(finish="stop")]
    with pytest.raises(BatchRejected) as refused:
        calls = [c for _, batch in released(events) for c in batch]
        from toolfleet.dispatcher.turn_intake import check_ids
        from toolfleet.models import ToolCall

        check_ids([ToolCall(id=i, name=n, arguments=a) for i, n, a in calls])
    assert refused.value.reason == ("missing_call_id" if second_id is None else "duplicate_call_id")


@pytest.mark.parametrize("second_id", [None, "call_1"], ids=["no id", "the first call's id"])
def test_without_index_a_second_call_refuses_the_stream_as_with_an_index(dispatcher, second_id):
    """Through a turn: the same refusal as the indexed stream and the whole response give."""
    for index in (None, 1):
        events = [chunk([frag('{"path": "a"}', "call_1", "read_file", None if index is None else 0)]),
                  chunk([frag('{"path": "README.md"}', second_id, "read_file", index)]),
                  chunk(finish="stop")]
        with pytest.raises(BatchRejected) as refused:
            with dispatcher.open_stream() as stream:
                for event in events:
                    stream.feed(event)
        assert refused.value.reason == ("missing_call_id" if second_id is None else "duplicate_call_id"), index
        assert [r.call_id for r in stream.turn.results(30)] == ["call_1"]  # taken before: answered, nothing lost


def test_without_index_fragments_that_repeat_the_header_still_continue_the_call():
    """A server repeating id and name on every fragment, without index, is one call (LiteLLM-like)."""
    events = [chunk([frag('{"path":', "call_1", "read_file", None)]),
              chunk([frag(' "README.md"}', "call_1", "read_file", None)]),
              chunk([frag("", "call_1", "read_file", None)]),  # the header again, no text
              chunk(finish="tool_calls")]
    assert released(events) == [(1, [("call_1", "read_file", '{"path": "README.md"}')])]


def test_without_index_a_call_sent_again_whole_is_one_call():
    events = [chunk([frag('{"path": "a"}', "call_1", "read_file", None)]),
              chunk([frag('{"path": "a"}', "call_1", "read_file", None)]),  # the same call again, whole
              chunk(finish="tool_calls")]
    assert released(events) == [(0, [("call_1", "read_file", '{"path": "a"}')])]
