"""Fencing and the liveness bound (issues 11 and 19), one trial per case (the slow file repeats
them, tests/test_slow_fencing.py): a worker frozen (SIGSTOP of its process group) past the
liveness window and the time limit never acts twice or after the caller's answer; and when no live
worker serves a tool, its calls, queued or in flight, end within the liveness bound."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from toolfleet import ErrorCode
from toolfleet.dispatcher.availability import liveness_bound_s

from . import fencing_trials as trials
from .faults import call, freeze, kill_pid, thaw, wait_started, wait_until


@pytest.fixture
def settings(settings):
    return trials.fencing_settings(settings)


@pytest.fixture
def fleet(dispatcher, start_worker, workspace, settings):
    workers = [start_worker(concurrency=1), start_worker(concurrency=1)]
    return trials.Fleet(dispatcher, workers, workspace, settings, Counter())


@pytest.mark.parametrize("case", list(trials.CASES))
def test_frozen_worker_past_its_deadline(fleet, case):
    trials.run_trial(case, fleet, 0, trials.LONG_FREEZE_S, random.Random(19))
    trials.report(fleet.tally)


def test_check_fence_refuses_a_stale_execution(dispatcher, worker, workspace):
    """A handler whose call was answered by someone else is refused at its last moment, and its
    outcome is kept as a late note, not as the call's result."""
    turn = dispatcher.submit([call("w", "fenced_append", path="late.txt", line="late", seconds=0.6,
                                   running_mark="running")], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "w")
    # the handler itself, not only its claim: a slow claim is fenced again before it (F7), which
    # would refuse it before the step this test is about
    wait_until((workspace / "running").exists, 10, "the handler running")
    from toolfleet.models import ToolResult

    answer = ToolResult.failure("w", "fenced_append", ErrorCode.WORKER_LOST, "answered by the test", "")
    assert dispatcher.ledger.record_result(turn.turn_id, answer)
    assert turn.results(timeout_s=10)[0].code is ErrorCode.WORKER_LOST
    trials.wait_until(lambda: dispatcher.ledger.late_notes(turn.turn_id).get("w"), 10, "the late note")
    late = dispatcher.ledger.late_notes(turn.turn_id)["w"][0]
    assert late.code is ErrorCode.OUTCOME_UNKNOWN and "fencing token" in late.content, late.content
    assert not (workspace / "late.txt").exists()
    from rich.console import Console

    from toolfleet.trace import build_timeline, print_timeline

    console = Console(record=True, width=200)
    print_timeline(console, build_timeline(turn.turn_id, dispatcher.ledger.audit.read(turn.turn_id)))
    shown = console.export_text()
    assert "WORKER_LOST" in shown and "late outcome of a stale execution" in shown, shown


@pytest.fixture
def default_heartbeat(settings):
    return settings.model_copy(update={"heartbeat_s": 2.0})


def test_only_worker_of_a_tool_killed_mid_batch_ends_within_the_liveness_bound(default_heartbeat, start_worker,
                                                                                workspace):
    """Issue 11 case 1: 5 calls of an 8 s tool, the only worker serving it SIGKILLed 4 s in: every
    call ends within the liveness bound (9 s with the default 2 s heartbeat), not 600 s."""
    from toolfleet import Dispatcher

    from .conftest import make_registry

    settings = default_heartbeat
    worker = start_worker(concurrency=2, settings=settings)
    with Dispatcher(settings, make_registry()) as dispatcher:
        calls = [call(f"k{i}", "wait_read", label=f"k{i}", seconds=8) for i in range(5)]
        turn = dispatcher.submit(calls, workspace=str(workspace))
        wait_started(dispatcher, turn.turn_id, "k0")
        assert not turn.wait(4.0)
        worker.kill()
        killed_at = time.monotonic()
        results = turn.results(timeout_s=60)
        took_s = time.monotonic() - killed_at
    bound = liveness_bound_s(settings)
    print(f"\nonly worker killed: all 5 calls ended {took_s:.1f} s after the kill (bound {bound:g} s): "
          f"{[r.code.value for r in results]}")
    assert took_s <= bound + 1.0, f"took {took_s:.1f} s, bound {bound:g} s"
    codes = [r.code for r in results]
    assert all(c in (ErrorCode.WORKER_LOST, ErrorCode.TOOL_UNAVAILABLE) for c in codes), codes
    assert ErrorCode.TOOL_UNAVAILABLE in codes and ErrorCode.WORKER_LOST in codes


def test_a_stale_execution_whose_pool_process_dies_leaves_a_late_note(fleet):
    """A frozen worker's call was answered without it (a write neither idempotent nor journaled:
    WORKER_LOST once the worker is silent past the liveness bound); the stale execution's pool
    process then dies (the OOM killer, a crash) before its time limit and before it reports. Its
    message goes back to the queue and can only be refused, so the death is the operator's late
    note (guarantee F3), as a stale execution that ended would leave."""
    d = fleet.dispatcher
    c = call("n", "add_note", text="dies-stale", seconds=3.0)
    turn = d.submit([c], workspace=str(fleet.workspace))
    record = wait_started(d, turn.turn_id, c.id)
    victim = fleet.by_name(record["worker"])
    freeze(victim)
    try:
        result = turn.results(timeout_s=60)[0]
    finally:
        kill_pid(record["pid"])
        thaw(victim)
    assert result.code == ErrorCode.WORKER_LOST, result.content
    wait_until(lambda: d.ledger.late_notes(turn.turn_id).get(c.id), trials.JOIN_S,
               "the dead stale execution's late note")
    assert d.ledger.results(turn.turn_id)[c.id].code == ErrorCode.WORKER_LOST
