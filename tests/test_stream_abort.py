"""``TurnStream.abort`` and the local-cancel intake, as a breaker found them (real Redis, real prefork
workers): an abort after ``close`` cancels the turn; an abort whose cancel raises still closes the turn;
with Redis paused an abort that does not wait does not wait, and a call begun at the cancel gets
``NOT_EXECUTED`` (not ``TOOL_UNAVAILABLE``); a ``feed`` on another thread during an abort is either in
the rebuilt assistant message or refused; a stream whose format no event told still ends its turn;
a cancel made while Redis lost its data is not lost with it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest

from toolfleet import BatchRejected, Dispatcher, ErrorCode, Settings, ToolCall
from toolfleet.aio import AsyncDispatcher
from toolfleet.dispatcher import streaming
from toolfleet.errors import BrokerUnavailable, ToolfleetError

from .conftest import FLEET_KEY, make_registry
from .faults import wait_until
from .test_aio import chunk


def _tally(workspace) -> list[str]:
    path = workspace / "tally.txt"
    return path.read_text().split() if path.exists() else []


def _paused_fleet(private_redis, namespace, start_worker):
    server = private_redis(persistent=True)
    settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        heartbeat_s=0.5, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    return server, settings


def _begun(d: Dispatcher, workspace):
    """A stream with call ``a`` running (20 s) and call ``b`` begun (its arguments not complete)."""
    stream = d.open_stream(format="openai_chat_stream", workspace=str(workspace))
    stream.feed(chunk(0, "a", "tally", json.dumps({"text": "a", "seconds": 20})))
    stream.feed(chunk(1, "b", "tally", '{"text": '))
    wait_until(lambda: _tally(workspace) == ["a"], 30, "a to start")
    return stream


def test_abort_after_close_cancels_the_turn(dispatcher, start_worker, workspace):
    """The stream ended, then the caller gave up: the queued call never runs."""
    start_worker(concurrency=1)
    stream = dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace))
    stream.feed(chunk(0, "a", "tally", json.dumps({"text": "a", "seconds": 20})))
    stream.feed(chunk(1, "b", "tally", json.dumps({"text": "b"})))
    stream.close()
    wait_until(lambda: _tally(workspace) == ["a"], 30, "a to start")
    turn = stream.abort("the caller gave up")
    assert turn.cancelled and dispatcher.ledger.is_cancelled(turn.turn_id)
    codes = [r.code for r in turn.results(30)]
    assert codes == [ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED]
    assert _tally(workspace) == ["a"]  # b's NOT_EXECUTED is the ledger's: no claim of it can begin now


def test_an_abort_whose_cancel_raises_still_closes_the_turn(private_redis, namespace, start_worker, workspace):
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    with Dispatcher(settings, make_registry()) as d:
        stream = _begun(d, workspace)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(BrokerUnavailable):
                stream.abort("the caller gave up")  # waits for Redis: its socket times out
            assert stream.turn.closed and stream.turn.cancelled
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        results = stream.turn.results(30)
        assert [r.call_id for r in results] == ["a", "b"]
        assert results[1].code is ErrorCode.NOT_EXECUTED
        assert [c["id"] for c in stream.turn.assistant_messages()[0]["tool_calls"]] == ["a", "b"]
        assert d.ledger.is_cancelled(stream.turn.turn_id)  # the driver sent it once Redis answered
    assert _tally(workspace) == ["a"]


def test_an_abort_that_does_not_wait_returns_while_redis_is_paused(private_redis, namespace, start_worker,
                                                                   workspace):
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    with Dispatcher(settings, make_registry()) as d:
        stream = _begun(d, workspace)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            aborting = threading.Thread(target=stream.abort, args=("the caller gave up",), kwargs={"wait": False})
            aborting.start()
            aborting.join(d.settings.cancel_grace_s * 4)  # well within Redis's socket time-out (5 s)
            returned = not aborting.is_alive()
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        aborting.join()
        assert returned, "abort(wait=False) waited for the paused Redis"
        results = stream.turn.results(30)
        assert results[1].code is ErrorCode.NOT_EXECUTED, results[1]
        assert results[0].code in (ErrorCode.CANCELLED, ErrorCode.OUTCOME_UNKNOWN)  # its stop was not confirmed in time
        assert d.ledger.results(stream.turn.turn_id)["b"].code is ErrorCode.NOT_EXECUTED
    assert _tally(workspace) == ["a"]


def test_an_async_stream_left_while_redis_is_paused_answers_a_begun_call_not_executed(
        private_redis, namespace, start_worker, workspace):
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    fleet = AsyncDispatcher(settings, make_registry())

    async def main():
        box = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5.0):
                async with fleet.open_stream(format="openai_chat_stream", workspace=str(workspace)) as stream:
                    box.append(stream)
                    await stream.feed(chunk(0, "a", "tally", json.dumps({"text": "a", "seconds": 20})))
                    await stream.feed(chunk(1, "b", "tally", '{"text": '))
                    await asyncio.to_thread(wait_until, lambda: _tally(workspace) == ["a"], 30, "a to start")
                    os.kill(server.proc.pid, signal.SIGSTOP)
                    await asyncio.Event().wait()  # the model's next event never comes
        os.kill(server.proc.pid, signal.SIGCONT)
        return await box[0].turn.results(30)

    try:
        results = asyncio.run(main())
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        fleet.close()
    assert [r.call_id for r in results] == ["a", "b"]
    assert results[1].code is ErrorCode.NOT_EXECUTED, results[1]


@pytest.fixture
def no_worker_settings(settings):
    return settings.model_copy(update={"require_live_worker": False})


@pytest.mark.parametrize("wait", [True, False])
def test_a_feed_racing_an_abort_is_in_the_assistant_message_or_refused(no_worker_settings, monkeypatch, wait):
    """A feed on another thread (a cancelled asyncio task's feed still running) while the abort
    rebuilds the message: it waits for the abort, then is refused; the message pairs with the results."""
    fed: list[BaseException | None] = []
    with Dispatcher(no_worker_settings, make_registry()) as d:
        stream = d.open_stream(format="openai_chat_stream")
        stream.feed(chunk(0, "a", "wait_read", '{"label": "a"}'))
        stream.feed(chunk(1, "b", "wait_read", '{"label": "b"}'))
        real = streaming.answered_only

        def feed_c() -> None:
            try:
                stream.feed(chunk(2, "c", "wait_read", '{"label": "c"}'))
                fed.append(None)
            except BaseException as exc:  # noqa: BLE001 - told to the test
                fed.append(exc)

        feeder = threading.Thread(target=feed_c)

        def rebuild_while_a_feed_comes(response, taken):
            feeder.start()
            feeder.join(0.5)  # it waits for the abort: it cannot be taken in between
            return real(response, taken)

        monkeypatch.setattr(streaming, "answered_only", rebuild_while_a_feed_comes)
        turn = stream.abort("the caller gave up", wait=wait)
        feeder.join(30)
        results = turn.results(30)
        assert isinstance(fed[0], ToolfleetError)
        assert [c["id"] for c in turn.assistant_messages()[0]["tool_calls"]] == [r.call_id for r in results]
        assert [m["tool_call_id"] for m in turn.messages()] == [r.call_id for r in results] == ["a", "b"]
        assert {r.code for r in results} == {ErrorCode.NOT_EXECUTED}


@pytest.mark.parametrize("event", ["[DONE]", {}, {"type": "keepalive"}])
def test_a_stream_whose_format_no_event_told_still_ends_its_turn(dispatcher, event):
    with pytest.raises(BatchRejected) as raised:
        with dispatcher.open_stream() as stream:
            stream.feed(event)
    assert raised.value.reason == "unknown_format"
    assert stream.turn.closed and stream.turn.wait(10) and stream.turn.results(10) == []


@pytest.mark.parametrize("add_after_cancel", [False, True])
def test_a_cancel_made_as_redis_lost_its_data_is_not_lost(private_redis, namespace, start_worker, workspace,
                                                          add_after_cancel):
    """Redis restarted without its data and the caller cancelled before the turn's driver saw it:
    the cancel went to an empty Redis (no turn), then the driver restored the turn. It restores the
    cancel too, and the held call (never sent) is answered NOT_EXECUTED at once, not after the
    watchdog's quiet time after trouble. A call taken after the cancel must not hide the loss."""
    from toolfleet import Policy

    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, fleet_key=FLEET_KEY)
    start_worker(settings=settings)
    policy = Policy.from_dict({"tools": {"wait_read": "ask"}})
    with Dispatcher(settings, make_registry(), policy) as d:
        turn = d.open_turn(workspace=str(workspace))
        turn.add_calls([ToolCall(id="c1", name="wait_read", arguments={"label": "held"})])
        assert [p.call_id for p in turn.pending] == ["c1"]  # held as add_calls returned
        server.kill()
        server.start()
        turn.cancel("the caller gave up")
        if add_after_cancel:
            turn.add_calls([ToolCall(id="c2", name="wait_read", arguments={"label": "x"})])
        turn.close()
        began = time.monotonic()
        codes = {r.call_id: r.code for r in turn.results(30)}
        waited_s = time.monotonic() - began
        assert set(codes.values()) == {ErrorCode.NOT_EXECUTED}
        assert d.ledger.is_cancelled(turn.turn_id)
    assert waited_s < settings.turn_lease_s / 10, waited_s


