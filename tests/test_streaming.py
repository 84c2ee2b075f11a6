"""Streaming early dispatch and incremental turns, against a real Redis and real prefork workers.

The promise: a call whose arguments are complete is validated and submitted before the stream
ends, so its result can be in before the stream's last event is read; results still come back in
model order, one per call, and a call added after a cancel is never run."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from toolfleet import ErrorCode, ToolCall
from toolfleet.dispatcher.plan import PlanItem, make_plan
from toolfleet.errors import BatchRejected, ToolfleetError
from toolfleet.tools.resources import resolve

from .conftest import CASES
from .expect import check_call


@pytest.fixture
def settings(settings):
    """Some tests here run without a worker, so calls stay queued (nothing starts) while they
    test cancels and refusals: queue them as for a fleet scaling from zero, instead of getting
    TOOL_UNAVAILABLE at once (tests/test_availability.py covers that)."""
    return settings.model_copy(update={"require_live_worker": False})


FIRST_RESULT_TIMEOUT_S = 60  # generous: a loaded CI machine, not a speed claim
STREAMS = [("openai_chat_stream", "08_parallel_reads"), ("anthropic_stream", "09_two_reads"),
           ("openai_responses_stream", "10_parallel_reads")]


def events_of(folder: str, name: str) -> list[dict]:
    text = (CASES / folder / f"{name}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def first_result(ledger, turn_id: str, timeout_s: float):
    """Join on the turn's event stream in Redis until its first result is recorded."""
    deadline = time.monotonic() + timeout_s
    last = "0-0"
    while time.monotonic() < deadline:
        for event in ledger.events(turn_id, after=last, block_ms=500):
            last = event.stream_id
            if event.type == "result":
                return event.result()
    return None


@pytest.mark.parametrize("folder, name", STREAMS)
def test_first_result_is_in_before_the_last_event_is_read(folder, name, dispatcher, worker, workspace):
    events = events_of(folder, name)
    expect = json.loads((CASES / folder / f"{name}.expect.json").read_text())
    turn_id = uuid.uuid4().hex
    seen: dict[str, object] = {}

    def replay():
        for i, event in enumerate(events):
            if i == len(events) - 1:  # hold the last event back until a result exists
                seen["first"] = first_result(dispatcher.ledger, turn_id, FIRST_RESULT_TIMEOUT_S)
                seen["read_so_far"] = i
            yield event

    turn = dispatcher.submit_stream(replay(), workspace=str(workspace), turn_id=turn_id)
    first = seen["first"]
    assert first is not None, "no result before the stream's last event: calls were not dispatched early"
    assert first.call_id in expect["order"] and first.ok, first
    assert seen["read_so_far"] == len(events) - 1
    results = turn.results(60)
    assert [r.call_id for r in results] == expect["order"]
    for result in results:
        check_call(result.call_id, result.model_dump(mode="json"), expect["calls"][result.call_id])


def test_a_call_runs_while_the_stream_still_has_the_next_call_to_send(dispatcher, worker, workspace):
    events = events_of("openai_chat_stream", "08_parallel_reads")
    with dispatcher.open_stream(workspace=str(workspace)) as stream:
        for event in events[:5]:  # up to the fragment that closes call_st1's arguments
            stream.feed(event)
        assert [c.id for c in stream.turn.calls] == ["call_st1"]
        early = next(stream.turn.as_completed(FIRST_RESULT_TIMEOUT_S))
        assert early.call_id == "call_st1" and early.ok and "inventory-service" in early.content
        for event in events[5:]:
            stream.feed(event)
    turn = stream.turn
    assert [r.call_id for r in turn.results(60)] == ["call_st1", "call_st2"]
    assert turn.assistant_messages()[0]["tool_calls"][1]["function"]["arguments"] == \
        '{"pattern": "WARN slow", "path": "logs/app.log"}'
    assert [m["tool_call_id"] for m in turn.messages()] == ["call_st1", "call_st2"]


def test_incremental_planning_gives_the_plan_of_the_whole_batch(dispatcher, workspace):
    case = json.loads((CASES / "openai_chat" / "02_read_write_order.json").read_text())
    calls = dispatcher.submit_response(case, workspace=str(workspace))  # batch, for its calls only
    calls.cancel("only the plan is compared")
    batch = calls.plan
    turn = dispatcher.open_turn(workspace=str(workspace))
    for call in calls.calls:
        turn.add_call(call)
        assert turn.plan.deps == {k: v for k, v in batch.deps.items() if k in turn.plan.deps}
    turn.cancel("only the plan is compared")
    turn.close()
    items = []
    for call in calls.calls:
        spec = dispatcher.registry.get(call.name)
        arguments = json.loads(call.arguments)
        items.append(PlanItem(call.id, spec.access, resolve(spec.resources, arguments)))
    assert turn.plan == batch == make_plan(items)
    assert len(turn.results(30)) == len(calls.calls)


