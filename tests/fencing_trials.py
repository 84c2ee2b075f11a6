"""Freeze-and-resume trials of issue 19's table (used by tests/test_fencing.py, one trial each, and
tests/test_slow_fencing.py, many): a worker (main process and pool) is SIGSTOPped while it runs a
call, or while idle, for ``freeze_s``, then SIGCONTed. Each trial checks what must hold and adds
its outcome to a tally:

- every call gets exactly one result;
- no effect twice for a non-idempotent tool (refunds paid per key <= 1);
- no ``CANCELLED`` or ``ok`` that a late execution contradicts (``ok`` -> the effect happened
  exactly once; ``CANCELLED``/``TOOL_UNAVAILABLE``/``NOT_EXECUTED`` -> it did not happen), and
  the journal never holds ``done`` with an outcome other than the caller's;
- no write of a turn after the next turn's on the same path;
- no call waits past its bound (``answer_bound_s``).

Timing (with :func:`fencing_settings`): heartbeat 0.3 s (liveness bound 2.2 s), tools with a 1 s
time limit (hard limit 1.75 s), clock-skew margin 0.5 s.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolfleet import Dispatcher, ErrorCode
from toolfleet.dispatcher.availability import liveness_bound_s
from toolfleet.keys import Keys

from . import refund_store
from .faults import call, freeze, thaw, wait_started, wait_until  # noqa: F401 - wait_until used by tests

SHORT_FREEZE_S = 0.4  # under the liveness window (catalog TTL 0.9 s) and the time limit
LONG_FREEZE_S = 3.5  # past the liveness bound (2.2 s), the time limit (1 s) and the hard limit + margin
JOIN_S = 20.0  # after the thaw: how long the frozen execution may take to report (late note or result)


def fencing_settings(settings):
    # breaker_failures: many trials in a row answer OUTCOME_UNKNOWN/WORKER_LOST by design; an open
    # circuit would refuse the next trial's call (TOOL_UNAVAILABLE) and test the breaker instead
    return settings.model_copy(update={"heartbeat_s": 0.3, "kill_grace_s": 0.25, "clock_skew_margin_s": 0.5,
                                       "cancel_grace_s": 0.5, "breaker_failures": 1000})


def answer_bound_s(settings, hard_s: float = 1.75, run_s: float = 1.0) -> float:
    """How long after its freeze a call of these trials may wait for its answer at most: the
    liveness bound, then (journaled writes) the first execution's hard limit and the margin, then
    one more run, plus 2 s of slack for this loaded machine."""
    return liveness_bound_s(settings) + hard_s + settings.clock_skew_margin_s + run_s + 2.0


@dataclass
class Fleet:
    dispatcher: Dispatcher
    workers: list[Any]
    workspace: Path
    settings: Any
    tally: Counter

    def by_name(self, name: str):
        return next(w for w in self.workers if w.name == name)


def outcome(result) -> str:
    return "ok" if result.ok else result.code.value


def _late_or_answered(fleet: Fleet, turn_id: str, call_id: str, victim: str) -> bool:
    led = fleet.dispatcher.ledger
    if led.late_notes(turn_id).get(call_id):
        return True
    result = led.results(turn_id).get(call_id)
    return result is not None and result.worker == victim


def _frozen_call(fleet: Fleet, c, freeze_s: float, rng: random.Random, cancel_after_s: float | None = None):
    """Submit ``c``, freeze its worker a random moment after it started, optionally cancel, thaw
    after ``freeze_s``, and join on the frozen execution's report. Returns (result, seconds from
    the freeze to the answer, the victim's name, the turn)."""
    d = fleet.dispatcher
    turn = d.submit([c], workspace=str(fleet.workspace))
    record = wait_started(d, turn.turn_id, c.id)
    victim = fleet.by_name(record["worker"])
    turn.wait(rng.uniform(0.0, 0.25))
    freeze(victim)
    frozen_at = time.monotonic()
    try:
        if cancel_after_s is not None:
            turn.wait(cancel_after_s)
            turn.cancel()
        turn.wait(max(frozen_at + freeze_s - time.monotonic(), 0.0))
    finally:
        thaw(victim)
    result = turn.results(timeout_s=60)[0]
    answered_s = time.monotonic() - frozen_at
    assert set(d.ledger.results(turn.turn_id)) == {c.id}, "exactly one result"
    try:
        wait_until(lambda: _late_or_answered(fleet, turn.turn_id, c.id, victim.name), JOIN_S,
                   "the frozen execution's report")
    except TimeoutError as exc:  # say what the ledger and the victim's processes show
        raise AssertionError(f"{exc}\n{_diagnosis(fleet, turn.turn_id, victim)}") from None
    return result, answered_s, victim.name, turn


