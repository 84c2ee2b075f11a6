"""A worker dies under a call (SIGKILL of its pool process, or of the whole worker): a read runs
again, a journaled write goes through the journal, any other write gets WORKER_LOST, and the turn
never waits past its deadline."""

from __future__ import annotations

import pytest

from toolfleet import ErrorCode

from . import refund_store
from .faults import call, kill_pid, wait_started, wait_until

TURN_TIMEOUT_S = 60


@pytest.fixture
def settings(settings):
    """Fast heartbeats: a vanished worker is noticed in about 2.5 s instead of 7."""
    return settings.model_copy(update={"heartbeat_s": 0.5})


def test_read_is_run_again_after_its_process_is_killed(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("c1", "wait_read", label="a", seconds=3)], workspace=str(workspace))
    kill_pid(wait_started(dispatcher, turn.turn_id, "c1")["pid"])
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert result.ok, result.content
    assert result.attempts == 2


def test_journaled_refund_killed_after_paying_is_not_paid_again(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("r1", "refund", order_id="K1", amount_cents=500, post_s=5)],
                             workspace=str(workspace))
    pid = wait_started(dispatcher, turn.turn_id, "r1")["pid"]
    wait_until(lambda: refund_store.counts(workspace)["refunds"], 10, "the payment")
    kill_pid(pid)
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert result.ok and result.content == "refunded 500 cents for order K1", result.content
    assert result.attempts == 2
    counts = refund_store.counts(workspace)
    assert counts["refunds"] == {"order-K1": 1} and counts["runs"] == {"order-K1": 1}


def test_journaled_refund_killed_before_paying_is_paid_once(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("r1", "refund", order_id="K2", amount_cents=500, pre_s=5)],
                             workspace=str(workspace))
    pid = wait_started(dispatcher, turn.turn_id, "r1")["pid"]
    wait_until(lambda: refund_store.counts(workspace)["runs"], 10, "the handler's start")
    kill_pid(pid)
    result = turn.results(TURN_TIMEOUT_S)[0]
    # The probe found no refund, so the handler ran again; with pre_s=5 it then times out at 3 s.
    assert refund_store.counts(workspace)["refunds"].get("order-K2", 0) <= 1
    assert result.code in (None, ErrorCode.TIMEOUT), result.content


def test_journaled_write_without_probe_is_outcome_unknown(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("r1", "refund_blind", order_id="K3", amount_cents=500, post_s=5)],
                             workspace=str(workspace))
    pid = wait_started(dispatcher, turn.turn_id, "r1")["pid"]
    wait_until(lambda: refund_store.counts(workspace)["refunds"], 10, "the payment")
    kill_pid(pid)
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert result.code is ErrorCode.OUTCOME_UNKNOWN, result.content
    assert refund_store.counts(workspace)["runs"] == {"order-K3": 1}


def test_plain_write_gets_worker_lost(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("n1", "add_note", text="x", seconds=3)], workspace=str(workspace))
    kill_pid(wait_started(dispatcher, turn.turn_id, "n1")["pid"])
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert result.code is ErrorCode.WORKER_LOST, result.content
    assert refund_store.notes(workspace) == []


def test_whole_worker_killed_mid_batch(dispatcher, start_worker, workspace):
    """Two workers; the one running the refund vanishes (SIGKILL of its process group). With a
    Redis broker its messages would only come back after the visibility timeout: the dispatcher
    notices the missing heartbeat and sends reads and journaled writes again, and gives the rest
    WORKER_LOST."""
    workers = {w.name: w for w in (start_worker(concurrency=2), start_worker(concurrency=2))}
    calls = [call("c1", "wait_read", label="a", seconds=2.5),
             call("r1", "refund", order_id="W1", amount_cents=500, post_s=2),
             call("n1", "add_note", text="w", seconds=2.5)]
    turn = dispatcher.submit(calls, workspace=str(workspace))
    on = {c.id: wait_started(dispatcher, turn.turn_id, c.id)["worker"] for c in calls}
    wait_until(lambda: refund_store.counts(workspace)["refunds"], 10, "the payment")
    victim = on["r1"]
    workers[victim].kill()
    results = {r.call_id: r for r in turn.results(TURN_TIMEOUT_S)}
    assert results["c1"].ok, results["c1"].content
    assert results["r1"].ok and results["r1"].content == "refunded 500 cents for order W1", results["r1"].content
    if on["n1"] == victim:
        assert results["n1"].code is ErrorCode.WORKER_LOST, results["n1"].content
    else:
        assert results["n1"].ok
    counts = refund_store.counts(workspace)
    assert counts["refunds"] == {"order-W1": 1} and counts["runs"] == {"order-W1": 1}


