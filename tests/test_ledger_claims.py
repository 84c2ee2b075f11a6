"""A claim refuses every call that already has its result (``done``), whoever recorded it and
whatever Redis lost since: the claim reads the results hash only for a call begun before or a turn
whose runs hash is gone, and trusts the ``d:`` mark (toolfleet/keys.py, ``Keys.turn_runs``) for
the results no claim made (the dispatcher's own, a denial). A result the claim missed would let a
message still in flight run a call whose caller was already told its outcome.

Talks to the ledger's scripts directly (the unit here), on the real Redis of the suite."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from toolfleet.breaker import Breakers
from toolfleet.dispatcher.approvals import Approvals, PendingCall
from toolfleet.keys import Keys
from toolfleet.ledger import Ledger
from toolfleet.models import ErrorCode, ToolResult
from toolfleet.policy.rules import RuleStore

_turns = itertools.count()


@pytest.fixture
def ledger(settings):
    return Ledger(settings, retry_s=5)


def new_turn(ledger: Ledger, calls=("c1", "c2", "c3")) -> str:
    turn_id = f"T{next(_turns)}"
    ledger.open_turn(turn_id, {c: "noop" for c in calls})
    return turn_id


def ok(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, name="noop", status="ok", content="ok")


def timeout(call_id: str) -> ToolResult:
    return ToolResult.failure(call_id, "noop", ErrorCode.TIMEOUT, "waited too long in the queue", "retry")


def test_a_result_the_dispatcher_recorded_refuses_the_message_still_queued(ledger):
    turn = new_turn(ledger)
    assert ledger.record_result(turn, timeout("c1"), unless_started=True)  # queue wait over
    assert ledger.record_result(turn, timeout("c2"))  # the dispatcher's own, unfenced
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"
    assert ledger.claim_start(turn, "c2", "w@t", arm_wait_s=1) == "done"
    assert ledger.claim_start(turn, "c3", "w@t", arm_wait_s=1) == "ok"


def test_a_workers_result_refuses_a_redelivered_copy(ledger):
    turn = new_turn(ledger)
    claim = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1)
    assert claim == "ok"
    assert ledger.record_result(turn, ok("c1"), fencing_token=claim.token)
    assert ledger.claim_start(turn, "c1", "w2@t", arm_wait_s=1) == "done"


def test_the_same_result_recorded_again_after_a_lost_reply_is_no_late_note(ledger):
    """A worker's record retried after its reply was lost (a dropped connection, a soft time limit
    landing mid-reply) finds its own result there: kept (True), no late note; another result with
    the same token still is one."""
    turn = new_turn(ledger)
    claim = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1)
    assert ledger.record_result(turn, ok("c1"), fencing_token=claim.token)
    assert ledger.record_result(turn, ok("c1"), fencing_token=claim.token)
    assert ledger.late_notes(turn) == {}
    assert not ledger.record_result(turn, timeout("c1"), fencing_token=claim.token)
    assert [r.code for r in ledger.late_notes(turn)["c1"]] == [ErrorCode.TIMEOUT]


def test_a_denied_call_is_refused(ledger, settings):
    turn = new_turn(ledger)
    approvals = Approvals(ledger, RuleStore(ledger.redis, Keys(settings.namespace), settings.redis_url))
    approvals.hold(turn, [PendingCall(turn, "c1", "noop", 0, {}, "asks first")])
    approvals.deny(turn, "c1", "no", by="test")
    assert ledger.results(turn)["c1"].error.code == ErrorCode.PERMISSION_DENIED
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"


def test_a_result_whose_runs_hash_redis_evicted_is_still_found(ledger, settings):
    """Eviction (maxmemory) can drop one key of a turn and keep another: the claim then looks."""
    turn = new_turn(ledger)
    claim = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1)
    assert ledger.record_result(turn, ok("c1"), fencing_token=claim.token)
    assert ledger.record_result(turn, timeout("c2"), unless_started=True)
    ledger.redis.delete(Keys(settings.namespace).turn_runs(turn))
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"
    assert ledger.claim_start(turn, "c2", "w@t", arm_wait_s=1) == "done"


def test_results_restored_after_redis_lost_the_turn_are_refused(ledger, settings):
    turn = new_turn(ledger)
    keys = Keys(settings.namespace)
    ledger.redis.delete(*(getattr(keys, name)(turn) for name in ("turn_calls", "turn_runs", "turn_results",
                                                                 "turn_events", "turn_armed")))
    ledger.renew_lease(turn)
    ledger.reopen(turn, {"c1": "noop", "c2": "noop"}, [ok("c1")], armed=True)
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"
    assert ledger.claim_start(turn, "c2", "w@t", arm_wait_s=1) == "ok"


def test_placeholders_of_a_cancel_are_refused_without_the_cancelled_flag(ledger, settings):
    """A cancel decides the calls not started (NOT_EXECUTED), also those added after it; the claim
    must refuse them even when Redis lost the small ``cancelled`` key (evicted) and the turn lives."""
    turn = new_turn(ledger, ("c1", "c2"))
    running = ledger.claim_start(turn, "c2", "w@t", arm_wait_s=1)
    assert running == "ok"
    assert ledger.cancel(turn) == 1
    assert ledger.add_calls(turn, {"c3": "noop"}) == {"c3"}
    ledger.redis.delete(Keys(settings.namespace).turn_cancelled(turn))
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"
    assert ledger.claim_start(turn, "c3", "w@t", arm_wait_s=1) == "done"


def test_a_turn_id_opened_again_after_its_runs_were_lost_keeps_its_results(ledger, settings):
    """A resumed graph submits again under the same turn id; the results that survived count."""
    turn = new_turn(ledger, ("c1",))
    claim = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1)
    assert ledger.record_result(turn, ok("c1"), fencing_token=claim.token)
    keys = Keys(settings.namespace)
    ledger.redis.delete(keys.turn_runs(turn), keys.turn_calls(turn))
    assert ledger.open_turn(turn, {"c1": "noop"}) == "0-0"  # its driver reads the whole stream
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"


def test_an_exclusive_open_of_a_turn_id_opened_by_another_process_writes_nothing(ledger, settings):
    """The successor turn of a LangGraph takeover is opened exclusively: of processes opening it at
    once, one does; the other gets TurnExists and its calls are not registered. A turn id whose calls
    hash was lost (its results kept) is opened again, as a resumed graph does."""
    from toolfleet.errors import TurnExists

    turn = f"T{next(_turns)}"
    assert ledger.open_turn(turn, {"c1": "noop"}, exclusive=True) != "0-0"
    with pytest.raises(TurnExists):
        ledger.open_turn(turn, {"c1": "noop", "c2": "noop"}, exclusive=True, armed=False)
    assert ledger.calls(turn) == {"c1": "noop"}
    assert ledger.redis.exists(Keys(settings.namespace).turn_armed(turn))  # left as its opener made it
    claim = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1)
    assert ledger.record_result(turn, ok("c1"), fencing_token=claim.token)
    ledger.redis.delete(Keys(settings.namespace).turn_calls(turn))
    assert ledger.open_turn(turn, {"c1": "noop"}, exclusive=True) == "0-0"


# the steps that write a result or lose data, in any order, against the safety rule: a call with a
# result in the results hash is never claimed to run
STEPS = st.lists(st.tuples(st.sampled_from(["claim", "record_claimed", "record_stale", "record_unfenced",
                                            "record_unless_started", "lose_runs", "lose_cancelled",
                                            "cancel", "add", "open_again"]),
                           st.sampled_from(["c1", "c2", "c3"])), max_size=14)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_no_claim_runs_a_call_that_has_its_result(ledger, settings, steps):
    turn = new_turn(ledger, ("c1", "c2"))
    runs_key = Keys(settings.namespace).turn_runs(turn)
    tokens: dict[str, int] = {}
    for step, call_id in steps:
        if step == "claim":
            had = ledger.redis.hexists(Keys(settings.namespace).turn_results(turn), call_id)
            claim = ledger.claim_start(turn, call_id, "w@t", arm_wait_s=1)
            if had:  # refused: done (or cancelled, which runs nothing either)
                assert claim in ("done", "cancelled"), (steps, claim)
            elif claim in ("ok", "restarted"):
                tokens[call_id] = claim.token
        elif step == "record_claimed" and call_id in tokens:
            ledger.record_result(turn, ok(call_id), fencing_token=tokens[call_id])
        elif step == "record_stale" and call_id in tokens:
            ledger.record_result(turn, ok(call_id), fencing_token=tokens[call_id] - 1)
        elif step == "record_unfenced":
            ledger.record_result(turn, timeout(call_id))
        elif step == "record_unless_started":
            ledger.record_result(turn, timeout(call_id), unless_started=True)
        elif step == "lose_runs":
            ledger.redis.delete(runs_key)
        elif step == "lose_cancelled":
            ledger.redis.delete(Keys(settings.namespace).turn_cancelled(turn))
        elif step == "cancel":
            ledger.cancel(turn)
        elif step == "add":
            ledger.add_calls(turn, {call_id: "noop"})
        elif step == "open_again":
            ledger.open_turn(turn, {})
    for call_id in ("c1", "c2", "c3"):  # and at the end, whatever happened
        if ledger.redis.hexists(Keys(settings.namespace).turn_results(turn), call_id):
            assert ledger.claim_start(turn, call_id, "w@t", arm_wait_s=1) in ("done", "cancelled"), steps


# the claim reads the tool's breaker failures with the turn's flags: a call that worked resets
# only a run of failures counted before it began, and pays no breaker command when there is none


def test_a_call_that_worked_ends_the_run_of_failures_its_claim_saw(ledger, settings):
    breakers = Breakers(settings, ledger.redis)
    turn = new_turn(ledger)
    plain = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1, tool="noop")
    assert plain == "ok" and not plain.failures_seen  # nothing counted: the success resets nothing
    for _ in range(settings.breaker_failures - 1):
        assert breakers.observe("noop", ok=False) == "closed"
    claim = ledger.claim_start(turn, "c2", "w@t", arm_wait_s=1, tool="noop")
    assert claim == "ok" and claim.failures_seen
    assert ledger.record_result(turn, ok("c2"), tool_worked="noop", fencing_token=claim.token)
    assert not ledger.redis.exists(Keys(settings.namespace).breaker_failures("noop"))
    assert breakers.observe("noop", ok=False) == "closed", "the run of failures started again at one"
    for _ in range(settings.breaker_failures - 2):
        breakers.observe("noop", ok=False)
    assert breakers.observe("noop", ok=False) == "open"
    assert ledger.claim_start(turn, "c3", "w@t", arm_wait_s=1).failures_seen, "no tool named: unknown"


def test_results_restored_after_redis_lost_their_marks_refuse_the_message_still_queued(ledger, settings):
    """Redis came back from an older snapshot (or failed over to a lagging replica): the runs hash
    kept its ``turn`` field but lost the ``d:`` mark and the result. The dispatcher restores the
    results its caller holds (``reopen``); a message still queued must find the call decided."""
    turn = new_turn(ledger)
    told = timeout("c1")
    assert ledger.record_result(turn, told, unless_started=True)  # the caller is told TIMEOUT
    keys = Keys(settings.namespace)
    ledger.redis.hdel(keys.turn_runs(turn), "d:c1")
    ledger.redis.hdel(keys.turn_results(turn), "c1")
    ledger.reopen(turn, {"c1": "noop", "c2": "noop", "c3": "noop"}, [told], armed=True)
    assert ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1) == "done"
    assert ledger.claim_start(turn, "c2", "w@t", arm_wait_s=1) == "ok"


def test_a_stream_id_ahead_of_the_clock_does_not_stretch_a_claims_deadline(ledger, settings):
    """The claim takes Redis's clock from its started event's stream id; an id ahead of the clock
    (the clock stepped back, a failover to a host whose clock is behind) must not move the fence's
    deadline by that much: the execution's fence lapses at its hard limit on the clock."""
    turn = new_turn(ledger)
    ahead_ms = int(ledger.redis.time()[0]) * 1000 + 3_600_000
    ledger.redis.xadd(Keys(settings.namespace).turn_events(turn), {"type": "x"}, id=f"{ahead_ms}-0")
    claim = ledger.claim_start(turn, "c1", "w@t", arm_wait_s=1, hard_limit_s=60)
    assert claim == "ok"
    _token, deadline_ms, _pid = ledger.fence_of(turn, "c1")
    seconds, micros = ledger.redis.time()
    assert deadline_ms <= seconds * 1000 + micros // 1000 + 60_000 + 1_000, "the deadline followed the stream id"