def _diagnosis(fleet: Fleet, turn_id: str, victim) -> str:
    """The turn's events, runs hash and late notes, and the state of the victim's processes: what
    a missing report of a frozen execution is to be explained from."""
    led = fleet.dispatcher.ledger
    keys = Keys(fleet.settings.namespace)
    lines = [f"victim {victim.name}"]
    for stream_id, fields in led.redis.xrange(keys.turn_events(turn_id)):
        shown = {k.decode(): v.decode()[:300] for k, v in fields.items()}
        lines.append(f"  event {stream_id.decode()} {shown}")
    for field, value in sorted(led.redis.hgetall(keys.turn_runs(turn_id)).items()):
        lines.append(f"  runs {field.decode()} = {value.decode()[:300]}")
    lines.append(f"  late notes {led.late_notes(turn_id)}")
    for pid in [victim.proc.pid, *victim.children()]:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError as exc:
            lines.append(f"  process {pid}: {exc}")
            continue
        state = next((line for line in status if line.startswith("State:")), "")
        lines.append(f"  process {pid}: {state} wchan={wchan}")
    return "\n".join(lines)


def _journal_entry(fleet: Fleet, tool: str, key: str) -> dict[str, str]:
    raw = fleet.dispatcher.ledger.redis.hgetall(Keys(fleet.settings.namespace).journal(tool, key))
    return {k.decode(): v.decode() for k, v in raw.items()}


def _check_journal(fleet: Fleet, tool: str, key: str, result) -> None:
    entry = _journal_entry(fleet, tool, key)
    if entry.get("state") == "done":
        recorded = json.loads(entry["result"])
        assert recorded["status"] == result.status and (recorded.get("error") or {}).get("code") == (
            result.code.value if result.code else None), f"journal {entry} contradicts the answer {result.content}"


def _check_refund(fleet: Fleet, tool: str, order: str, result, answered_s: float) -> None:
    paid = refund_store.counts(fleet.workspace)["refunds"].get(f"order-{order}", 0)
    assert paid <= 1, f"refund {order} paid {paid} times"
    if result.ok:
        assert paid == 1, f"told ok but paid {paid} times"
    _check_journal(fleet, tool, f"arg:order-{order}", result)
    assert answered_s <= answer_bound_s(fleet.settings, run_s=1.5), f"answered {answered_s:.1f} s after the freeze"
    fleet.tally[(tool, "paid", paid)] += 1


