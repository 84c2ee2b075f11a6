"""The worker's main process never waits on the ledger's Redis for long: it is the process that
enforces every running call's hard time limit, so a hook of one call (a kill at its hard limit,
a dead pool process) that waited on a ledger that is gone or frozen would let every other call
run past its own limit. The broker is another Redis here, so the main loop itself goes on."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from toolfleet import Dispatcher, ErrorCode, Settings
from toolfleet.worker.main_steps import DRAIN_S, MAIN_WAIT_S, MainSteps
from toolfleet.worker.runtime import MAIN_SOCKET_TIMEOUT_S

from .conftest import FLEET_KEY, make_registry
from .faults import call, kill_pid, wait_started, wait_until

# swallowing_sleep: time limit 1 s, so the soft limit comes at 1.5 s and, with kill_grace_s=1.0,
# the hard limit (the kill) at 2.5 s after the start
HARD_LIMIT_S = 2.5
MARGIN_S = 5.0  # the bound asserted: the second call is killed within its hard limit + this


@pytest.mark.parametrize("trouble", ["frozen", "down", "frozen, worker stopped"])
def test_a_ledger_in_trouble_does_not_stop_the_main_process_killing_calls_at_their_hard_limit(
        private_redis, namespace, start_worker, workspace, tmp_path, trouble):
    """Two calls that swallow their soft time limit run in two pool processes; the ledger's Redis
    is frozen (SIGSTOP) or killed after both started. The first call's kill at its hard limit makes
    the main process record its ``TIMEOUT``; the second call must still be killed at its own hard
    limit meanwhile (before: the main process waited on the ledger's retry budget, 30 s and more,
    first). When the ledger is back, both calls end ``TIMEOUT`` with their run facts. A worker told
    to stop (warm shutdown) while the ledger is still frozen exits within its bound (the steps
    still queued get ``DRAIN_S``, each read ``MAIN_SOCKET_TIMEOUT_S``); its calls still end."""
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=1.0, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, concurrency=2, log_path=tmp_path / "worker.log")
    with Dispatcher(settings, make_registry()) as dispatcher:
        first = dispatcher.submit([call("a", "swallowing_sleep", seconds=60)], workspace=str(workspace))
        wait_started(dispatcher, first.turn_id, "a")
        second = dispatcher.submit([call("b", "swallowing_sleep", seconds=60)], workspace=str(workspace))
        wait_started(dispatcher, second.turn_id, "b")
        pid = ledger_server.proc.pid
        if trouble.startswith("frozen"):
            os.kill(pid, signal.SIGSTOP)
        else:
            ledger_server.kill()
        troubled_at = time.monotonic()
        try:
            wait_until(lambda: f"{first.turn_id}:a" in _hard_limit_lines(worker), HARD_LIMIT_S + MARGIN_S,
                       "the first call killed at its hard limit")
            wait_until(lambda: f"{second.turn_id}:b" in _hard_limit_lines(worker), HARD_LIMIT_S + MARGIN_S,
                       "the second call killed at its hard limit while the ledger is in trouble")
            assert time.monotonic() - troubled_at < HARD_LIMIT_S + MARGIN_S
            if trouble.endswith("stopped"):
                worker.proc.send_signal(signal.SIGTERM)
                worker.proc.wait(timeout=DRAIN_S + 2 * MAIN_SOCKET_TIMEOUT_S + MARGIN_S)
        finally:
            if trouble.startswith("frozen"):
                os.kill(pid, signal.SIGCONT)
            else:
                ledger_server.start()
        results = first.results(timeout_s=60) + second.results(timeout_s=60)
    for result in results:
        if trouble.endswith("stopped"):  # recorded by the worker's last steps or by the dispatcher
            assert result.code in (ErrorCode.TIMEOUT, ErrorCode.WORKER_LOST), result
            continue
        assert result.code is ErrorCode.TIMEOUT, result
        assert result.attempts == 1 and result.worker, result  # the run facts, from the claim (E6)


def test_pool_deaths_while_the_ledger_is_frozen_do_not_add_up_their_waits(
        private_redis, namespace, start_worker, workspace, tmp_path):
    """Three pool processes die together while the ledger is frozen, beside a call that swallows
    its soft limit. The main process waits for the first death's step (its claim marked dead) at
    most ``MAIN_WAIT_S``, and not for the others while that one still waits for Redis: the call
    is killed within its hard limit + ``MAIN_WAIT_S`` + 1 s (before: 2 s per death, one after
    another, in the event loop; found by a review helper)."""
    deaths = 3
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=1.0, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, concurrency=deaths + 1, log_path=tmp_path / "worker.log")
    with Dispatcher(settings, make_registry()) as dispatcher:
        victims = []
        for i in range(deaths):
            turn = dispatcher.submit([call(f"v{i}", "stubborn_sleep", seconds=25)], workspace=str(workspace))
            victims.append(wait_started(dispatcher, turn.turn_id, f"v{i}")["pid"])
        swallower = dispatcher.submit([call("a", "swallowing_sleep", seconds=60)], workspace=str(workspace))
        wait_started(dispatcher, swallower.turn_id, "a")
        started = time.monotonic()
        os.kill(ledger_server.proc.pid, signal.SIGSTOP)
        try:
            for pid in victims:
                kill_pid(pid)
            wait_until(lambda: f"{swallower.turn_id}:a" in _hard_limit_lines(worker), 30, "the kill of call a")
            late_s = time.monotonic() - started - HARD_LIMIT_S
        finally:
            os.kill(ledger_server.proc.pid, signal.SIGCONT)
    assert late_s < MAIN_WAIT_S + 1.0, f"call a was killed {late_s:.2f} s past its hard limit"


def test_a_read_whose_process_dies_during_a_ledger_blip_is_run_again(
        private_redis, namespace, start_worker, workspace):
    """The ledger's Redis is down for 1 s from just before a read's pool process is killed: the
    dead process's step (its claim marked dead) waits Redis out, off the event loop, so the copy
    of the message delivered again runs the read (attempt 2), as without the blip (before: one try,
    dropped; the copy found the claim live and the call ended WORKER_LOST; found by a review helper)."""
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=1.0, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=2)
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("c1", "count_until_cancelled", seconds=2)], workspace=str(workspace))
        pid = wait_started(dispatcher, turn.turn_id, "c1")["pid"]
        ledger_server.kill()
        kill_pid(pid)
        time.sleep(1.0)  # the blip itself: Redis is away this long
        ledger_server.start()
        (result,) = turn.results(timeout_s=60)
    assert result.ok and result.attempts == 2, result


def test_main_steps_run_in_order_wait_once_while_stuck_and_drain():
    """MainSteps alone: steps run in the order given on one thread; a step's exception is logged,
    never raised; a waited step that outlasts its wait makes the next waited ones not wait until it
    ends; ``drain`` waits for everything queued even then (bounded by its timeout)."""
    steps, ran, release = MainSteps(), [], threading.Event()
    steps.run(lambda: ran.append(1))
    steps.run(lambda: 1 / 0)  # logged
    assert steps.run(lambda: ran.append(2), wait_s=5.0) and ran == [1, 2]
    assert not steps.run(release.wait, wait_s=0.05)  # stuck: outlasts its wait
    waited_at = time.monotonic()
    assert not steps.run(lambda: ran.append(3), wait_s=5.0)  # not waited while the stuck one runs
    assert time.monotonic() - waited_at < 1.0
    assert not steps.drain(timeout_s=0.05)
    release.set()
    assert steps.drain(timeout_s=5.0) and ran == [1, 2, 3]
    assert steps.run(lambda: ran.append(4), wait_s=5.0) and ran == [1, 2, 3, 4]  # waits again


def _hard_limit_lines(worker) -> str:
    return "\n".join(line for line in worker.log_text().splitlines() if "Hard time limit" in line)
