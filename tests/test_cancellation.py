"""Cancellation, hardened: partial output is kept, Python handlers get the cancel signal and a grace
period, and a turn can be cancelled from another process with `toolfleet cancel TURN_ID`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from toolfleet import ErrorCode

from .conftest import ROOT
from .faults import call, wait_started

LINE_A_SECOND = "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; sleep 1; done"
FINAL_WITHIN_S = 1.0  # product promise: results final within 1 s of the cancel


def test_command_cancelled_at_3_5_s_keeps_its_first_lines(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("c1", "run_command", command=LINE_A_SECOND)], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c1")
    assert not turn.wait(3.5)  # the command runs for 3.5 s
    cancelled_at = time.monotonic()
    turn.cancel()
    result = turn.results(timeout_s=10)[0]
    assert time.monotonic() - cancelled_at <= FINAL_WITHIN_S
    assert result.code is ErrorCode.CANCELLED, result.content
    for n in (1, 2, 3):
        assert f"line {n}\n" in result.content, result.content
    assert "line 5" not in result.content


def test_command_timed_out_keeps_its_first_lines(dispatcher, worker, workspace):
    result = dispatcher.run([call("c1", "run_command", command=LINE_A_SECOND, timeout_s=3.5)],
                            workspace=str(workspace), timeout_s=30)[0]
    assert result.code is ErrorCode.TIMEOUT, result.content
    for n in (1, 2, 3):
        assert f"line {n}\n" in result.content, result.content
    assert "line 5" not in result.content


def test_python_handler_gets_the_cancel_signal_and_a_grace_period(dispatcher, worker, workspace):
    """The handler sees ctx.cancelled, takes 0.3 s (< the 0.5 s grace) to clean up, and reports
    what it did: nothing killed it before it was done."""
    turn = dispatcher.submit([call("c1", "count_until_cancelled", seconds=8, cleanup_s=0.3)],
                             workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c1")
    assert not turn.wait(0.5)
    cancelled_at = time.monotonic()
    turn.cancel()
    result = turn.results(timeout_s=10)[0]
    assert time.monotonic() - cancelled_at <= FINAL_WITHIN_S
    assert result.code is ErrorCode.CANCELLED
    assert "tick 1" in result.content and "cleaned up" in result.content, result.content
    assert result.worker is not None  # the worker's own result, not the dispatcher's placeholder


def test_handler_that_ignores_the_signal_is_stopped_after_the_grace_period(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("c1", "stubborn_sleep", seconds=20)], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c1")
    cancelled_at = time.monotonic()
    turn.cancel()
    result = turn.results(timeout_s=10)[0]
    assert time.monotonic() - cancelled_at <= FINAL_WITHIN_S
    assert result.code is ErrorCode.CANCELLED, result.content


def test_toolfleet_cancel_from_another_process(dispatcher, worker, workspace, settings):
    """`toolfleet cancel TURN_ID` in a separate process: the running call is stopped (CANCELLED,
    with its output so far), the one waiting for it never starts (NOT_EXECUTED)."""
    calls = [call("c1", "run_command", command=LINE_A_SECOND),
             call("c2", "run_command", command="echo never")]  # waits for c1 (both write everything)
    turn = dispatcher.submit(calls, workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c1")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "toolfleet", "cancel", turn.turn_id, "--redis-url",
                           settings.redis_url, "--namespace", settings.namespace],
                          env=env, capture_output=True, text=True, timeout=60)
    cancelled_at = time.monotonic()
    assert proc.returncode == 0, proc.stderr
    assert "cancelled" in proc.stdout
    first, second = turn.results(timeout_s=10)
    assert time.monotonic() - cancelled_at <= FINAL_WITHIN_S
    assert first.code is ErrorCode.CANCELLED and "line 1" in first.content, first.content
    assert second.code is ErrorCode.NOT_EXECUTED


def test_toolfleet_cancel_of_an_unknown_turn_fails_clearly(settings):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "toolfleet", "cancel", "no-such-turn", "--redis-url",
                           settings.redis_url, "--namespace", settings.namespace],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "no turn 'no-such-turn'" in proc.stderr


def test_toolfleet_cancel_and_trace_print_a_turn_id_with_brackets_as_text(dispatcher, settings):
    """A turn id is the caller's text (``open_turn(turn_id=...)``): ``[/x]`` in it is printed as is
    (before: the turn was cancelled, then rich's MarkupError ended the command with a traceback)."""
    turn = dispatcher.open_turn(turn_id="t[/x]")
    turn.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    where = ["--redis-url", settings.redis_url, "--namespace", settings.namespace]
    done = subprocess.run([sys.executable, "-m", "toolfleet", "cancel", "t[/x]", *where],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "turn t[/x] " in done.stdout, done.stderr
    traced = subprocess.run([sys.executable, "-m", "toolfleet", "trace", "t[/y]", *where],
                            env=env, capture_output=True, text=True, timeout=60)
    assert "MarkupError" not in traced.stderr and "turn t[/y] " in traced.stdout + traced.stderr, traced.stderr


def test_write_that_finishes_after_a_cancel_keeps_its_real_result(dispatcher, worker, workspace):
    """The turn is cancelled (and its waiting tasks revoked) while a non-cancellable write runs.
    Since Celery 5.6.2 a revoke can leave REVOKED in Celery's result store for a task that still
    finishes; toolfleet never reads that state: the ledger holds the write's real result."""
    from . import refund_store

    turn = dispatcher.submit([call("s1", "settle_note", text="kept", seconds=1.5),
                              call("s2", "settle_note", text="kept")],  # same resource: waits for s1
                             workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "s1")
    turn.cancel()
    first, second = turn.results(timeout_s=30)
    assert first.ok and first.content == "noted kept", first.content
    assert second.code is ErrorCode.NOT_EXECUTED
    assert refund_store.notes(workspace) == ["kept"]


def test_toolfleet_cancel_of_a_finished_turn_says_so(settings, dispatcher, worker, workspace):
    turn = dispatcher.submit([call("c1", "run_command", command="echo done")], workspace=str(workspace))
    assert turn.results(timeout_s=60)[0].ok
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "toolfleet", "cancel", turn.turn_id, "--redis-url",
                           settings.redis_url, "--namespace", settings.namespace],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "already finished" in proc.stdout
    assert turn.results(timeout_s=5)[0].ok  # the result stands


def test_printed_follow_up_commands_name_the_namespace(settings):
    from toolfleet.cli import where

    assert f"--namespace {settings.namespace}" in where(settings)
    secret = settings.model_copy(update={"redis_url": "redis://:hunter2@10.0.0.5:6379/0"})
    assert "hunter2" not in where(secret)


def test_calls_submitted_under_a_cancelled_turn_id_say_they_did_not_run(dispatcher, worker, workspace):
    """A turn id whose turn was cancelled, taking a new batch (a resumed agent reusing its id):
    the new calls do not run, and their results say so (NOT_EXECUTED), not that they "had started
    before" (CANCELLED), which only a call redelivered after its start may say."""
    from . import refund_store

    first = dispatcher.submit([call("w1", "wait_write", label="a", seconds=30)], workspace=str(workspace))
    wait_started(dispatcher, first.turn_id, "w1")
    first.cancel()
    assert first.results(timeout_s=30)[0].code is ErrorCode.CANCELLED
    again = dispatcher.submit([call("n1", "add_note", text="late"), call("r1", "wait_read", label="b")],
                              workspace=str(workspace), turn_id=first.turn_id)
    results = again.results(timeout_s=30)
    assert [r.code for r in results] == [ErrorCode.NOT_EXECUTED, ErrorCode.NOT_EXECUTED], results
    assert all("had started before" not in r.content for r in results), results
    assert refund_store.notes(workspace) == []


TERM_TRAP = "trap 'echo got TERM; exit 3' TERM; echo started; sleep 30 & wait"


def _cancelled_while_running(dispatcher, workspace, command: str, running_s: float):
    """The result of ``command`` cancelled once it has run ``running_s`` (CANCELLED asserted)."""
    turn = dispatcher.submit([call("c1", "run_command", command=command)], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c1")
    assert not turn.wait(running_s)  # running
    turn.cancel()
    result = turn.results(timeout_s=10)[0]
    assert result.code is ErrorCode.CANCELLED, result.content
    return result


def test_a_cancelled_command_gets_term_before_kill(dispatcher, worker, workspace):
    """A cancel TERMs the command's processes first (tools/command.py _stop_group), so its trap
    runs and its last words are in the result; a KILL comes only TERM_GRACE_S later. (The
    sandbox's own deadline, ``timeout``, once moved the command out of the group TERM went to.)"""
    result = _cancelled_while_running(dispatcher, workspace, TERM_TRAP, 1.0)
    assert "started" in result.content and "got TERM" in result.content, result.content


def test_a_command_past_its_time_limit_gets_term_before_kill(dispatcher, worker, workspace):
    result = dispatcher.run([call("c1", "run_command", command=TERM_TRAP, timeout_s=1.5)],
                            workspace=str(workspace), timeout_s=30)[0]
    assert result.code is ErrorCode.TIMEOUT, result.content
    assert "started" in result.content and "got TERM" in result.content, result.content


def test_a_cancelled_command_gets_one_term(dispatcher, worker, workspace):
    """One TERM, not two: a program that treats a second TERM as "quit now, no clean-up" keeps its
    clean-up (a breaker's trial: the sandbox's deadline, then inside the sandbox and in the group
    the TERM goes to, sent the command a second TERM in about 1 run of 4)."""
    command = "n=0; trap 'n=$((n+1)); echo TERM $n' TERM; echo started; while :; do sleep 0.02; done"
    for _ in range(3):
        result = _cancelled_while_running(dispatcher, workspace, command, 0.5)
        assert "TERM 1" in result.content and "TERM 2" not in result.content, result.content
