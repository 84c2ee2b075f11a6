"""Measurement 4, cancel latency: from ``turn.cancel()`` to every result of the turn final.

Three cases, ``trials`` each:

- ``queued``: a turn of 4 no-op calls submitted while every worker process is held by another
  turn's long calls, so its calls sit in the broker queue (or a worker's reservation); they end
  ``NOT_EXECUTED``.
- ``running_command``: one ``run_command`` (``sleep 30``) that has started; it ends ``CANCELLED``,
  its process group killed.
- ``running_tool``: one cooperative Python tool (``sleep_read``) waiting on its cancel signal;
  not asked for by the issue, reported for comparison.

Targets (the issue's "<= 50 ms and <= 250 ms", read as p50 and p99): p50 <= 50 ms and
p99 <= 250 ms, judged for the two cases the issue names.

A running call is cancelled a random 100-200 ms after its ``started`` event: late enough that the
command has surely been spawned, and random so the cancel does not fall at the same phase of the
command's 50 ms wait loop every time (a fixed delay did, and gave a flattering p50). The benchmark
may sleep; only the tests may not.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import uuid
from typing import Any

from toolfleet import ErrorCode, ToolCall, Turn

from .overhead import noop_calls
from .stack import ToolfleetFleet
from .stats import summary_ms

TARGETS = {"p50_ms": 50.0, "p99_ms": 250.0}


def _wait_started(fleet: ToolfleetFleet, turn: Turn, n: int = 1, timeout_s: float = 30.0) -> None:
    """Join on the turn's ``started`` events (the ledger's stream), ``n`` of them."""
    ledger = fleet.dispatcher.ledger
    seen, last = 0, "0-0"
    deadline = time.monotonic() + timeout_s
    while seen < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} call(s) of turn {turn.turn_id} did not start in {timeout_s} s")
        for event in ledger.events(turn.turn_id, after=last, block_ms=1000):
            last = event.stream_id
            seen += event.type == "started"


def _cancel_until_final(turn: Turn) -> float:
    t0 = time.perf_counter()
    turn.cancel("benchmark")
    turn.results(timeout_s=30)
    return time.perf_counter() - t0


def queued(fleet: ToolfleetFleet, trials: int) -> dict[str, Any]:
    d = fleet.dispatcher
    hold = [ToolCall(id=f"hold{i}", name="sleep_read", index=i,
                     arguments=json.dumps({"label": f"hold{i}", "seconds": 600}))
            for i in range(fleet.concurrency)]
    holder = d.submit(hold)
    _wait_started(fleet, holder, n=fleet.concurrency)
    samples, codes = [], set()
    try:
        for _ in range(trials):
            turn = d.submit(noop_calls(4, prefix=f"q{uuid.uuid4().hex[:6]}"))
            samples.append(_cancel_until_final(turn))
            codes |= {r.code for r in turn.results()}
    finally:
        holder.cancel("benchmark done")
        holder.results(timeout_s=30)
    if codes != {ErrorCode.NOT_EXECUTED}:
        raise RuntimeError(f"queued calls ended {codes}, expected NOT_EXECUTED only")
    return {"case": "queued", **summary_ms(samples), "targets": TARGETS}


def running(fleet: ToolfleetFleet, trials: int, *, command: bool) -> dict[str, Any]:
    d = fleet.dispatcher
    settle = random.Random(5)
    samples, codes = [], set()
    with tempfile.TemporaryDirectory(prefix="bench-ws-") as ws:
        for i in range(trials):
            if command:
                call = ToolCall(id=f"cmd{i}", name="run_command", arguments=json.dumps({"command": "sleep 30"}))
            else:
                call = ToolCall(id=f"py{i}", name="sleep_read",
                                arguments=json.dumps({"label": f"p{i}", "seconds": 30}))
            turn = d.submit([call], workspace=ws)
            _wait_started(fleet, turn)
            time.sleep(settle.uniform(0.1, 0.2))
            samples.append(_cancel_until_final(turn))
            codes |= {r.code for r in turn.results()}
    if codes != {ErrorCode.CANCELLED}:
        raise RuntimeError(f"running calls ended {codes}, expected CANCELLED only")
    if command:
        return {"case": "running_command", **summary_ms(samples), "targets": TARGETS}
    return {"case": "running_tool", **summary_ms(samples), "targets": {}}


def measure(fleet: ToolfleetFleet, *, trials: int = 50) -> dict[str, Any]:
    return {
        "worker_processes": fleet.concurrency,
        "cases": [
            queued(fleet, trials),
            running(fleet, trials, command=True),
            running(fleet, trials, command=False),
        ],
    }