def test_a_claim_waiting_longer_than_a_read_timeout_for_its_turn_to_be_armed_sees_no_outage(settings, caplog):
    """A worker's claim waits up to ``arm_wait_s`` for an unarmed turn, reading its event stream
    with a blocking XREAD; redis-py 8 times a read out after 5 s by default. The turn armed 6 s
    later: the claim takes the call, and nothing says Redis was unreachable (before: the XREAD
    blocked for the whole wait, failed as TimeoutError at 5 s, and the worker logged an outage and
    read again). One read never blocks past ``EVENTS_BLOCK_MAX_MS``."""
    ledger = Ledger(settings, retry_s=30)  # a worker's
    turn_id = f"T{next(_turns)}"
    ledger.open_turn(turn_id, {"c1": "noop"}, armed=False)
    assert list(ledger.events(turn_id, after="$", block_ms=6000)) == []  # before: TimeoutError
    arming = threading.Timer(6.0, ledger.arm, args=[turn_id])
    arming.start()
    try:
        with caplog.at_level(logging.WARNING, logger="toolfleet.ledger"):
            claim = ledger.claim_start(turn_id, "c1", "w@t", arm_wait_s=10)
    finally:
        arming.join()
    assert claim == "ok", claim
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()], caplog.text


def test_events_without_a_block_or_blocking_for_ever_stay_bounded(ledger):
    """``block_ms=None`` reads what is there at once (the bench's breakdown reads so); 0, XREAD's
    "for ever", is bounded like any block (``EVENTS_BLOCK_MAX_MS``)."""
    turn_id = new_turn(ledger)
    ledger.arm(turn_id)
    assert [e.type for e in ledger.events(turn_id, block_ms=None)][-1] == "armed"
    assert list(ledger.events(turn_id, after="$", block_ms=None)) == []
    assert list(ledger.events(turn_id, after="$", block_ms=0)) == []  # returns within the bound
