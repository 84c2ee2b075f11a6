"""The asyncio API while Redis is paused (SIGSTOP of a private redis-server: a VM stall, a partition
that keeps the TCP connection): a task awaiting turns that is cancelled (``asyncio.timeout`` here)
cancels them without blocking the event loop. A helper's find: each awaiting task's cancel ran on
the loop's own thread and waited for Redis's reply (the socket's 5 s time-out), one after another,
so ``asyncio.timeout(0.5)`` around three turns raised after 15 s, with every other task of the loop
stopped all that while. The cancels are not lost: the turns' drivers send them once Redis answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

from toolfleet import ErrorCode, Settings, ToolCall
from toolfleet.aio import AsyncDispatcher
from toolfleet.dispatcher.client import CLOSE_WAIT_S

from .conftest import FLEET_KEY, make_registry
from .faults import wait_started, wait_until

TURNS = 3
BOUND_S = 0.5 + 1.0  # the timeout, and a little (before: the timeout + a socket time-out per turn)


def tally(cid: str, text: str, seconds: float = 0.0) -> ToolCall:
    return ToolCall(id=cid, name="tally", arguments=json.dumps({"text": text, "seconds": seconds}))


def _paused_fleet(private_redis, namespace, start_worker):
    """A private redis-server (to be paused with SIGSTOP) and a one-process worker on it: the server
    and the settings."""
    server = private_redis(persistent=True)
    settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        heartbeat_s=0.5, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    return server, settings


async def _ticker(gaps: list[float]) -> None:
    """Append to ``gaps`` how long the loop went between its ticks (50 ms asked): a blocked loop
    shows as a long gap."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


def test_a_timeout_around_awaited_turns_while_redis_is_paused_keeps_the_loop_running(private_redis, namespace,
                                                                                     start_worker, workspace):
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    fleet = AsyncDispatcher(settings, make_registry())
    tally_file = workspace / "tally.txt"

    async def main():
        turns = [await fleet.submit([tally("a", "a", seconds=20)], workspace=str(workspace))]
        wait_started(fleet.dispatcher, turns[0].turn_id, "a")
        wait_until(lambda: tally_file.exists() and tally_file.read_text().split() == ["a"], 30,
                   "call a's handler to run")
        turns += [await fleet.submit([tally(f"q{i}", f"q{i}")], workspace=str(workspace)) for i in range(1, TURNS)]
        gaps = [0.0]
        ticking = asyncio.create_task(_ticker(gaps))
        await asyncio.sleep(0.2)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            try:
                async with asyncio.timeout(0.5):
                    await asyncio.gather(*(turn.results() for turn in turns))
            except TimeoutError:
                pass
            told_s = time.monotonic() - began
            await asyncio.sleep(0.2)
            longest_gap = max(gaps)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        ticking.cancel()
        finals = [await turn.results(60) for turn in turns]
        return told_s, longest_gap, finals, turns

    try:
        told_s, longest_gap, finals, turns = asyncio.run(main())
        cancelled = [fleet.dispatcher.ledger.is_cancelled(turn.turn_id) for turn in turns]
    finally:
        fleet.close()
    print(f"\ntimeout raised after {told_s:.2f} s; longest stop of the loop {longest_gap:.2f} s")
    assert told_s < BOUND_S, told_s
    assert longest_gap < 1.0, longest_gap
    assert all(cancelled), "a cancel never reached Redis"
    assert finals[0][0].code in (ErrorCode.CANCELLED, ErrorCode.OUTCOME_UNKNOWN), finals[0]
    for [result] in finals[1:]:
        assert result.code is ErrorCode.NOT_EXECUTED, result
    assert tally_file.read_text().split() == ["a"]  # nothing of the cancelled turns ran later


def test_leaving_an_async_dispatcher_block_while_redis_is_paused_keeps_the_loop_running(private_redis, namespace,
                                                                                        start_worker, workspace):
    """``async with AsyncDispatcher(...)`` ends by closing the dispatcher, which gives its turns'
    cancels and drivers up to ``cancel_grace_s`` + ``CLOSE_WAIT_S`` (E1): that wait ran on the
    loop's thread, stopping every other task of the loop for as long (3.5 s here)."""
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    tally_file = workspace / "tally.txt"

    async def main():
        gaps = [0.0]

        async with AsyncDispatcher(settings, make_registry()) as fleet:
            turns = [await fleet.submit([tally("a", "a", seconds=20)], workspace=str(workspace))]
            wait_started(fleet.dispatcher, turns[0].turn_id, "a")
            wait_until(lambda: tally_file.exists() and tally_file.read_text().split() == ["a"], 30,
                       "call a's handler to run")
            turns.append(await fleet.submit([tally("q", "q")], workspace=str(workspace)))
            ticking = asyncio.create_task(_ticker(gaps))
            await asyncio.sleep(0.2)
            os.kill(server.proc.pid, signal.SIGSTOP)
            began = time.monotonic()
        try:
            closed_s = time.monotonic() - began
            await asyncio.sleep(0.2)
            longest_gap = max(gaps)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        ticking.cancel()
        return closed_s, longest_gap, [turn.turn for turn in turns]

    closed_s, longest_gap, turns = asyncio.run(main())
    print(f"\nthe block was left after {closed_s:.2f} s; longest stop of the loop {longest_gap:.2f} s")
    assert closed_s < settings.cancel_grace_s + CLOSE_WAIT_S + 1.0, closed_s
    assert longest_gap < 1.0, longest_gap
    assert all(turn.cancelled for turn in turns)


def test_async_turn_cancel_while_redis_is_paused_returns_at_once_and_is_not_lost(private_redis, namespace,
                                                                                  start_worker, workspace):
    """``AsyncTurn.cancel()`` (documented as returning at once) sent the cancel on the loop's thread
    and waited for Redis: 5 s of a stopped loop with Redis paused, then BrokerUnavailable."""
    server, settings = _paused_fleet(private_redis, namespace, start_worker)
    fleet = AsyncDispatcher(settings, make_registry())
    tally_file = workspace / "tally.txt"

    async def main():
        busy = await fleet.submit([tally("a", "a", seconds=3)], workspace=str(workspace))
        wait_started(fleet.dispatcher, busy.turn_id, "a")
        queued = await fleet.submit([tally("q", "q")], workspace=str(workspace))
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            queued.cancel()
            cancel_s = time.monotonic() - began
            await asyncio.sleep(0.5)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        return cancel_s, await queued.results(60), await busy.results(60), queued

    try:
        cancel_s, [result], [first], queued = asyncio.run(main())
        cancelled = fleet.dispatcher.ledger.is_cancelled(queued.turn_id)
    finally:
        fleet.close()
    assert cancel_s < 0.5, cancel_s
    assert cancelled, "the cancel never reached Redis"
    assert result.code is ErrorCode.NOT_EXECUTED, result
    assert first.ok, first
    assert tally_file.read_text().split() == ["a"]
