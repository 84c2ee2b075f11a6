"""Every key a ledger step writes ends up with a time to live (docs/scaling.md, "What one call costs
in Redis"): per-call steps renew none on a healthy turn, so these check the turn's own renewals and
the path after Redis lost its data. A key without one would live in Redis forever. Talks to the
ledger directly (no worker needed): the scripts are the unit here."""

from __future__ import annotations

import pytest

from toolfleet.keys import Keys
from toolfleet.ledger import TTL_SLACK, Ledger
from toolfleet.models import ErrorCode, ToolResult

TURN_KEYS = ("turn_calls", "turn_runs", "turn_results", "turn_events", "turn_audit")


def ttls(ledger: Ledger, turn_id: str) -> dict[str, int]:
    keys = Keys(ledger.settings.namespace)
    return {name: ledger.redis.ttl(getattr(keys, name)(turn_id)) for name in TURN_KEYS}


@pytest.fixture
def ledger(settings):
    return Ledger(settings, retry_s=5)


def run_one(ledger: Ledger, turn_id: str) -> None:
    claim = ledger.claim_start(turn_id, "c1", "w@test", arm_wait_s=1)
    assert claim == "ok", claim
    result = ToolResult(call_id="c1", name="noop", status="ok", content="ok")
    kept = ledger.record_result(turn_id, result, fencing_token=claim.token)
    assert kept


def test_a_turn_run_to_its_end_leaves_every_key_expiring(ledger):
    ledger.open_turn("T1", {"c1": "noop"})
    ledger.audit.append("T1", "planned")
    run_one(ledger, "T1")
    ledger.end_turn("T1", "every call has its result")
    assert all(0 < ttl <= ledger.settings.result_ttl_s for ttl in ttls(ledger, "T1").values()), ttls(ledger, "T1")


def test_after_redis_lost_the_turn_the_claim_and_record_give_what_they_create_a_ttl(ledger):
    """Redis restarted without its data, the dispatcher put back the lease and the turn (reopen),
    then a worker claims and records: the streams and the runs hash it creates must expire too,
    even if the dispatcher never renews or ends the turn (it may have died meanwhile)."""
    ledger.open_turn("T2", {"c1": "noop"})
    keys = Keys(ledger.settings.namespace)
    ledger.redis.delete(*(getattr(keys, name)("T2") for name in TURN_KEYS))  # the loss
    ledger.renew_lease("T2")
    ledger.reopen("T2", {"c1": "noop"}, [], armed=True)
    ledger.redis.delete(keys.turn_audit("T2"))  # no audit written since
    run_one(ledger, "T2")
    left = ttls(ledger, "T2")
    # the audit stream stays absent (a run's entries are its events'); every key there is expires
    assert left.pop("turn_audit") == -2, left
    assert all(ttl > 0 for ttl in left.values()), left


def test_an_end_soon_after_the_time_to_live_was_set_leaves_it(ledger):
    """end_turn skips renewing what open_turn or a lease renewal set at most TTL_SLACK of
    result_ttl_s ago: every key still expires, no sooner than (1 - TTL_SLACK) * result_ttl_s."""
    ledger.open_turn("T3", {"c1": "noop"})
    ledger.audit.append("T3", "planned")
    run_one(ledger, "T3")
    ledger.end_turn("T3", "every call has its result", ttl_set_s_ago=0.5)
    ttl_s = ledger.settings.result_ttl_s
    left = ttls(ledger, "T3")
    assert all((1 - TTL_SLACK) * ttl_s <= ttl <= ttl_s for ttl in left.values()), left


def test_keys_redis_evicted_and_a_worker_re_created_get_a_ttl_at_the_end(ledger):
    """Eviction dropped the event stream and the results hash of a live turn (its runs hash stayed,
    so the claim does not see a loss): the claim's event and the worker's result re-create them
    without a time to live, and end_turn gives them one even when it skips the rest."""
    ledger.open_turn("T4", {"c1": "noop"})
    keys = Keys(ledger.settings.namespace)
    ledger.redis.delete(keys.turn_events("T4"), keys.turn_results("T4"))
    run_one(ledger, "T4")
    ledger.end_turn("T4", "every call has its result", ttl_set_s_ago=5)
    left = ttls(ledger, "T4")
    assert left.pop("turn_audit") == -2, left  # never written
    assert all(ttl > 0 for ttl in left.values()), left


def test_a_turn_id_opened_again_gives_its_runs_hash_a_ttl(ledger):
    """A resumed graph re-submits under its turn id: open_turn then finds results and keeps the
    runs hash's marks untrusted, but still gives it its time to live (end_turn may skip it)."""
    ledger.open_turn("T9", {"c1": "noop"})
    run_one(ledger, "T9")
    keys = Keys(ledger.settings.namespace)
    ledger.redis.persist(keys.turn_runs("T9"))
    ledger.open_turn("T9", {"c1": "noop"})
    assert 0 < ledger.redis.ttl(keys.turn_runs("T9")) <= ledger.settings.result_ttl_s


def test_a_late_note_keeps_the_event_stream_the_audit_trail_reads(ledger):
    """The audit trail's started/finished entries are read from the event stream: a late note that
    renews the audit stream renews the event stream too."""
    ledger.open_turn("T10", {"c1": "noop"})
    claim = ledger.claim_start("T10", "c1", "w@test", arm_wait_s=1)
    ledger.record_result("T10", ToolResult.failure("c1", "noop", ErrorCode.WORKER_LOST, "gone", "check"))
    keys = Keys(ledger.settings.namespace)
    ledger.redis.expire(keys.turn_events("T10"), 5)
    late = ToolResult(call_id="c1", name="noop", status="ok", content="ok")
    assert not ledger.record_result("T10", late, fencing_token=claim.token)
    assert ledger.late_notes("T10")["c1"]
    assert ledger.redis.ttl(keys.turn_events("T10")) > 5