@pytest.mark.parametrize("tool", ["tally", "tally_through"])
def test_a_call_seen_starting_before_redis_lost_its_data_is_never_said_not_to_have_run(
        private_redis, namespace, start_worker, workspace, tool):
    """The restored cancel marks no call: the runs that said what had started went with the data, so a
    running call (cancellable or not) ends CANCELLED, OUTCOME_UNKNOWN or with its own result."""
    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, fleet_key=FLEET_KEY, cancel_grace_s=0.5,
                        kill_grace_s=1.0, heartbeat_s=0.5)
    start_worker(settings=settings, concurrency=1)
    with Dispatcher(settings, make_registry()) as d:
        turn = d.submit([ToolCall(id="a", name=tool, arguments={"text": "a", "seconds": 4})], workspace=str(workspace))
        wait_until(lambda: _tally(workspace) == ["a"], 30, "a to start")
        wait_until(lambda: "a" in turn._started, 10, "the driver to see a start")
        server.kill()
        server.start()
        turn.cancel("the caller gave up")
        [result] = turn.results(60)
        assert result.code is not ErrorCode.NOT_EXECUTED, result
        assert d.ledger.is_cancelled(turn.turn_id)


def test_a_stream_whose_close_fails_on_redis_still_ends_its_turn(private_redis, namespace, start_worker, workspace):
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    with Dispatcher(settings, make_registry()) as d:
        try:
            with pytest.raises(BrokerUnavailable):
                with d.open_stream(format="openai_chat_stream", workspace=str(workspace)) as stream:
                    stream.feed(chunk(0, "a", "tally", '{"text": "a"'))  # completed only by the close
                    os.kill(server.proc.pid, signal.SIGSTOP)
            assert stream.turn.closed and stream.turn.cancelled
            with pytest.raises(ToolfleetError):
                stream.feed(chunk(1, "b", "tally", '{"text": "b"}'))
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        results = stream.turn.results(30)
        assert [r.call_id for r in results] == ["a"]  # not sent, and said so
        assert results[0].code in (ErrorCode.NOT_EXECUTED, ErrorCode.TOOL_UNAVAILABLE), results[0]
    assert _tally(workspace) == []