def refund_with_probe(fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    order = f"P{rep}-{freeze_s}"
    c = call("r", "quick_refund", order_id=order, amount_cents=100, pre_s=0.3, post_s=0.1)
    result, answered_s, _, _ = _frozen_call(fleet, c, freeze_s, rng)
    fleet.tally[("refund with probe", freeze_s, outcome(result))] += 1
    _check_refund(fleet, "quick_refund", order, result, answered_s)


def refund_without_probe(fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    order = f"B{rep}-{freeze_s}"
    c = call("r", "quick_refund_blind", order_id=order, amount_cents=100, pre_s=0.3, post_s=0.1)
    result, answered_s, _, _ = _frozen_call(fleet, c, freeze_s, rng)
    fleet.tally[("refund without probe", freeze_s, outcome(result))] += 1
    _check_refund(fleet, "quick_refund_blind", order, result, answered_s)


def idempotent_read(fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    c = call("q", "quick_read", label=f"q{rep}", seconds=0.4)
    result, answered_s, _, _ = _frozen_call(fleet, c, freeze_s, rng)
    fleet.tally[("idempotent read", freeze_s, outcome(result))] += 1
    assert result.ok or result.code in (ErrorCode.WORKER_LOST, ErrorCode.TIMEOUT), result.content
    assert answered_s <= answer_bound_s(fleet.settings), f"answered {answered_s:.1f} s after the freeze"


def next_turn_same_path(fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    """Turn 1 appends 't1' and its worker freezes; as soon as the caller has turn 1's answer, turn
    2 appends 't2' to the same file. A late 't1' must never land after 't2'."""
    path = f"same-{rep}-{freeze_s}.txt"
    d = fleet.dispatcher
    turn1 = d.submit([call("w", "fenced_append", path=path, line="t1", seconds=0.3)], workspace=str(fleet.workspace))
    record = wait_started(d, turn1.turn_id, "w")
    victim = fleet.by_name(record["worker"])
    turn1.wait(rng.uniform(0.0, 0.25))
    freeze(victim)
    frozen_at = time.monotonic()
    second = None
    try:
        answered = turn1.wait(freeze_s)
        if answered:  # the caller has turn 1's answer while its worker is still frozen: turn 2 at once
            second = d.run([call("w", "fenced_append", path=path, line="t2")], workspace=str(fleet.workspace),
                           timeout_s=60)[0]
        turn1.wait(max(frozen_at + freeze_s - time.monotonic(), 0.0))
    finally:
        thaw(victim)
    first = turn1.results(timeout_s=60)[0]
    if second is None:  # turn 1 was answered only after the thaw (a short freeze)
        second = d.run([call("w", "fenced_append", path=path, line="t2")], workspace=str(fleet.workspace),
                       timeout_s=60)[0]
    wait_until(lambda: _late_or_answered(fleet, turn1.turn_id, "w", victim.name), JOIN_S,
               "the frozen execution's report")
    lines = (fleet.workspace / path).read_text().split()
    fleet.tally[("next turn same path", freeze_s, f"{outcome(first)}/{outcome(second)} {'+'.join(lines)}")] += 1
    assert second.ok, second.content
    assert "t2" in lines and (("t1" not in lines) or lines.index("t1") < lines.index("t2")), f"interleaved: {lines}"
    assert lines.count("t1") <= 1, f"turn 1 wrote twice: {lines}"
    if first.ok:
        assert "t1" in lines


def cancel_while_frozen(fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    """Freeze, then cancel 0.2 s later: CANCELLED only if the write never happens."""
    path = f"cancel-{rep}-{freeze_s}.txt"
    c = call("w", "fenced_append", path=path, line="x", seconds=0.3)
    result, answered_s, _, _ = _frozen_call(fleet, c, freeze_s, rng, cancel_after_s=min(0.2, freeze_s / 2))
    target = fleet.workspace / path
    written = target.exists() and "x" in target.read_text().split()
    fleet.tally[("cancel while frozen", freeze_s, f"{outcome(result)} written={written}")] += 1
    if result.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED):
        assert not written, f"told {result.code.value} but the write happened"
    if result.ok:
        assert written
    assert answered_s <= freeze_s + 2.0 or answered_s <= fleet.settings.cancel_grace_s + 1.5, answered_s


def _redis_ms(fleet: Fleet) -> int:
    secs, micros = fleet.dispatcher.ledger.redis.time()
    return secs * 1000 + micros // 1000


def _answered_ms(fleet: Fleet, turn_id: str) -> int:
    """When (Redis clock, ms) the turn's first result was recorded: its event's stream id."""
    for event in fleet.dispatcher.ledger.events(turn_id, block_ms=1):
        if event.type == "result":
            return int(event.stream_id.split("-")[0])
    raise AssertionError(f"turn {turn_id} has no result event")


def idle_worker_frozen(fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    """An idle worker frozen just before four one-call turns: its outstanding broker read may take
    one message; every call still gets its answer within the liveness bound (+ the runs)."""
    d = fleet.dispatcher
    victim = fleet.workers[rep % len(fleet.workers)]
    freeze(victim)
    frozen_at = time.monotonic()
    try:
        t0 = _redis_ms(fleet)
        turns = [d.submit([call("q", "quick_read", label=f"i{rep}-{n}", seconds=0.05)], workspace=str(fleet.workspace))
                 for n in range(4)]
        for turn in turns:
            turn.wait(max(frozen_at + freeze_s - time.monotonic(), 0.0))
    finally:
        thaw(victim)
    for turn in turns:
        result = turn.results(timeout_s=60)[0]
        assert result.ok, result.content
    waits = [(_answered_ms(fleet, t.turn_id) - t0) / 1000 for t in turns]
    bound = liveness_bound_s(fleet.settings) + 4 * 0.5 + 2.0
    late = sum(w > 1.5 for w in waits)
    fleet.tally[("idle worker frozen", freeze_s, f"all ok, {late} answered after 1.5 s")] += 1
    fleet.tally[("idle worker frozen", freeze_s, "longest wait (s)")] = max(
        fleet.tally[("idle worker frozen", freeze_s, "longest wait (s)")], round(max(waits), 1))
    assert max(waits) <= bound, f"a call waited {max(waits):.1f} s (bound {bound:.1f} s)"


CASES = {
    "refund with probe": refund_with_probe,
    "refund without probe": refund_without_probe,
    "idempotent read": idempotent_read,
    "next turn same path": next_turn_same_path,
    "cancel while frozen": cancel_while_frozen,
    "idle worker frozen": idle_worker_frozen,
}


def run_trial(case: str, fleet: Fleet, rep: int, freeze_s: float, rng: random.Random) -> None:
    """One trial of ``case``. The tools' circuit breakers are reset first: the workers count a
    frozen execution's lapsed time limit as a failure (with their own ``breaker_failures``, 5), and
    an open circuit would refuse the next trial's call, testing the breaker instead of fencing."""
    client = fleet.dispatcher.ledger.redis
    keys = list(client.scan_iter(match=Keys(fleet.settings.namespace).breaker("*") + "*", count=100))
    if keys:
        client.delete(*keys)
    CASES[case](fleet, rep, freeze_s, rng)


def report(tally: Counter) -> None:
    print()
    for key in sorted(tally, key=str):
        print(f"  {str(key[0]):<22} {str(key[1]):<5} {str(key[2]):<40} {tally[key]}")
