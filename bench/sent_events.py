"""Measurement 8, sent events: what the dispatcher's ``task-sent`` events cost (issue 15, point 5).

With ``Settings.task_sent_events`` on (Celery's ``task_send_sent_event``), the dispatcher publishes
one ``task-sent`` event per call so Flower lists calls still waiting in a queue. One toolfleet
worker fleet, two dispatchers on it, one with the events on and one with them off, under the load
of measurement 3 (batches of 16 no-op calls, ``in_flight`` client threads), in alternating segments
(the order reverses every round). Per side: calls per second, Redis commands per call, CPU ms per
call of the client, the worker and Redis. The ratio of rates is the median of the rounds' ratios.

Alone: ``python -m bench.sent_events [CALLS [OUT.json]]`` (a private Redis; writes JSON to OUT.json, or
prints it).
"""

from __future__ import annotations

import statistics
from typing import Any

import redis

from toolfleet import Dispatcher

from .overhead import BATCH, noop_calls
from .stack import ToolfleetFleet, bench_registry
from .throughput import _drive, _Side

COST_LIMIT_PCT = 5.0  # sent events stay on by default while they cost less than this share of the rate


def _batch(dispatcher: Dispatcher) -> float:
    results = dispatcher.submit(noop_calls(BATCH)).results(timeout_s=30)
    if not all(r.ok for r in results):
        raise RuntimeError(f"no-op batch failed: {[r.content for r in results if not r.ok][:1]}")
    return 0.0


def measure(tf: ToolfleetFleet, *, total_calls: int = 4000, in_flight: int = 4, rounds: int = 8) -> dict[str, Any]:
    """Both sides on ``tf``'s worker; returns ``{"rows": [on, off], "rate_ratio_on_off",
    "added_commands_per_call", "default_on"}``."""
    dispatchers = {flag: Dispatcher(tf.settings.model_copy(update={"task_sent_events": flag}), bench_registry())
                   for flag in (True, False)}
    sides = [_Side(f"sent events {'on' if flag else 'off'}", lambda d=d: _batch(d), tf.worker, tf.concurrency)
             for flag, d in dispatchers.items()]
    client = redis.Redis.from_url(tf.redis_url)
    try:
        for side in sides:  # warm-up
            _drive(side.run_batch, in_flight * 2, in_flight)
        batches = max(-(-total_calls // (BATCH * rounds)), 1)
        for r in range(rounds):
            for side in sides if r % 2 == 0 else reversed(sides):
                side.segment(client, batches, in_flight)
    finally:
        client.close()
        for d in dispatchers.values():
            d.close()
    on, off = (side.row(in_flight, rounds) for side in sides)
    ratios = [a / b for a, b in zip(on["segment_calls_per_s"], off["segment_calls_per_s"], strict=True)]
    return {"rows": [on, off], "rate_ratio_on_off": statistics.median(ratios),
            "added_commands_per_call": on["redis_commands_per_call"] - off["redis_commands_per_call"],
            "default_on": _default()}


def _default() -> bool:
    from toolfleet.settings import Settings

    return Settings().task_sent_events


def render(results: dict[str, Any]) -> str | None:
    """The report's section (bench/report.py)."""
    se = results.get("sent_events")
    if not se:
        return None
    on, off = se["rows"]
    rows = [[r["system"], r["calls"], f"{r['calls_per_s']:.0f}", f"{r['redis_commands_per_call']:.1f}",
             f"{r['client_cpu_ms_per_call']:.2f}", f"{r['worker_cpu_ms_per_call']:.2f}",
             f"{r['redis_cpu_ms_per_call']:.3f}"] for r in (on, off)]
    change = (se["rate_ratio_on_off"] - 1) * 100
    segments = on["segment_calls_per_s"] + off["segment_calls_per_s"]
    when = se.get("measured")  # measured alone and merged into a full run's results
    return (
        (f"Measured on its own with `{when['command']}` on {when['date']} (load average before "
         f"{when['load_before'][0]:.2f}, other processes using {when.get('others_cpu_cores') or 0:.2f} cores), "
         "merged into this run's results. " if when else "")
        + "What the dispatcher's `task-sent` events (`Settings.task_sent_events`: Flower lists the calls still "
        "waiting in a queue) cost: one worker fleet, two dispatchers on it (events on, events off), no-op calls "
        f"in batches of {BATCH}, {on['in_flight']} client threads, {on['rounds']} alternating rounds. "
        f"**Rate with the events on: {change:+.1f} %** against off (median of the rounds' ratios; the "
        f"segments ranged from {min(segments):.0f} to {max(segments):.0f} calls/s on this shared machine, so a "
        "few per cent either way is noise); "
        f"**{se['added_commands_per_call']:+.2f} Redis commands per call** (one PUBLISH per call, sent in the "
        "batch's MULTI/EXEC with the messages: no extra round trip) and "
        f"{on['client_cpu_ms_per_call'] - off['client_cpu_ms_per_call']:+.2f} ms of dispatcher CPU per call. "
        f"Default: **{'on' if se.get('default_on') else 'off'}** (`TOOLFLEET_TASK_SENT_EVENTS=0` turns them off). "
        f"The rule: on while they cost less than {COST_LIMIT_PCT:g} % of the rate, since a call Flower does not "
        "list while it waits looks lost to the person watching; "
        + ("this run is within it." if -change < COST_LIMIT_PCT else "**this run is past it**.")
        + "\n\n"
        + "| dispatcher | calls | calls/s | Redis commands/call | client CPU ms/call | worker CPU ms/call | "
          "Redis CPU ms/call |\n|" + "|".join(" --- " for _ in range(7)) + "|\n"
        + "\n".join("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    )


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path

    from .stack import PrivateRedis

    private = PrivateRedis()
    try:
        with ToolfleetFleet(private.url, 2) as fleet:
            found = json.dumps(measure(fleet, total_calls=int(sys.argv[1]) if len(sys.argv) > 1 else 4000), indent=2)
        if len(sys.argv) > 2:
            Path(sys.argv[2]).write_text(found + "\n")
        else:
            print(found)
    finally:
        private.stop()
