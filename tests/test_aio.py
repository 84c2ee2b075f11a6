"""The asyncio API against a real Redis and real prefork workers: awaitable submit, ``async for``
over results as they finish, and cancelling the awaiting task cancels the turn."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from toolfleet import ErrorCode, Policy, ToolCall
from toolfleet.aio import AsyncDispatcher

from .conftest import ROOT, make_registry

WAIT_S = 60


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


@pytest.fixture
def fleet(settings, start_worker):
    start_worker(concurrency=2)
    fleet = AsyncDispatcher(settings, make_registry())
    yield fleet
    fleet.close()


def test_async_for_gives_each_result_once_and_results_keep_model_order(fleet):
    calls = [call("slow", "wait_read", 0, label="a", seconds=0.5), call("fast", "wait_read", 1, label="b"),
             call("bad", "no_such_tool", 2)]

    async def main():
        turn = await fleet.submit(calls)
        seen = [r.call_id async for r in turn.as_completed(WAIT_S)]
        return seen, await turn.results(WAIT_S)

    seen, results = asyncio.run(main())
    assert sorted(seen) == ["bad", "fast", "slow"]
    assert seen.index("fast") < seen.index("slow")  # completion order, not model order
    assert [r.call_id for r in results] == ["slow", "fast", "bad"]
    assert [r.status for r in results] == ["ok", "ok", "error"]
    assert results[2].error.code == ErrorCode.UNKNOWN_TOOL


def test_cancelling_the_awaiting_task_cancels_the_turn(fleet):
    calls = [call("w1", "count_until_cancelled", 0, seconds=30),
             call("w2", "wait_write", 1, label="x", seconds=30),
             call("w3", "wait_write", 2, label="x")]  # waits behind w2 in the plan

    async def main():
        turn = await fleet.submit(calls)
        task = asyncio.create_task(turn.results())
        done, _ = await asyncio.wait([task], timeout=0.3)
        assert not done  # still running: 30 s calls
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        results = await turn.results(WAIT_S)
        return turn, results, time.monotonic() - began

    turn, results, elapsed = asyncio.run(main())
    assert turn.turn.cancelled
    codes = {r.call_id: r.error.code for r in results}
    assert codes["w1"] in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
    assert codes["w2"] in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
    assert codes["w3"] == ErrorCode.NOT_EXECUTED  # never started
    assert elapsed < 20  # final promptly after the cancel, not after the 30 s calls


def test_a_timeout_around_the_await_cancels_the_turn(fleet):
    async def main():
        turn = await fleet.submit([call("long", "count_until_cancelled", 0, seconds=30)])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await turn.results()
        return turn, await turn.results(WAIT_S)

    turn, results = asyncio.run(main())
    assert turn.turn.cancelled
    assert results[0].error.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)


def test_leaving_async_for_early_cancels_the_turn_unless_told_not_to(fleet):
    calls = [call("quick", "wait_read", 0, label="q"), call("long", "count_until_cancelled", 1, seconds=30)]

    async def main(cancel_turn: bool, cid_prefix: str):
        turn = await fleet.submit([ToolCall(id=cid_prefix + c.id, name=c.name, arguments=c.arguments,
                                            index=c.index) for c in calls])
        stream = turn.as_completed(WAIT_S, cancel_turn=cancel_turn)
        first = await anext(stream)
        await stream.aclose()
        return turn, first

    turn, first = asyncio.run(main(True, "a-"))
    assert first.call_id == "a-quick"
    assert turn.turn.cancelled
    assert turn.turn.results(WAIT_S)[1].error.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)

    kept, _ = asyncio.run(main(False, "b-"))
    assert not kept.turn.cancelled
    kept.cancel()  # end it here (the test does not wait 30 s)
    kept.turn.results(WAIT_S)


def test_a_call_held_for_approval_is_answered_by_its_call_id(settings, start_worker, workspace):
    policy = Policy.from_dict({"tools": {"append_line": "ask"}})
    start_worker(concurrency=2)
    fleet = AsyncDispatcher(settings, make_registry(), policy)
    calls = [call("r", "read_file", 0, path="README.md"),
             call("a", "append_line", 1, path="notes.txt", line="approved")]

    async def main():
        turn = await fleet.submit(calls, workspace=str(workspace))
        pending = await turn.wait_settled(WAIT_S)
        assert [p.call_id for p in pending] == ["a"]
        await turn.approve("a")
        return await turn.results(WAIT_S)

    try:
        results = asyncio.run(main())
    finally:
        fleet.close()
    assert [r.status for r in results] == ["ok", "ok"]
    assert (workspace / "notes.txt").read_text() == "approved\n"


def test_the_asyncio_example_runs(settings, start_worker):
    start_worker(concurrency=2)
    env = dict(os.environ, PYTHONPATH=str(ROOT), REDIS_URL=settings.redis_url, TOOLFLEET_NAMESPACE=settings.namespace)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "asyncio_turn.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "-> call_3" in done.stdout
    assert "after the cancel: call_9 " in done.stdout
    assert done.stdout.rstrip().split()[-1] in ("CANCELLED", "NOT_EXECUTED")


def chunk(index: int, cid: str | None = None, name: str | None = None, arguments: str = "") -> dict:
    function = {"arguments": arguments, **({"name": name} if name else {})}
    call = {"index": index, **({"id": cid, "type": "function"} if cid else {}), "function": function}
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}


def test_an_async_stream_submits_each_call_early_and_a_cancelled_reader_cancels_the_turn(fleet):
    events = [chunk(0, "s1", "count_until_cancelled", '{"seconds": 30}'),
              chunk(1, "s2", "wait_read"), chunk(1, arguments='{"label": "z"}')]

    async def reads_then_is_cancelled(fed: asyncio.Event):
        model_is_slow = asyncio.Event()
        async with fleet.open_stream(format="openai_chat_stream") as stream:
            taken = [c.id for e in events[:2] for c in await stream.feed(e)]
            assert taken == ["s1"]  # s1 complete (the next call began): already submitted
            reader.turn = stream.turn
            fed.set()
            await model_is_slow.wait()  # the rest of the stream never comes: the task is cancelled here

    async def main():
        fed = asyncio.Event()
        task = asyncio.create_task(reads_then_is_cancelled(fed))
        await asyncio.wait([task, asyncio.create_task(fed.wait())], return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await reader.turn.results(WAIT_S)

    class reader:
        turn = None

    results = asyncio.run(main())
    assert reader.turn.turn.cancelled
    assert [r.call_id for r in results] == ["s1", "s2"]
    assert results[0].error.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
    assert results[1].error.code == ErrorCode.NOT_EXECUTED


def test_an_async_stream_read_to_its_end(fleet):
    lines = (ROOT / "examples" / "cases" / "openai_chat_stream" / "08_parallel_reads.jsonl").read_text()
    events = [json.loads(line) for line in lines.splitlines() if line.strip()]

    async def main():
        async with fleet.open_stream() as stream:
            for event in events:
                await stream.feed(event)
        return stream.turn, await stream.turn.messages(WAIT_S)

    turn, messages = asyncio.run(main())
    assert [m["tool_call_id"] for m in messages] == [c.id for c in turn.calls]
    assert turn.assistant_messages()[0]["tool_calls"]


def test_cancelling_the_task_while_it_submits_cancels_the_turn_once_submitted(fleet):
    import threading

    calls = [call("q1", "count_until_cancelled", 0, seconds=30), call("q2", "wait_read", 1, label="q")]

    async def main():
        task = asyncio.create_task(fleet.submit(calls, turn_id="aio-cancelled-while-submitting"))
        await asyncio.sleep(0)  # one step: the task is now inside its submission (a thread)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    for thread in threading.enumerate():  # join the submission, however far it had got
        if thread.name == "toolfleet-aio-submit":
            thread.join(WAIT_S)
    ledger = fleet.dispatcher.ledger
    assert ledger.is_cancelled("aio-cancelled-while-submitting")


def test_leaving_an_async_stream_by_an_exception_cancels_the_turn(fleet):
    """Only a cancelled task cancelled the turn: the provider's stream raising (a read timeout)
    closed it normally, and its calls ran after the caller had the error."""
    events = [chunk(0, "s1", "count_until_cancelled", '{"seconds": 30}'), chunk(1, "s2", "wait_read")]

    async def main():
        with pytest.raises(TimeoutError):
            async with fleet.open_stream(format="openai_chat_stream") as stream:
                for event in events:
                    await stream.feed(event)
                raise TimeoutError("the provider's stream timed out")
        return stream.turn, await stream.turn.results(WAIT_S)

    turn, results = asyncio.run(main())
    assert turn.turn.cancelled
    assert [r.call_id for r in results] == ["s1", "s2"]
    assert results[0].error.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
    assert results[1].error.code == ErrorCode.NOT_EXECUTED
