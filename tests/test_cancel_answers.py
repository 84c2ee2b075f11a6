"""What a cancelled turn tells about a call its driver did not see running: ``NOT_EXECUTED`` ("it
did not run") only where the ledger confirms no claim began the call; otherwise
``OUTCOME_UNKNOWN``. Found by a helper trying to break the fleet: a journaled write that paid,
whose worker was then killed, was sent again once its deadline had passed; the new message waited
behind a busy worker, the caller cancelled, and the dispatcher answered NOT_EXECUTED ("ask again"),
so following the hint paid twice."""

from __future__ import annotations

import pytest

from toolfleet import ErrorCode
from toolfleet.keys import SENT_AFTER, Keys, run_field

from . import fencing_trials as trials
from . import refund_store
from .faults import call, kill_pid, wait_started, wait_until


@pytest.fixture
def settings(settings):
    return trials.fencing_settings(settings)


def test_a_write_sent_again_after_its_worker_died_then_cancelled_is_outcome_unknown(dispatcher, start_worker,
                                                                                      workspace, settings):
    start_worker(concurrency=1)  # to be kept busy, so the message sent again waits in the queue
    busy = dispatcher.submit([call("n", "wait_read", label="busy", seconds=25)], workspace=str(workspace))
    wait_started(dispatcher, busy.turn_id, "n")
    victim_worker = start_worker(concurrency=1)
    turn = dispatcher.submit([call("r", "quick_refund_blind", order_id="K1", amount_cents=100, post_s=0.6)],
                             workspace=str(workspace))
    assert wait_started(dispatcher, turn.turn_id, "r")["worker"] == victim_worker.name
    wait_until(lambda: refund_store.counts(workspace)["refunds"].get("order-K1") == 1, 10, "the refund")
    kill_pid(victim_worker.proc.pid)
    for pid in victim_worker.children():
        kill_pid(pid)
    runs = Keys(settings.namespace).turn_runs(turn.turn_id)
    # the dispatcher sends it again once the dead execution's deadline has passed; the busy worker
    # leaves the new message queued
    wait_until(lambda: dispatcher.ledger.redis.hexists(runs, run_field(SENT_AFTER, "r")), 30, "the send again")
    turn.cancel()
    [result] = turn.results(timeout_s=30)
    assert result.code is ErrorCode.OUTCOME_UNKNOWN, result.content
    assert refund_store.counts(workspace)["refunds"]["order-K1"] == 1
    busy.cancel()


def test_a_call_claimed_but_not_yet_seen_started_is_not_answered_not_executed(settings, workspace):
    """The driver settles a cancelled turn from what it has read; a claim whose started event it has
    not read yet must not be answered "it did not run" (the ledger's unless_started refuses)."""
    from toolfleet import Dispatcher

    from .conftest import make_registry

    with Dispatcher(settings.model_copy(update={"require_live_worker": False}), make_registry()) as d:
        turn = d.submit([call("c", "wait_read", label="x", seconds=5)], workspace=str(workspace))
        assert d.ledger.claim_start(turn.turn_id, "c", "worker-not-seen") == "ok"  # as a worker would
        turn.cancel()
        turn._watch._settle_cancelled(["c"], {})  # as if the started event were not read yet
        result = d.ledger.results(turn.turn_id)["c"]
        assert result.code is ErrorCode.OUTCOME_UNKNOWN and "while the call ran" in result.content, result.content


def test_settling_a_cancel_kills_nothing_that_has_its_result_or_may_not_be_stopped(settings, workspace):
    """A call whose result the driver has not read yet keeps it (no OUTCOME_UNKNOWN, no locks held
    for its hard limit, no kill); a call declared not cancellable that a worker began runs to its
    end (no kill), whether or not the driver saw it start."""
    from toolfleet import Dispatcher
    from toolfleet.models import ToolResult

    from .conftest import make_registry

    with Dispatcher(settings.model_copy(update={"require_live_worker": False}), make_registry()) as d:
        turn = d.submit([call("done", "wait_read", label="x", seconds=5), call("keep", "settle_note", text="n")],
                        workspace=str(workspace))
        for call_id in ("done", "keep"):
            assert d.ledger.claim_start(turn.turn_id, call_id, "worker-not-seen") == "ok"
        worker_answer = ToolResult(call_id="done", name="wait_read", status="ok", content="read x")
        assert d.ledger.record_result(turn.turn_id, worker_answer)
        killed: list[list[str]] = []
        # cancel() itself revokes (no kill) the messages the driver has not yet seen start, which
        # races its read of the claims above: only a revoke with kill counts here
        turn._submitter.revoke = lambda task_ids, kill=False: killed.append(list(task_ids)) if kill else None
        turn.cancel()
        turn._watch._settle_cancelled(["done", "keep"], {})
        turn._watch._settle_cancelled(["keep"], {"keep": 0.0})
        results = d.ledger.results(turn.turn_id)
        assert results["done"].ok and "keep" not in results
        assert not any(killed), killed  # no task id was sent a kill


@pytest.mark.parametrize("other_worker", [True, False], ids=["another worker serves it", "no other worker"])
def test_a_call_not_cancellable_whose_worker_dies_after_the_cancel_still_gets_its_answer(
        dispatcher, start_worker, workspace, settings, other_worker):
    """A cancel lets a call declared not cancellable run to its end; if its worker then dies, the
    call still gets an answer within the liveness bound (it used to get none: the turn waited for
    ever, its driver thread alive even after the dispatcher closed). Found by a helper."""
    workers = [start_worker(concurrency=1) for _ in range(2 if other_worker else 1)]
    turn = dispatcher.submit([call("n", "settle_note", text="late", seconds=8)], workspace=str(workspace))
    record = wait_started(dispatcher, turn.turn_id, "n")
    victim = next(w for w in workers if w.name == record["worker"])
    turn.cancel()
    victim.kill()
    [result] = turn.results(timeout_s=settings.heartbeat_s * 4 + 12)
    assert result.code is ErrorCode.WORKER_LOST, result.content
    assert "not cancellable" in result.content
