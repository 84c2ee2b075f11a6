"""Gray failure between a claim and its handler (guarantee F7, docs/guarantees.md): a worker
frozen while its claim's reply is in flight, or right after reading it, resumes after its caller
was told ``WORKER_LOST``. The handler used to start then, on the thaw, and its write landed after
the answer (a frozen holder acting after its lease: "a step of a holder that lost its lease is
refused where the effect happens"). A claim that took longer than ``recheck_after_s`` to reach
the handler is now checked again first; a quick one costs nothing. Real prefork workers: the pool
process stops itself right after its claim (tests/tools_for_late_claims.py), the test freezes
the rest of the worker and thaws it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from toolfleet import Dispatcher, ErrorCode, Settings
from toolfleet.tools.registry import default_registry
from toolfleet.worker.side_effects import recheck_after_s

from .conftest import FLEET_KEY
from .faults import call, freeze, pool_stopped_at, thaw, wait_until
from .fencing_trials import fencing_settings

MODULES = ["tests.tools_for_late_claims"]


@pytest.fixture
def settings(settings):
    return fencing_settings(settings)  # heartbeat 0.3 s (liveness bound 2.2 s)


def _stopped_after_claim(worker, folder: Path, call_id: str) -> int:
    return pool_stopped_at(worker, folder / f"claimed-{call_id}", "after its claim")


def test_a_handler_never_starts_after_its_caller_was_told_worker_lost(settings, start_worker, tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_DIR", str(tmp_path))
    worker = start_worker(args=["--tools", MODULES[0]], concurrency=1)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn = dispatcher.submit([call("w", "late_write", label="late")])
        _stopped_after_claim(worker, tmp_path, "w")
        freeze(worker)  # the main process too: its heartbeats stop
        try:
            [answer] = turn.results(timeout_s=30)  # at the liveness bound
        finally:
            thaw(worker)
        # the pool takes the next message only once the frozen execution ended: join on it
        [after] = dispatcher.run([call("e", "late_echo", text="after")], timeout_s=30)
    assert answer.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), answer  # journaled or not
    assert after.ok, after
    assert not (tmp_path / "wrote-late").exists(), "the handler ran after its caller was told its worker was lost"


def test_a_slow_claim_whose_call_is_still_held_runs(settings, start_worker, tmp_path, monkeypatch):
    """The check after a slow claim refuses only an execution that lost its call."""
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_DIR", str(tmp_path))
    worker = start_worker(args=["--tools", MODULES[0]], concurrency=1)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn = dispatcher.submit([call("w", "late_write", label="held")])
        pid = _stopped_after_claim(worker, tmp_path, "w")  # stopped at least recheck_after_s (the wait above)
        os.kill(pid, signal.SIGCONT)  # the main process never stopped: the worker stayed alive
        [result] = turn.results(timeout_s=30)
    assert result.ok, result
    assert (tmp_path / "wrote-held").exists()


def test_the_recheck_comes_before_any_answer_without_the_worker(settings):
    """Under half of ``cancel_grace_s`` and of a heartbeat, and at most 0.25 s."""
    assert recheck_after_s(settings) == min(0.25, settings.cancel_grace_s / 2, settings.heartbeat_s / 2)
    quick = settings.model_copy(update={"cancel_grace_s": 0.1, "heartbeat_s": 2.0})
    assert recheck_after_s(quick) == 0.05


def _split_fleet(private_redis, namespace, start_worker, tmp_path, monkeypatch):
    """A worker of one process whose ledger is a Redis of its own (persistent: it can be killed and
    started again with its data), the broker another; returns (settings, worker, ledger's server)."""
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_DIR", str(tmp_path))
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=5.0, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, args=["--tools", MODULES[0]], concurrency=1,
                          log_path=tmp_path / "worker.log")
    return settings, worker, ledger_server


def _ledger_gone_after_a_slow_claim(private_redis, namespace, start_worker, tmp_path, monkeypatch, tool: str,
                                    label: str, back_when: str):
    """A slow claim (its pool process stopped right after it) whose recheck finds the ledger's
    Redis gone (killed once the claim was made; the broker is another Redis), back once the
    worker logged ``back_when``. Returns the call's answer."""
    settings, worker, ledger_server = _split_fleet(private_redis, namespace, start_worker, tmp_path, monkeypatch)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn = dispatcher.submit([call("w", tool, label=label)])
        pid = _stopped_after_claim(worker, tmp_path, "w")
        stopped_at = time.monotonic()
        ledger_server.kill()
        # a slow claim is what this is about: its pool process stays stopped past recheck_after_s
        wait_until(lambda: time.monotonic() >= stopped_at + 2 * recheck_after_s(settings), 5, "a slow claim")
        try:
            os.kill(pid, signal.SIGCONT)  # the recheck now finds no Redis
            wait_until(lambda: back_when in worker.log_text(), 60, f"the worker logging {back_when!r}")
        finally:
            ledger_server.start()
        [answer] = turn.results(timeout_s=60)
    assert not (tmp_path / f"wrote-{label}").exists(), "the handler ran"
    return answer


