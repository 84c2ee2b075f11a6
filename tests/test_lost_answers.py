"""A call whose answer Redis lost (evicted) after the dispatcher gave it, then delivered to a
worker: the claim refuses it (``done``: the runs hash's ``d:`` mark outlives the answer), and the
answer the worker records says what is known, never that the turn was cancelled."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from toolfleet import Dispatcher, ErrorCode, Settings
from toolfleet.keys import Keys
from toolfleet.ledger import Ledger
from toolfleet.models import CallEnvelope, ToolResult
from toolfleet.worker.execute import execute
from toolfleet.worker.runtime import Runtime

from . import refund_store
from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started, wait_until


def test_a_call_whose_dispatcher_answer_redis_lost_is_not_run_and_not_called_cancelled(
        redis_url, namespace, start_worker, workspace):
    """One worker process, busy with a 4 s call; the call queued behind it waits past
    ``max_queue_wait_s`` (1 s) and the dispatcher answers it ``TOOL_UNAVAILABLE``. Redis then loses
    that answer (the results hash's field deleted, as an eviction would), and the worker takes the
    message still queued: it does not run the call (no note added) and records ``NOT_EXECUTED``, as
    no claim ever began it (before: ``CANCELLED`` "the turn was cancelled", for a turn nobody
    cancelled)."""
    settings = Settings(redis_url=redis_url, namespace=namespace, max_queue_wait_s=1.0, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    client = redis.Redis.from_url(redis_url)
    results_key = Keys(namespace).turn_results
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.open_turn(workspace=str(workspace))
        turn.add_calls([call("busy", "wait_read", label="busy", seconds=4.0)])
        wait_started(dispatcher, turn.turn_id, "busy")
        turn.add_calls([call("queued", "add_note", text="must not run")])
        wait_until(lambda: turn.result("queued") is not None, 10, "the queued call's TOOL_UNAVAILABLE")
        assert turn.result("queued").code is ErrorCode.TOOL_UNAVAILABLE, turn.result("queued")
        client.hdel(results_key(turn.turn_id), "queued")  # Redis lost the answer
        wait_until(lambda: dispatcher.ledger.results(turn.turn_id).get("queued") is not None, 20,
                   "the worker's answer to the message still queued")
        answer = dispatcher.ledger.results(turn.turn_id)["queued"]
        turn.close()
        assert turn.result("busy").ok or turn.results(timeout_s=20)[0].ok
    assert answer.code is ErrorCode.NOT_EXECUTED, answer
    assert "Redis lost that answer" in answer.content and "never started" in answer.content
    assert refund_store.notes(workspace) == []


@pytest.mark.parametrize("began", [False, True])
def test_the_answer_to_a_lost_answer_says_whether_a_claim_began_the_call(settings, began):
    """The worker's body (``execute``, in this process, against the test's Redis) given a message of
    a call the dispatcher answered without a claim (the ``d:`` mark) and whose answer Redis lost:
    it runs nothing, and records ``NOT_EXECUTED`` when no claim began the call, ``OUTCOME_UNKNOWN``
    when one did (the watchdog answered a started call: whether that execution did the call's
    work is unknown)."""
    runtime = Runtime(settings, make_registry())
    ledger = Ledger(settings)
    turn_id = f"T{uuid.uuid4().hex}"
    ledger.open_turn(turn_id, {"c1": "add_note"})
    if began:
        assert ledger.claim_start(turn_id, "c1", "w@t", arm_wait_s=1) == "ok"
    ledger.record_result(turn_id, ToolResult.failure("c1", "add_note", ErrorCode.WORKER_LOST, "lost", "check"))
    redis.Redis.from_url(settings.ledger).hdel(Keys(settings.namespace).turn_results(turn_id), "c1")
    envelope = CallEnvelope(turn_id=turn_id, call_id="c1", name="add_note", arguments={"text": "must not run"},
                            workspace=None, session_id=None, time_limit_s=5, idempotency_key=f"{turn_id}:c1",
                            submitted_at=time.time()).model_dump(mode="json")
    result = execute(runtime, envelope, worker="w2@t", hard_limit_s=10)
    assert result.code is (ErrorCode.OUTCOME_UNKNOWN if began else ErrorCode.NOT_EXECUTED), result
    assert ledger.results(turn_id)["c1"] == result


@pytest.mark.parametrize("began", [False, True])
def test_a_message_of_an_ended_turn_says_did_not_run_only_when_no_claim_began_it(settings, began):
    """The worker's body given a message of a call whose turn is over (its dispatcher killed, its
    lease lapsed; or ended) with no result recorded: a redelivery of a call whose pool process
    died after the lease lapsed. It runs nothing. ``NOT_EXECUTED`` ("it was not run", the ledger's
    "never ran, safe to submit again" that a LangGraph resume acts on: integrations/takeover.py)
    only when no claim began the call; when one did, the earlier execution may have done the
    write, so the answer must not say it did not run. Before: ``NOT_EXECUTED`` either way, and a
    resume in another process ran the write a second time."""
    runtime = Runtime(settings, make_registry())
    ledger = Ledger(settings)
    turn_id = f"T{uuid.uuid4().hex}"
    ledger.open_turn(turn_id, {"c1": "add_note"})
    if began:
        assert ledger.claim_start(turn_id, "c1", "w@t", arm_wait_s=1) == "ok"  # then its process died
    ledger.end_turn(turn_id, "its dispatcher vanished (the lease lapsed)")
    envelope = CallEnvelope(turn_id=turn_id, call_id="c1", name="add_note", arguments={"text": "must not run"},
                            workspace=None, session_id=None, time_limit_s=5, idempotency_key=f"{turn_id}:c1",
                            submitted_at=time.time()).model_dump(mode="json")
    result = execute(runtime, envelope, worker="w2@t", hard_limit_s=10)
    if began:
        assert result.code is not ErrorCode.NOT_EXECUTED, result
        assert result.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), result
    else:
        assert result.code is ErrorCode.NOT_EXECUTED, result
    assert ledger.results(turn_id)["c1"] == result