def test_a_call_sent_again_that_the_broker_refuses_is_not_said_to_have_not_run(dispatcher, start_worker, workspace,
                                                                              monkeypatch):
    """Two workers; the one running a refund vanishes after paying (SIGKILL of its process group).
    Once the first execution's deadline has passed the dispatcher sends the call again, and the
    broker refuses that send (and every retry) for ``SEND_RETRY_S`` (cut to 1 s). The call's answer
    must not say it did not run: the refund was paid. Before: ``NOT_EXECUTED`` "it was not sent and
    did not run" (the retries went out as a first send, and gave up as one)."""
    import threading

    from toolfleet.dispatcher import sending
    from toolfleet.errors import BrokerUnavailable

    monkeypatch.setattr(sending, "SEND_RETRY_S", 1.0)
    workers = {w.name: w for w in (start_worker(concurrency=1), start_worker(concurrency=1))}
    turn = dispatcher.submit([call("r1", "refund", order_id="B1", amount_cents=500, post_s=5)],
                             workspace=str(workspace))
    victim = wait_started(dispatcher, turn.turn_id, "r1")["worker"]
    wait_until(lambda: refund_store.counts(workspace)["refunds"], 10, "the payment")
    refused = threading.Event()

    def broker_refuses(**_kwargs):
        refused.set()
        raise BrokerUnavailable(dispatcher.settings.redis_url, "the broker refuses publishes (test)")

    monkeypatch.setattr(dispatcher.submitter, "send", broker_refuses)
    workers[victim].kill()
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert refused.is_set(), "the call was not sent again"
    assert refund_store.counts(workspace)["refunds"] == {"order-B1": 1}
    assert result.code in (ErrorCode.OUTCOME_UNKNOWN, ErrorCode.WORKER_LOST), result.content


def test_a_send_that_landed_though_the_broker_said_it_failed_is_not_said_to_have_not_run(
        dispatcher, worker, workspace, monkeypatch):
    """A streamed call's publish reaches the queue but its reply is lost (the broker then refuses
    every retry for ``SEND_RETRY_S``, cut to 1 s): the worker runs the call meanwhile. Giving up
    the send must not answer ``NOT_EXECUTED`` over the execution (the ledger's "unless started");
    the call keeps its worker's real result. Before: ``NOT_EXECUTED`` "it was not sent and did not
    run", recorded first, and the execution's own result refused as a late note."""
    from toolfleet.dispatcher import sending
    from toolfleet.errors import BrokerUnavailable

    monkeypatch.setattr(sending, "SEND_RETRY_S", 1.0)
    real_send = dispatcher.submitter.send
    tally = workspace / "tally.txt"
    sends = []

    def reply_lost(**kwargs):
        sends.append(kwargs["call_id"])
        if len(sends) == 1:
            real_send(**kwargs)  # it lands, and a worker starts it
            wait_until(tally.exists, 20, "the execution of the call")
        raise BrokerUnavailable(dispatcher.settings.redis_url, "reply lost, then refused (test)")

    monkeypatch.setattr(dispatcher.submitter, "send", reply_lost)
    turn = dispatcher.open_turn(workspace=str(workspace))
    turn.add_calls([call("t1", "tally", text="ran", seconds=2)])
    turn.close()
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert len(sends) > 1, sends
    assert tally.read_text() == "ran\n"
    assert result.code is not ErrorCode.NOT_EXECUTED, result.content
    assert result.ok and result.content == "tallied ran", result.content
