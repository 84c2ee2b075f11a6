"""A caller that gives up (``results(timeout_s)``) while Redis is paused (SIGSTOP of a private
redis-server: a VM stall, a partition that keeps the TCP connection) is told within its bound, and
its cancel is not lost: the turn's driver sends it until Redis takes it. A breaker's find: each
give-up waited out the cancel's 5 s socket time-out (``results(timeout_s=1)`` raised after 6 s),
and a cancel Redis never took was never sent again, so a queued call could run after the caller
was told the turn was cancelled."""

from __future__ import annotations

import os
import signal
import time

import pytest

from toolfleet import Dispatcher, ErrorCode, Settings
from toolfleet.dispatcher.turn import GIVE_UP_CANCEL_WAIT_S

from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started, wait_until

PAUSE_S = 6.0  # longer than the cancel's socket time-out (5 s): the give-up's own attempt fails


def test_a_give_up_while_redis_is_paused_keeps_its_bound_and_its_cancel(private_redis, namespace, start_worker,
                                                                         workspace):
    server = private_redis(persistent=True)
    settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        heartbeat_s=0.5, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("a", "tally", text="a", seconds=2), call("c", "tally", text="c")],
                                 workspace=str(workspace))
        wait_started(dispatcher, turn.turn_id, "a")
        # "started" is the claim's event; the handler begins after it, and a claim slower than
        # recheck_after_s is fenced once more first (guarantee F7), a check the pause would refuse.
        # The fault belongs while the handler runs, so wait for its first effect (its line).
        tally = workspace / "tally.txt"
        wait_until(lambda: tally.exists() and tally.read_text().split() == ["a"], 30, "call a's handler to run")
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(TimeoutError) as gave_up:
                turn.results(timeout_s=0.5)
            told_s = time.monotonic() - began
            again = time.monotonic()
            with pytest.raises(TimeoutError):  # a second give-up: bounded too
                turn.results(timeout_s=0.2)
            again_s = time.monotonic() - again
            time.sleep(max(began + PAUSE_S - time.monotonic(), 0.0))  # the fault's length, not a wait for a result
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        final = {r.call_id: r for r in turn.results(timeout_s=60)}
        cancelled = dispatcher.ledger.is_cancelled(turn.turn_id)
    print(f"\ntold after {told_s:.2f} s, again after {again_s:.2f} s: {gave_up.value}")
    assert told_s < 0.5 + GIVE_UP_CANCEL_WAIT_S + 0.5 and again_s < 0.2 + GIVE_UP_CANCEL_WAIT_S + 0.5
    assert "cancelled" in str(gave_up.value) and "until Redis answers" in str(gave_up.value)
    assert cancelled, "the cancel never reached Redis"
    assert final["c"].code is ErrorCode.NOT_EXECUTED, final["c"]
    assert tally.read_text().split() == ["a"]
