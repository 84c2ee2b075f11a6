"""The idempotency journal, shown with the refund tool (tests/tools_for_tests.py) against its small
domain store (tests/refund_store.py): a refund is never paid twice, whatever the caller retries."""

from __future__ import annotations

import pytest

from toolfleet import ConfigurationError, ErrorCode, tool
from toolfleet.worker.journal import Journal

from . import refund_store
from .faults import call

OK_TEXT = "refunded 500 cents for order {order}"


def test_refund_that_lost_its_reply_is_replayed_not_repeated(dispatcher, worker, workspace):
    """The handler pays, then its reply never comes back (it hangs past its 3 s limit): the caller
    sees TIMEOUT. Asked again (a new turn, same order), the journal's holder is gone without an
    outcome, the probe finds the refund in the store, and the outcome is replayed as success."""
    ws = str(workspace)
    first = dispatcher.run([call("r1", "refund", order_id="A1", amount_cents=500, post_s=30)], workspace=ws,
                           timeout_s=60)[0]
    assert first.code is ErrorCode.TIMEOUT, first.content

    again = dispatcher.run([call("r2", "refund", order_id="A1", amount_cents=500)], workspace=ws, timeout_s=60)[0]
    assert again.ok, again.content
    assert again.content == OK_TEXT.format(order="A1")
    counts = refund_store.counts(workspace)
    assert counts["refunds"] == {"order-A1": 1}
    assert counts["runs"] == {"order-A1": 1}, "the refund handler must have run exactly once"


def test_caller_timeout_then_retry_waits_for_the_running_refund_and_replays_it(dispatcher, worker, workspace):
    """The caller gives up waiting (its own timeout) while the refund still runs, and asks again in
    a new turn: the second call waits for the first execution's outcome and replays it."""
    ws = str(workspace)
    slow = dispatcher.submit([call("r1", "refund", order_id="B2", amount_cents=500, post_s=1.5)], workspace=ws)
    with pytest.raises(TimeoutError):
        slow.results(timeout_s=0.3, cancel_on_timeout=False)
    retry = dispatcher.run([call("r2", "refund", order_id="B2", amount_cents=500)], workspace=ws, timeout_s=60)[0]
    assert retry.ok and retry.content == OK_TEXT.format(order="B2"), retry.content
    assert slow.results(timeout_s=30)[0].ok
    counts = refund_store.counts(workspace)
    assert counts["refunds"] == {"order-B2": 1} and counts["runs"] == {"order-B2": 1}


def test_finished_refund_is_replayed_without_running(dispatcher, worker, workspace):
    ws = str(workspace)
    first = dispatcher.run([call("r1", "refund", order_id="C3", amount_cents=500)], workspace=ws, timeout_s=60)[0]
    second = dispatcher.run([call("r1", "refund", order_id="C3", amount_cents=500)], workspace=ws, timeout_s=60)[0]
    assert first.ok and second.ok and second.content == first.content
    assert refund_store.counts(workspace)["runs"] == {"order-C3": 1}


def test_same_refund_twice_in_one_batch_runs_once(dispatcher, worker, workspace):
    calls = [call("r1", "refund", order_id="D4", amount_cents=500),
             call("r2", "refund", order_id="D4", amount_cents=500),
             call("r3", "refund", order_id="E5", amount_cents=500)]
    results = dispatcher.run(calls, workspace=str(workspace), timeout_s=60)
    assert all(r.ok for r in results), [r.content for r in results]
    assert results[0].content == results[1].content
    counts = refund_store.counts(workspace)
    assert counts["refunds"] == {"order-D4": 1, "order-E5": 1}
    assert counts["runs"] == {"order-D4": 1, "order-E5": 1}


def test_abandoned_refund_without_probe_is_outcome_unknown(dispatcher, worker, workspace):
    ws = str(workspace)
    first = dispatcher.run([call("r1", "refund_blind", order_id="F6", amount_cents=500, post_s=30)], workspace=ws,
                           timeout_s=60)[0]
    assert first.code is ErrorCode.TIMEOUT
    again = dispatcher.run([call("r2", "refund_blind", order_id="F6", amount_cents=500)], workspace=ws,
                           timeout_s=60)[0]
    assert again.code is ErrorCode.OUTCOME_UNKNOWN, again.content
    assert "no probe" in again.content
    assert refund_store.counts(workspace)["runs"] == {"order-F6": 1}


def test_probe_that_finds_nothing_lets_the_handler_run(dispatcher, worker, workspace, settings):
    """An execution that started and died before the money moved: the probe finds no refund, so
    the call runs (the effect happens once)."""
    from toolfleet.redis_client import connect

    journal = Journal(settings, connect(settings.ledger))
    key = journal.key("refund", "arg:order-G7")
    assert journal.begin(key, "dead-token", "old-turn:old-call").verdict == "new"
    assert journal.release(key, "dead-token")  # its worker died: no outcome
    result = dispatcher.run([call("r1", "refund", order_id="G7", amount_cents=500)], workspace=str(workspace),
                            timeout_s=60)[0]
    assert result.ok, result.content
    assert refund_store.counts(workspace)["refunds"] == {"order-G7": 1}
    assert journal.entry(key)["state"] == "done"


def test_journal_verdicts(settings):
    from toolfleet.models import ToolResult
    from toolfleet.redis_client import connect

    journal = Journal(settings, connect(settings.ledger))
    key = journal.key("t", "k")
    assert journal.begin(key, "a", "turn:1").verdict == "new"
    busy = journal.begin(key, "b", "turn:2")
    assert busy.verdict == "busy" and busy.holder == "turn:1"
    assert journal.release_owner(key, "turn:1")
    taken = journal.begin(key, "b", "turn:2")
    assert taken.verdict == "takeover" and taken.holder == "turn:1"
    result = ToolResult(call_id="2", name="t", status="ok", content="done once")
    assert journal.finish(key, result).content == "done once"
    other = ToolResult(call_id="3", name="t", status="ok", content="second outcome")
    assert journal.finish(key, other).content == "done once", "the first outcome wins"
    done = journal.begin(key, "c", "turn:3")
    assert done.verdict == "done" and done.result.content == "done once"


def test_probe_or_key_needs_a_journal():
    with pytest.raises(ConfigurationError, match="journal"):
        @tool(access="read", probe=lambda **_: None)
        def look(x: int) -> str:
            """Look.

            Args:
                x: X.
            """
            return ""


def test_writes_are_journaled_by_default_and_reads_are_not():
    from toolfleet import default_registry

    registry = default_registry(["tests.tools_for_tests"])
    assert registry.get("refund").journal and registry.get("write_file").journal
    assert not registry.get("read_file").journal and not registry.get("add_note").journal
    assert registry.get("refund").idempotency_key_for("t", "c", {"order_id": "9"}) == "arg:order-9"
    assert registry.get("write_file").idempotency_key_for("t", "c", {"path": "a"}) == "t:c"


def test_a_dead_executions_release_leaves_a_newer_execution_of_the_same_call_held(settings):
    """Both executions of one call have the same owner (turn_id:call_id): the main process that saw
    the stale one's pool process die releases by owner, but never the entry the newer claim holds."""
    from toolfleet.redis_client import connect

    journal = Journal(settings, connect(settings.ledger))
    key = journal.key("t", "newer-holds")
    assert journal.begin(key, "7", "turn:1").verdict == "new"  # the newer execution (claim token 7)
    assert not journal.release_owner(key, "turn:1", keep_token="7")
    assert journal.begin(key, "8", "turn:1").verdict == "busy"  # still held
    assert journal.release_owner(key, "turn:1", keep_token="9")  # a stale holder: released
