"""Closing a dispatcher ends its turns in the ledger before its connections go."""

from __future__ import annotations

import json
import logging
import time

from toolfleet import Dispatcher, ToolCall
from toolfleet.ledger import Ledger

from .conftest import make_registry
from .faults import wait_started


def call(cid: str, name: str, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments))


def test_turn_finished_just_before_close_is_marked_ended(settings, worker, caplog):
    """results() returns once the last result is in; the driver marks the turn ended just after.
    close() used to close the connection under it ("could not mark the turn ended (... Bad file
    descriptor)"), leaving the turn to its lease."""
    ledger = Ledger(settings)
    for _ in range(10):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="toolfleet"):
            with Dispatcher(settings, make_registry()) as dispatcher:
                turn = dispatcher.submit([call(f"c{j}", "wait_read", label=str(j)) for j in range(3)])
                turn.results(timeout_s=30)
        assert "could not mark" not in caplog.text
        assert ledger.redis.get(ledger.keys.turn_ended(turn.turn_id)) == b"every call has its result"
    ledger.redis.close()


def test_closing_a_dispatcher_cancels_its_running_turn_and_marks_it_ended(settings, worker):
    """A turn still running when its dispatcher closes is cancelled, not left to a driver whose
    connections are gone: the running call stops, the waiting one never starts, within the bound."""
    dispatcher = Dispatcher(settings, make_registry())
    turn = dispatcher.submit([call("long", "wait_read", label="a", seconds=30),
                              call("next", "wait_write", label="a")])
    wait_started(dispatcher, turn.turn_id, "long")
    closed_at = time.monotonic()
    dispatcher.close()
    took_s = time.monotonic() - closed_at
    assert took_s <= settings.cancel_grace_s + 3.5
    results = turn.results(timeout_s=0)
    assert [r.error.code for r in results] == ["CANCELLED", "NOT_EXECUTED"]
    ledger = Ledger(settings)
    assert ledger.redis.get(ledger.keys.turn_ended(turn.turn_id)) == b"cancelled"
    ledger.redis.close()


def test_close_racing_turns_opened_in_other_threads_raises_nothing_and_leaves_none_running(settings):
    """A breaker's find: close() took a snapshot of a WeakSet that other threads were adding to
    ("Set changed size during iteration": no turn cancelled, no connection closed), turns opened
    during or after close() started on reopened connections and were never cancelled, and a second
    close() waited the whole bound again. Now: every turn opened before close() is ended by it, a
    later open is refused, and close() again returns at once."""
    for _ in range(3):
        _close_while_four_threads_open_turns(settings)


def _close_while_four_threads_open_turns(settings) -> None:
    import threading

    from toolfleet.errors import ToolfleetError

    dispatcher = Dispatcher(settings, make_registry())
    opened, refused, stop = [], [], threading.Event()

    def open_turns() -> None:
        while not stop.is_set():
            try:
                opened.append(dispatcher.open_turn())
            except ToolfleetError:
                refused.append(1)
                return

    threads = [threading.Thread(target=open_turns) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(opened) < 20 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(opened) >= 20
    dispatcher.close()  # raises nothing
    stop.set()
    for thread in threads:
        thread.join(10)
    assert len(refused) == 4  # each thread's next open after close() was refused
    assert all(turn.done for turn in opened)  # ended by close(): none left to its lease
    began = time.monotonic()
    dispatcher.close()
    assert time.monotonic() - began < 0.5