def test_a_recheck_redis_could_not_answer_says_so(private_redis, namespace, start_worker, tmp_path, monkeypatch):
    """The recheck fails closed when the ledger's Redis stays away past the worker's retries (30 s):
    the handler does not start. Its answer (recorded once Redis is back: this execution still held
    the call) says the call did not run because Redis could not be reached, not that the execution
    had lost its call and "the caller's answer stands": that answer is the caller's answer."""
    answer = _ledger_gone_after_a_slow_claim(private_redis, namespace, start_worker, tmp_path, monkeypatch,
                                             "late_write_long", "unconfirmed", "could not confirm the fencing token")
    assert answer.code is ErrorCode.NOT_EXECUTED, answer
    assert "did not run" in answer.content, answer
    assert "could not be reached" in answer.content, answer
    assert "no longer held" not in answer.content, answer
    assert "answer for this call stands" not in answer.error.hint, answer


def test_a_soft_limit_landing_during_the_recheck_says_the_call_did_not_run(private_redis, namespace, start_worker,
                                                                          tmp_path, monkeypatch):
    """The call's soft time limit (4 s) lands while the recheck waits out the ledger's Redis: the
    handler never started, so the answer is NOT_EXECUTED, not TIMEOUT ("ran past its time limit and
    was stopped", "may have done part of its work")."""
    answer = _ledger_gone_after_a_slow_claim(private_redis, namespace, start_worker, tmp_path, monkeypatch,
                                             "late_write_short", "soft", "Soft time limit")
    assert answer.code is ErrorCode.NOT_EXECUTED, answer
    assert "did not run" in answer.content, answer


def test_a_handler_never_starts_after_its_caller_was_answered_while_it_waited_for_its_key(
        settings, start_worker, tmp_path, monkeypatch):
    """A journaled call (b) claimed quickly waits for another execution (a) that holds its
    idempotency key; the worker is frozen until b's caller has its answer (OUTCOME_UNKNOWN: no live
    worker), meanwhile a gives up without paying; thawed, b took the key over, its probe found no
    payment, and its handler paid after its caller was answered. Its wait is checked again
    before the handler starts, like a slow claim's."""
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_DIR", str(tmp_path))
    worker = start_worker(args=["--tools", MODULES[0]], concurrency=2)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        holder = dispatcher.submit([call("a", "late_pay", label="a", key="k", hold=True)])
        wait_until((tmp_path / "holding-a").exists, 30, "a holding the key")
        turn = dispatcher.submit([call("b", "late_pay", label="b", key="k")])
        wait_until((tmp_path / "busy-b").exists, 30, "b waiting for the key")  # its claim long done
        freeze(worker)
        try:
            [answer] = turn.results(timeout_s=30)  # at the liveness bound
            holder.results(timeout_s=30)
            (tmp_path / "go").touch()
        finally:
            thaw(worker)
        # b's execution reports once it ended (its outcome refused: a late note): join on it
        wait_until(lambda: dispatcher.ledger.late_notes(turn.turn_id).get("b"), 30, "b's execution ending")
    assert answer.code is ErrorCode.OUTCOME_UNKNOWN, answer
    assert not (tmp_path / "wrote-b").exists(), "b's handler paid after its caller was told OUTCOME_UNKNOWN"


def test_a_step_redis_could_not_confirm_says_so(private_redis, namespace, start_worker, tmp_path, monkeypatch):
    """A handler's ``check_fence`` right before its step finds the ledger's Redis gone past the
    worker's retries (30 s): the step is refused (fail closed). Its answer, recorded once Redis is
    back (the execution still held the call), says the fence could not be confirmed, not that the
    execution "no longer holds the call" and that "the caller's answer stands": it is the answer."""
    settings, worker, ledger_server = _split_fleet(private_redis, namespace, start_worker, tmp_path, monkeypatch)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn = dispatcher.submit([call("s", "late_step", label="step")])
        wait_until((tmp_path / "stepping-step").exists, 30, "the handler waiting before its step")
        ledger_server.kill()
        try:
            (tmp_path / "step").touch()
            wait_until(lambda: "could not confirm the fencing token" in worker.log_text(), 60, "the step refused")
        finally:
            ledger_server.start()
        [answer] = turn.results(timeout_s=60)
    assert not (tmp_path / "wrote-step").exists(), "the step was taken"
    assert answer.code is ErrorCode.OUTCOME_UNKNOWN, answer
    assert "no longer holds" not in answer.content, answer
    assert "could not confirm" in answer.content, answer
    assert "answer for this call stands" not in answer.error.hint, answer
