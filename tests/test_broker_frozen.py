"""A broker Redis frozen (SIGSTOP: a VM stall, a partition that keeps the TCP connection open)
while the ledger answers: a dispatcher's publish and revoke fail after ``BROKER_SOCKET_TIMEOUT_S``
instead of waiting for the thaw (kombu's default socket timeout is none). Found by a helper trying
to break the fleet: ``cancel()`` and ``submit()`` waited as long as the broker stayed frozen (40 s
and 100 s in its runs), a turn's driver too (stuck in a publish, so no tick could fail and give
up). The broker and the ledger are two private Redis servers here, as in docs/scaling.md."""

from __future__ import annotations

import os
import signal
import time

import pytest

from toolfleet import BrokerUnavailable, Dispatcher, ErrorCode, Settings
from toolfleet.dispatcher.client import CLOSE_WAIT_S
from toolfleet.worker.app import BROKER_SOCKET_TIMEOUT_S

from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started

MARGIN_S = 3.0


def test_cancel_and_submit_are_bounded_while_the_broker_is_frozen(private_redis, namespace, start_worker,
                                                                   workspace):
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=False)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, heartbeat_s=1.0, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    with Dispatcher(settings, make_registry()) as dispatcher:
        busy = dispatcher.submit([call("n", "wait_read", label="busy", seconds=25)], workspace=str(workspace))
        wait_started(dispatcher, busy.turn_id, "n")
        queued = dispatcher.submit([call("q", "wait_read", label="q", seconds=1)], workspace=str(workspace))
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            queued.cancel()  # the ledger marks q at once; the revoke to the workers fails on its timeout
            assert time.monotonic() - began < BROKER_SOCKET_TIMEOUT_S + MARGIN_S
            [result] = queued.results(timeout_s=10)
            assert result.code is ErrorCode.NOT_EXECUTED, result
            began = time.monotonic()
            with pytest.raises(BrokerUnavailable):
                dispatcher.submit([call("z", "wait_read", label="z")], workspace=str(workspace))
            assert time.monotonic() - began < BROKER_SOCKET_TIMEOUT_S + MARGIN_S
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        busy.cancel()
        assert busy.results(timeout_s=30)[0].code in (ErrorCode.CANCELLED, ErrorCode.OUTCOME_UNKNOWN)
        # thawed: the fleet takes calls again
        assert dispatcher.run([call("a", "wait_read", label="a")], workspace=str(workspace), timeout_s=60)[0].ok


def test_close_is_bounded_once_whatever_the_turns_while_the_broker_is_frozen(private_redis, namespace, start_worker,
                                                                              workspace):
    """Dispatcher.close() with the broker frozen and four turns open: each turn's cancel waits for
    the broker's socket timeout (its revoke), and they used to run one after another, so close()
    took a timeout per turn (4 x 5 s here). The cancels run side by side now: close() returns within
    its one bound (cancel_grace_s + CLOSE_WAIT_S), and every call is answered NOT_EXECUTED."""
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=False)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, heartbeat_s=1.0, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    dispatcher = Dispatcher(settings, make_registry())
    busy = dispatcher.submit([call("n", "wait_read", label="busy", seconds=25)], workspace=str(workspace))
    wait_started(dispatcher, busy.turn_id, "n")  # the worker's one process is busy: the next calls wait
    turns = [dispatcher.submit([call(f"q{i}", "wait_read", label=str(i))], workspace=str(workspace))
             for i in range(4)]
    os.kill(broker.proc.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        dispatcher.close()
        took_s = time.monotonic() - began
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    assert took_s < settings.cancel_grace_s + CLOSE_WAIT_S + MARGIN_S, took_s
    for turn in turns:
        [result] = turn.results(timeout_s=0)
        assert result.code is ErrorCode.NOT_EXECUTED, result
