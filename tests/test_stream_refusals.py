"""A stream refused at an event that completed several calls (a repeated id, an id that is no call
id, a computer_call): every call the rebuilt assistant message lists has its result, so the next
request pairs (a note's find, then a breaker's: the others of the event got no result, and the
refused calls stayed in the message). Real Redis, no worker: nothing here runs."""

from __future__ import annotations

import pytest

from toolfleet import ErrorCode, repair_history
from toolfleet.errors import BatchRejected


@pytest.fixture
def settings(settings):
    """No worker: calls stay queued rather than failing TOOL_UNAVAILABLE at once."""
    return settings.model_copy(update={"require_live_worker": False})


def _chat_call(index: int, call_id: str | None, arguments: str = '{"label": "x"}') -> dict:
    call = {"index": index, "type": "function", "function": {"name": "wait_read", "arguments": arguments}}
    return call if call_id is None else {**call, "id": call_id}


def _chat(ids: list[str | None]) -> list[dict]:
    before = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
        _chat_call(0, "before", '{"label": "w", "seconds": 30}')]}, "finish_reason": None}]}
    calls = [_chat_call(i + 1, call_id) for i, call_id in enumerate(ids)] + [_chat_call(len(ids) + 1, "open", "{")]
    return [before, {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": calls},
                                                                     "finish_reason": None}]}]


def _anthropic_duplicate() -> list[dict]:
    def start(index: int, call_id: str) -> dict:
        return {"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": call_id, "name": "wait_read", "input": {}}}
    return [{"type": "message_start", "message": {"id": "m", "role": "assistant", "content": [], "model": "x"}},
            start(0, "toolu_a"), start(1, "toolu_b"), start(2, "toolu_a"),
            {"type": "content_block_stop", "index": 2}, {"type": "content_block_stop", "index": 1},
            {"type": "content_block_stop", "index": 0}]


def _function_call(call_id: str, n: int) -> dict:
    return {"type": "function_call", "id": f"fc_{n}", "call_id": call_id, "name": "wait_read",
            "arguments": '{"label": "x"}', "status": "completed"}


def _responses(output: list[dict]) -> list[dict]:
    return [{"type": "response.created", "response": {"id": "r", "output": []}},
            {"type": "response.completed", "response": {"id": "r", "object": "response", "status": "completed",
                                                        "output": output}}]


COMPUTER = {"type": "computer_call", "id": "cu_1", "call_id": "c", "action": {"type": "screenshot"},
            "status": "completed", "pending_safety_checks": []}
SHELL = {"type": "shell_call", "id": "sh_1", "call_id": "s", "action": {"commands": ["ls"]}, "status": "completed"}

def _items_done_backwards() -> list[dict]:
    """Three function calls (ids a, b, a) and a shell call announced, then done last to first."""
    items = [_function_call("a", 0), _function_call("b", 1), _function_call("a", 2)]
    shell = {**SHELL, "status": "in_progress"}
    events = [{"type": "response.created", "response": {"id": "r", "output": []}}]
    events += [{"type": "response.output_item.added", "output_index": n,
                "item": {**item, "arguments": "", "status": "in_progress"}} for n, item in enumerate(items)]
    events.append({"type": "response.output_item.added", "output_index": 3, "item": shell})
    return events + [{"type": "response.output_item.done", "output_index": n, "item": items[n]} for n in (2, 1, 0)]


CASES = {
    "chat, an id repeated in the event": ("openai_chat_stream", _chat(["p", "other", "p"]),
                                          {"before", "p", "other", "open"}),
    "chat, no call id": ("openai_chat_stream", _chat(["p", "other", "q\x00", None]), {"before", "p", "other", "open"}),
    # the error names the bad id escaped ('a\\ud800'), which is the good call's id
    "chat, a bad id escaped is a good one": ("openai_chat_stream", _chat(["a\ud800", "a\\ud800"]),
                                              {"before", "a\\ud800", "open"}),
    "anthropic, an id repeated": ("anthropic_stream", _anthropic_duplicate(), {"toolu_a", "toolu_b"}),
    "responses, an id repeated": ("openai_responses_stream", _items_done_backwards(), {"a", "b", "s"}),
    # the terminal response's second item of call id a was taken as the first again: it ran once
    # and was dropped from the message, where the whole response is refused for the repeated id
    "responses, an id repeated in the terminal response": (
        "openai_responses_stream", _responses([_function_call("a", 0), _function_call("b", 1), _function_call("a", 2)]),
        {"a", "b"}),
    "responses, a computer_call": ("openai_responses_stream", _responses([_function_call("a", 0), SHELL, COMPUTER]),
                                   {"a", "s"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_stream_leaves_every_listed_call_answered(dispatcher, workspace, case):
    format, events, answered = CASES[case]
    stream = dispatcher.open_stream(format=format, workspace=str(workspace))
    with pytest.raises(BatchRejected):
        for event in events:
            stream.feed(event)
    turn = stream.turn
    assert turn.closed and turn.cancelled
    results = turn.results(30)
    assert {r.call_id for r in results} == answered
    assert {r.code for r in results} == {ErrorCode.NOT_EXECUTED}
    history = turn.assistant_messages() + turn.messages(30)
    repaired = repair_history(history, format.removesuffix("_stream"))
    assert repaired.ok, repaired.repairs  # every call listed has its result, and no result is without its call


def test_a_terminal_response_with_new_item_ids_names_the_same_calls():
    """The other side of the repeated-id case: a gateway that writes new item ids in its terminal
    response still names each streamed call once (its call id), so nothing is refused or run twice."""
    from toolfleet.dispatcher.adapters import get_adapter

    parser = get_adapter("openai_responses_stream").parser()
    streamed = [_function_call("a", 0), _function_call("b", 1)]
    events = [{"type": "response.output_item.done", "output_index": n, "item": item} for n, item in enumerate(streamed)]
    events.append({"type": "response.completed", "response": {"id": "r", "output": [
        {**item, "id": f"fc_new{n}"} for n, item in enumerate(streamed)]}})
    taken = [call.id for event in events for call in parser.feed(event)] + [c.id for c in parser.finish()]
    assert taken == ["a", "b"]
    assert [item["call_id"] for item in parser.response()["output"]] == ["a", "b"]