def test_a_call_added_after_a_cancel_gets_not_executed(dispatcher, worker, workspace):
    turn = dispatcher.open_turn(workspace=str(workspace))
    turn.add_call(ToolCall(id="before", name="wait_read", arguments={"label": "a", "seconds": 30}))
    dispatcher.cancel(turn.turn_id, "cancelled from elsewhere")  # another process's cancel
    turn.add_call(ToolCall(id="after", name="wait_read", arguments={"label": "b"}))
    turn.add_call(ToolCall(id="bad_after", name="nope", arguments={}))
    turn.close()
    results = {r.call_id: r for r in turn.results(30)}
    assert results["after"].code == ErrorCode.NOT_EXECUTED and results["after"].attempts == 0
    assert results["bad_after"].code == ErrorCode.NOT_EXECUTED  # one result per call: the cancel's
    assert results["before"].code in (ErrorCode.NOT_EXECUTED, ErrorCode.CANCELLED)


def test_calls_racing_a_cancel_each_get_exactly_one_result(dispatcher, workspace):
    """No worker: nothing starts, so every call (added before or after the cancel) must end
    NOT_EXECUTED through the ledger, whichever side of the cancel it landed on."""
    turn = dispatcher.open_turn(workspace=str(workspace))
    added = threading.Event()
    n_calls = 200

    def add_many():
        for i in range(n_calls):
            turn.add_call(ToolCall(id=f"c{i}", name="wait_read", arguments={"label": f"k{i}"}))
            if i == 20:
                added.set()
        turn.close()

    adder = threading.Thread(target=add_many)
    adder.start()
    added.wait(30)
    turn.cancel("race")
    adder.join(60)
    results = turn.results(30)
    assert [r.call_id for r in results] == [f"c{i}" for i in range(n_calls)]
    assert {r.code for r in results} == {ErrorCode.NOT_EXECUTED}
    stored = dispatcher.ledger.results(turn.turn_id)
    assert set(stored) == {f"c{i}" for i in range(n_calls)}


def test_a_duplicate_id_mid_stream_refuses_the_rest_and_cancels(dispatcher, workspace):
    def chunk(index, call_id, arguments):
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": index, "id": call_id, "type": "function",
             "function": {"name": "wait_read", "arguments": arguments}}]}, "finish_reason": None}]}

    stream = dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace))
    stream.feed(chunk(0, "same", '{"label": "x", "seconds": 30}'))
    with pytest.raises(BatchRejected, match="duplicate call id") as refused:
        stream.feed(chunk(1, "same", '{"label": "y"}'))
    assert refused.value.reason == "duplicate_call_id" and "stream event 2" in str(refused.value)
    turn = stream.turn
    assert turn.closed and turn.cancelled
    assert [r.code for r in turn.results(30)] == [ErrorCode.NOT_EXECUTED]
    with pytest.raises(ToolfleetError, match="closed"):
        turn.add_call(ToolCall(id="late", name="wait_read", arguments={"label": "z"}))


def test_a_stream_cut_short_gives_its_open_call_an_error_and_runs_the_rest(dispatcher, worker, workspace):
    events = events_of("anthropic_stream", "09_two_reads")[:10]  # toolu_st2 started, never stopped
    turn = dispatcher.submit_stream(events, workspace=str(workspace))
    first, second = turn.results(60)
    assert first.ok
    assert second.code == ErrorCode.INVALID_ARGUMENT and "stream ended before" in second.content
    assert turn.assistant_messages()[0]["content"][2]["input"] == {}


def test_format_told_from_later_events_when_the_first_do_not_say(dispatcher, worker, workspace):
    events = [{"event": "keepalive"}] + events_of("anthropic_stream", "09_two_reads")
    turn = dispatcher.submit_stream(events, workspace=str(workspace))
    assert turn.adapter.name == "anthropic_stream"
    assert [r.ok for r in turn.results(60)] == [True, True]


def test_a_long_chat_stream_is_parsed_in_time_linear_in_its_length():
    """A Chat stream of a 400 KB write_file in 4-character argument fragments, with as much
    ``reasoning_content`` and a ``logprobs`` list per chunk: the parser joined and read all the
    argument fragments again at each one, and joined (copied) every text and list field at each
    delta: quadratic (200 KB took 18 s). Now each fragment is looked at once; the call, the text
    and the lists come out whole, and the caller's events are left as they were."""
    from toolfleet.dispatcher.adapters import get_adapter

    content = "function f() { return {a: [1, 2]}; }\n" * 10_000
    arguments = json.dumps({"path": "app.js", "content": content})
    first = {"index": 0, "id": "call_w", "type": "function", "function": {"name": "write_file", "arguments": ""}}
    events = [{"object": "chat.completion.chunk", "id": "s", "choices": [
        {"index": 0, "delta": {"role": "assistant", "tool_calls": [first]}}]}]
    for at in range(0, len(arguments), 4):
        events.append({"object": "chat.completion.chunk", "choices": [{"index": 0, "logprobs": {"content": [
            {"token": "x", "logprob": -0.1}]}, "delta": {"reasoning_content": "why ", "tool_calls": [
                {"index": 0, "function": {"arguments": arguments[at:at + 4]}}]}}]})
    events.append({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {},
                                                                    "finish_reason": "tool_calls"}]})
    before = json.dumps(events[1])
    parser = get_adapter("openai_chat_stream").parser()
    started = time.monotonic()
    calls = [c for event in events for c in parser.feed(event)] + parser.finish()
    message = parser.response()["choices"][0]["message"]
    assert time.monotonic() - started < 20.0  # linear: about 1 s here; quadratic: minutes
    assert [c.id for c in calls] == ["call_w"] and json.loads(calls[0].arguments)["content"] == content
    assert message["reasoning_content"] == "why " * ((len(arguments) + 3) // 4)
    assert json.dumps(events[1]) == before  # the caller's event is not changed by the merge


def _chat_chunk(index, call_id, arguments):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": index, "id": call_id, "type": "function",
         "function": {"name": "wait_read", "arguments": arguments}}]}, "finish_reason": None}]}