def test_an_abort_after_a_stream_ended_whole_changes_nothing(dispatcher, worker, workspace):
    stream = dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace))
    stream.feed(chunk(0, "a", "wait_read", '{"label": "a"}'))
    turn = stream.close()
    assert [r.ok for r in turn.results(30)] == [True]
    stream.abort("too late", wait=False)
    assert not turn.cancelled and not dispatcher.ledger.is_cancelled(turn.turn_id)


def test_calls_a_cancelled_turn_takes_after_its_driver_gave_up_are_answered(dispatcher, workspace, monkeypatch):
    """The turn's driver gave up on Redis (REDIS_GIVE_UP_S, shortened here); then the turn is cancelled
    and takes more calls: no driver is left to register them, so they are answered here, not waited for."""
    import redis

    from toolfleet.dispatcher import turn_driver

    monkeypatch.setattr(turn_driver, "REDIS_GIVE_UP_S", 1.0)
    turn = dispatcher.open_turn(workspace=str(workspace))

    def dead(*args, **kwargs):
        raise redis.ConnectionError("Redis went away (test)")

    monkeypatch.setattr(dispatcher.ledger, "events", dead)
    turn._thread.join(30)
    assert not turn._thread.is_alive()
    turn.add_calls([ToolCall(id="unsent", name="wait_read", arguments={"label": "a"})])  # never sent
    turn.cancel_soon("the caller gave up")
    turn.add_calls([ToolCall(id="late", name="wait_read", arguments={"label": "a"})])
    turn.close()
    assert turn.wait(10)
    assert turn.result("unsent").code is ErrorCode.TOOL_UNAVAILABLE
    assert turn.result("late").code is ErrorCode.NOT_EXECUTED
