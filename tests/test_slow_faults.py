"""Repeated fault injection (marked ``slow``; run with ``pytest -m slow -s`` to see the counts).

Each repetition runs a batch of four calls, one of each kind the rules treat differently: a read,
a journaled refund with a probe, a journaled refund without one, and a plain write (neither
idempotent nor journaled). Once they all run, it SIGKILLs, at a random moment, either one pool
process running one of them, or a whole worker (main process and pool) running some of them.
Then it checks what must always hold:

- every call gets exactly one result, within the turn's deadline;
- no refund is paid twice for one key;
- the outcome of each call is one its kind allows (see ``ALLOWED``).

and prints how often each outcome happened.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from toolfleet import ErrorCode

from . import refund_store
from .faults import call, kill_pid, started_record, wait_started

pytestmark = pytest.mark.slow

REPETITIONS = 20
TURN_DEADLINE_S = 45.0  # longest hard limit (5 s + 1 s) + death detection + a re-run, with room
OK = "ok"
ALLOWED = {
    # read: always re-run, so always ok
    "wait_read": {OK},
    # refund with probe: replayed or (probe found nothing) run again; a re-run may hit its 3 s limit
    "refund": {OK, ErrorCode.TIMEOUT.value},
    # refund without probe: ok if not the victim, else OUTCOME_UNKNOWN
    "refund_blind": {OK, ErrorCode.OUTCOME_UNKNOWN.value},
    # plain write: ok if not the victim, else WORKER_LOST
    "add_note": {OK, ErrorCode.WORKER_LOST.value},
}


@pytest.fixture
def settings(settings):
    # breaker_failures: issue 11 case 7. Five reps in a row whose plain write ran on the killed
    # worker give add_note five WORKER_LOSTs in a row; its circuit then opens (as it should) and
    # the next rep's call gets TOOL_UNAVAILABLE at once, so waiting for it to start timed out after
    # 30 s. These tests are about worker loss, not the breaker (tests/test_availability.py).
    return settings.model_copy(update={"heartbeat_s": 0.5, "breaker_failures": 1000})


def batch(rep: int, rng: random.Random, long_s: float) -> list:
    return [
        call("read", "wait_read", label=f"r{rep}", seconds=long_s),
        call("refund", "refund", order_id=f"P{rep}", amount_cents=100 + rep,
             pre_s=round(rng.uniform(0, long_s / 2), 2), post_s=round(rng.uniform(0.2, long_s / 2), 2)),
        call("blind", "refund_blind", order_id=f"B{rep}", amount_cents=100 + rep,
             pre_s=round(rng.uniform(0, long_s / 2), 2), post_s=round(rng.uniform(0.2, long_s / 2), 2)),
        call("note", "add_note", text=f"n{rep}", seconds=long_s),
    ]


def reset_breakers(dispatcher) -> None:
    """The workers observe lost pool processes with their own ``breaker_failures`` (5): reset the
    circuits between reps (see the settings fixture)."""
    from toolfleet.keys import Keys

    client = dispatcher.ledger.redis
    keys = list(client.scan_iter(match=Keys(dispatcher.settings.namespace).breaker("*") + "*", count=100))
    if keys:
        client.delete(*keys)


def outcome(result) -> str:
    return OK if result.ok else result.code.value


def check_turn(turn, dispatcher, calls, workspace, tally: Counter, victims: set[str]) -> None:
    results = turn.results(timeout_s=TURN_DEADLINE_S)
    assert [r.call_id for r in results] == [c.id for c in calls], "one result per call, in model order"
    assert set(dispatcher.ledger.results(turn.turn_id)) == {c.id for c in calls}, "exactly one result per call"
    for c, r in zip(calls, results, strict=True):
        got = outcome(r)
        assert got in ALLOWED[c.name], f"{c.name}: {r.content}"
        if c.id not in victims:
            assert got == OK, f"{c.name} was not on the killed process but got {r.content}"
        tally[(c.name, "killed" if c.id in victims else "spared", got)] += 1
        tally[(c.name, "attempts", r.attempts)] += 1
    counts = refund_store.counts(workspace)
    assert all(n <= 1 for n in counts["refunds"].values()), f"a refund was paid twice: {counts}"


def report(title: str, tally: Counter, workspace) -> None:
    counts = refund_store.counts(workspace)
    runs = Counter(counts["runs"].values())
    paid = Counter(counts["refunds"].values())
    print(f"\n{title}: {REPETITIONS} repetitions")
    for key in sorted(k for k in tally if k[1] != "attempts"):
        print(f"  {key[0]:<13} {key[1]:<7} -> {key[2]:<16} {tally[key]}")
    for key in sorted(k for k in tally if k[1] == "attempts"):
        print(f"  {key[0]:<13} attempts={key[2]}  {tally[key]}")
    print(f"  refunds paid per key: {dict(paid)}   refund handler entries per key: {dict(runs)}")


def test_sigkill_a_pool_process_mid_batch_20_times(dispatcher, start_worker, workspace):
    rng = random.Random(4)
    start_worker(concurrency=4)
    tally: Counter = Counter()
    for rep in range(REPETITIONS):
        reset_breakers(dispatcher)
        calls = batch(rep, rng, long_s=1.5)
        turn = dispatcher.submit(calls, workspace=str(workspace))
        records = {c.id: wait_started(dispatcher, turn.turn_id, c.id) for c in calls}
        victim = rng.choice(calls).id
        assert not turn.wait(rng.uniform(0.05, 0.7))  # a random moment into the calls
        record = started_record(dispatcher, turn.turn_id, victim) or records[victim]
        kill_pid(record["pid"])
        check_turn(turn, dispatcher, calls, workspace, tally, {victim})
    report("SIGKILL of one pool process", tally, workspace)


def test_sigkill_a_whole_worker_mid_batch_20_times(dispatcher, start_worker, workspace):
    rng = random.Random(5)
    workers = [start_worker(concurrency=2), start_worker(concurrency=2)]
    tally: Counter = Counter()
    for rep in range(REPETITIONS):
        reset_breakers(dispatcher)
        calls = batch(rep, rng, long_s=2.0)
        turn = dispatcher.submit(calls, workspace=str(workspace))
        on = {c.id: wait_started(dispatcher, turn.turn_id, c.id)["worker"] for c in calls}
        by_name = {w.name: w for w in workers}
        victim = by_name[on[rng.choice(calls).id]]
        assert not turn.wait(rng.uniform(0.05, 0.9))
        victim.kill()
        check_turn(turn, dispatcher, calls, workspace, tally, {c for c, w in on.items() if w == victim.name})
        workers = [w for w in workers if w is not victim] + [start_worker(concurrency=2)]
    report("SIGKILL of a whole worker", tally, workspace)
