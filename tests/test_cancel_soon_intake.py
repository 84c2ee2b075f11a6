"""Calls that reach a turn after it was cancelled here but before Redis took the cancel
(``cancel_soon``, whose send runs on a thread; a cancel Redis did not take yet) get the cancel's
answer, ``NOT_EXECUTED``, as calls added after a cancel Redis took do: not a check of their
arguments (``INVALID_ARGUMENT`` for a call the stream cut short). CI's find: an asyncio stream
left by a cancelled task closed the stream while its cancel was still on its way to Redis, and
the call the stream had begun came back ``INVALID_ARGUMENT`` instead of ``NOT_EXECUTED``.

The cancel's send is held at the ledger (real Redis, a real prefork worker) until the calls are
in, so the order is the one CI hit by chance."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from toolfleet import ErrorCode, ToolCall
from toolfleet.aio import AsyncDispatcher

from .test_aio import chunk

WAIT_S = 30
STOPPED = {ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED}  # s1 was sent: it may have started


@contextmanager
def cancel_held(dispatcher) -> Iterator[threading.Event]:
    """Hold every cancel the dispatcher's ledger sends until the yielded event is set."""
    gate, real = threading.Event(), dispatcher.ledger.cancel

    def held(*args, **kwargs):
        gate.wait(WAIT_S)
        return real(*args, **kwargs)

    dispatcher.ledger.cancel = held
    try:
        yield gate
    finally:
        gate.set()


def test_calls_added_after_cancel_soon_get_not_executed_whatever_their_arguments(dispatcher, worker):
    with cancel_held(dispatcher) as gate:
        turn = dispatcher.open_turn()
        turn.cancel_soon("the caller gave up")
        turn.add_calls([ToolCall(id="bad", name="wait_read", arguments="{}", index=0),  # label missing
                        ToolCall(id="nope", name="no_such_tool", arguments="{}", index=1),
                        ToolCall(id="fine", name="wait_read", arguments=json.dumps({"label": "x"}), index=2)],
                       failed={})
        turn.close()
        gate.set()
        results = turn.results(WAIT_S)
    assert [r.call_id for r in results] == ["bad", "nope", "fine"]
    assert [r.error.code for r in results] == [ErrorCode.NOT_EXECUTED] * 3


def test_a_stream_closed_while_its_cancel_is_on_its_way_answers_its_open_call_not_executed(dispatcher, worker):
    with cancel_held(dispatcher) as gate:
        stream = dispatcher.open_stream(format="openai_chat_stream")
        events = [chunk(0, "s1", "count_until_cancelled", '{"seconds": 30}'), chunk(1, "s2", "wait_read")]
        assert [c.id for e in events for c in stream.feed(e)] == ["s1"]  # s2's arguments never end
        stream.turn.cancel_soon("the reader gave up")
        stream.close()
        gate.set()
        results = stream.turn.results(WAIT_S)
    assert [(r.call_id, r.error.code in ({ErrorCode.NOT_EXECUTED} if r.call_id == "s2" else STOPPED))
            for r in results] == [("s1", True), ("s2", True)]


def test_an_async_stream_left_by_a_cancelled_task_answers_its_open_call_not_executed(dispatcher, worker):
    fleet = AsyncDispatcher(dispatcher=dispatcher)

    async def reads_then_is_cancelled(opened: asyncio.Event, box: list) -> None:
        async with fleet.open_stream(format="openai_chat_stream") as stream:
            box.append(stream)
            for event in (chunk(0, "s1", "count_until_cancelled", '{"seconds": 30}'), chunk(1, "s2", "wait_read")):
                await stream.feed(event)
            opened.set()
            await asyncio.Event().wait()  # the rest of the stream never comes

    async def main(gate: threading.Event):
        opened, box = asyncio.Event(), []
        task = asyncio.create_task(reads_then_is_cancelled(opened, box))
        await opened.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gate.set()  # the stream was closed (on its thread) before Redis had the cancel
        return box[0].turn, await box[0].turn.results(WAIT_S)

    with cancel_held(dispatcher) as gate:
        turn, results = asyncio.run(main(gate))
    assert turn.turn.cancelled
    assert [(r.call_id, r.error.code in ({ErrorCode.NOT_EXECUTED} if r.call_id == "s2" else STOPPED))
            for r in results] == [("s1", True), ("s2", True)]
    # the assistant message names the calls answered, as a synchronous stream's abort does
    assert [c["id"] for c in turn.assistant_messages()[0]["tool_calls"]] == ["s1", "s2"]