def _paired(turn) -> list[str]:
    """The call ids of the rebuilt assistant message, checked against those of the tool messages."""
    called = [c["id"] for m in turn.assistant_messages() for c in m.get("tool_calls") or []]
    assert called == [m["tool_call_id"] for m in turn.messages(30)]
    return called


def test_an_unreadable_event_mid_stream_cancels_the_turn_it_began(dispatcher, workspace):
    """An event that cannot be read (a call id that is not a string) raised out of feed with the
    turn left open: a `with` block then closed it normally, so the calls taken before it ran with
    nobody to read them (a breaker's find). It is refused as a duplicate id is: the turn is cancelled."""
    stream = dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace))
    stream.feed(_chat_chunk(0, "first", '{"label": "x", "seconds": 30}'))
    stream.feed(_chat_chunk(1, "second", '{"label": "y", "seconds": 30}'))  # complete: taken
    stream.feed(_chat_chunk(2, "open", '{"label": "z"'))  # begun, not complete
    with pytest.raises(BatchRejected) as refused:
        stream.feed(_chat_chunk(3, 12345, '{}'))
    assert refused.value.reason == "unreadable_payload" and "stream event 4" in str(refused.value)
    turn = stream.turn
    assert turn.closed and turn.cancelled
    codes = {r.call_id: r.code for r in turn.results(30)}
    assert codes == {"first": ErrorCode.NOT_EXECUTED, "second": ErrorCode.NOT_EXECUTED, "open": ErrorCode.NOT_EXECUTED}
    assert _paired(turn) == ["first", "second", "open"]


def test_leaving_a_stream_block_by_an_exception_cancels_its_turn(dispatcher, workspace):
    """The caller's code (or the provider's stream) raising inside `with open_stream()` left the
    taken calls to run after the caller had been told the stream failed: the turn is cancelled."""
    with pytest.raises(ConnectionError):
        with dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace)) as stream:
            stream.feed(_chat_chunk(0, "first", '{"label": "x"}'))
            stream.feed(_chat_chunk(1, "open", '{"label": "y"'))
            raise ConnectionError("the provider's stream broke")
    turn = stream.turn
    assert turn.closed and turn.cancelled
    assert {r.call_id: r.code for r in turn.results(30)} == {"first": ErrorCode.NOT_EXECUTED,
                                                             "open": ErrorCode.NOT_EXECUTED}
    assert _paired(turn) == ["first", "open"]


def test_submit_stream_whose_events_raise_leaves_no_call_to_run_later(dispatcher, workspace):
    """submit_stream never hands back the turn when its events raise: the turn must not run on."""
    turn_id = uuid.uuid4().hex

    def events():
        yield _chat_chunk(0, "first", '{"label": "x"}')
        yield _chat_chunk(1, "second", '{"label": "y"}')
        raise TimeoutError("read timed out")

    with pytest.raises(TimeoutError):
        dispatcher.submit_stream(events(), format="openai_chat_stream", workspace=str(workspace), turn_id=turn_id)
    assert dispatcher.ledger.is_cancelled(turn_id)
    stored = dispatcher.ledger.results(turn_id)
    assert {k: r.code for k, r in stored.items()} == {"first": ErrorCode.NOT_EXECUTED,
                                                       "second": ErrorCode.NOT_EXECUTED}


def test_a_stream_closed_in_its_block_then_left_by_an_exception_is_cancelled(dispatcher, workspace):
    """close() inside the block, then an exception: the turn was left closed, not cancelled, and its
    calls queued to run when a worker came (a breaker's find)."""
    with pytest.raises(KeyboardInterrupt):
        with dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace)) as stream:
            stream.feed(_chat_chunk(0, "first", '{"label": "x"}'))
            turn = stream.close()
            raise KeyboardInterrupt
    assert turn.cancelled
    assert [(r.call_id, r.code) for r in turn.results(30)] == [("first", ErrorCode.NOT_EXECUTED)]

