"""Measurement 1, plan efficiency: how close a mixed batch's makespan comes to its lower bound.

The batch (model order) holds 16 calls of ``duration_s`` each: reads of six unrelated keys, two
write chains (``x``: 3 writes, ``y``: 3 writes) and reads after writes of the same keys (a read
between two writes of ``x`` makes the next write wait for it). Its critical path is 5 calls
(w x -> w x -> r x -> w x -> r x).

Lower bound = max(critical path, total work / worker slots): no schedule on ``slots`` processes can
beat it. Efficiency = lower bound / makespan (submit to the last result). Zero-overhead simulations
of two queue disciplines (one FIFO queue; the plan's rank first, as toolfleet's message priorities
do) separate what the order of starts costs from what the machinery costs. With a raw Celery fleet
of as many slots, each run is followed by one of the same plan as a Celery canvas
(:mod:`bench.plan_raw`): raw Celery's own efficiency, measured in the same run.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Mapping
from typing import Any

from toolfleet import Dispatcher, ToolCall
from toolfleet.dispatcher import Plan

from . import plan_raw
from .report_util import TARGETS
from .stack import RawFleet
from .stats import median

# (access, key) in model order; see the module docstring
MIXED_BATCH: tuple[tuple[str, str], ...] = (
    ("read", "a"), ("read", "b"), ("write", "x"), ("write", "y"),
    ("read", "c"), ("write", "x"), ("read", "x"), ("write", "y"),
    ("read", "d"), ("write", "x"), ("write", "y"), ("read", "y"),
    ("read", "e"), ("read", "x"), ("read", "f"), ("read", "y"),
)


def mixed_batch(n_calls: int = 16, duration_s: float = 0.1) -> list[ToolCall]:
    """The first ``n_calls`` calls of :data:`MIXED_BATCH` as ``sleep_read`` / ``sleep_write`` calls."""
    calls = []
    for i, (access, key) in enumerate(MIXED_BATCH[:n_calls]):
        name = "sleep_read" if access == "read" else "sleep_write"
        calls.append(ToolCall(id=f"c{i:02d}", name=name, index=i,
                              arguments=json.dumps({"label": key, "seconds": duration_s})))
    return calls


def critical_path_s(plan: Plan, duration_s: Mapping[str, float]) -> float:
    """Length of the longest dependency chain of ``plan``, in seconds."""
    finish: dict[str, float] = {}
    for c in plan.order:  # deps are always earlier in model order
        finish[c] = duration_s[c] + max((finish[d] for d in plan.deps[c]), default=0.0)
    return max(finish.values(), default=0.0)


def lower_bound_s(plan: Plan, duration_s: Mapping[str, float], slots: int) -> float:
    return max(critical_path_s(plan, duration_s), sum(duration_s.values()) / slots)


def ranks(plan: Plan) -> dict[str, int]:
    """Calls on the longest chain from each call to the end of the plan, itself included."""
    rank: dict[str, int] = {}
    for c in reversed(plan.order):  # dependents are always later in model order
        rank[c] = 1 + max((rank[d] for d in plan.dependents.get(c, ())), default=0)
    return rank


def simulate_s(plan: Plan, duration_s: Mapping[str, float], slots: int, *, by_rank: bool) -> float:
    """Makespan with zero overhead: a call is queued the moment its last dependency finishes, and
    a free slot takes the first queued call, in arrival order (``by_rank=False``: one FIFO queue)
    or by rank first, then arrival (``by_rank=True``: toolfleet's message priorities, which have
    four levels: ranks 1, 2, 3 and 4 or more)."""
    queue: list[tuple[int, int, str]] = []
    rank = ranks(plan)
    seq = 0

    def enqueue(c: str) -> None:
        nonlocal seq
        key = -min(rank[c], 4) if by_rank else 0
        heapq.heappush(queue, (key, seq, c))
        seq += 1

    for c in plan.parallel_group:
        enqueue(c)
    finished: set[str] = set()
    running: list[tuple[float, int, str]] = []
    now, free = 0.0, slots
    while queue or running:
        while free and queue:
            _, order, c = heapq.heappop(queue)
            heapq.heappush(running, (now + duration_s[c], order, c))
            free -= 1
        now, _, done = heapq.heappop(running)
        free += 1
        finished.add(done)
        for d in plan.dependents.get(done, ()):
            if plan.deps[d] <= finished:
                enqueue(d)
    return now


BREAKDOWN_PARTS = ("submit_ms", "first_start_ms", "runs_ms", "handler_ms", "waits_ms", "collect_ms")


def breakdown(dispatcher: Dispatcher, turn_id: str, plan: Plan, t0_wall_s: float, makespan_s: float,
              duration_s: float) -> dict[str, Any]:
    """Where one run's makespan went, from the turn's ledger events (Redis stream ids carry the
    Redis server's clock in ms; same machine as the client): the call that ended last, then the last
    call to end before it started (the dependency it waited for, or the call whose worker slot it
    took), and so on back to a call that started before any ended. The parts add up to the makespan.

    ``submit_ms``: ``submit()`` until the turn was armed (validation, plan, ledger, sending the first
    group); ``first_start_ms``: armed until the chain's first call started; ``runs_ms``: the chain's
    calls from ``started`` to ``result`` (``handler_ms`` of it is the tools' own sleeping: the rest
    is the worker's claim, journal and record); ``waits_ms``: between a call's ``result`` and the
    next chain call's ``started`` (the result event, the driver's send, a worker's fetch, or a slot
    to free up); ``collect_ms``: last result until ``results()`` returned."""
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    armed = None
    for event in dispatcher.ledger.events(turn_id, block_ms=None):
        at_s = int(event.stream_id.split("-")[0]) / 1000 - t0_wall_s
        if event.type == "armed":
            armed = at_s
        elif event.type == "started":
            started.setdefault(event.call_id, at_s)
        elif event.type == "result":
            finished[event.call_id] = at_s
    if armed is None or set(finished) != set(plan.order) or set(started) != set(plan.order):
        return {}
    chain = [max(finished, key=lambda c: finished[c])]
    while True:
        before = [c for c in finished if finished[c] <= started[chain[0]] and c not in chain]
        if not before:
            break
        chain.insert(0, max(before, key=lambda c: finished[c]))
    runs = sum(finished[c] - started[c] for c in chain)
    waits = sum(started[b] - finished[a] for a, b in zip(chain, chain[1:], strict=False))
    return {
        "chain": chain,
        "submit_ms": armed * 1000,
        "first_start_ms": (started[chain[0]] - armed) * 1000,
        "runs_ms": runs * 1000,
        "handler_ms": len(chain) * duration_s * 1000,
        "waits_ms": waits * 1000,
        "collect_ms": (makespan_s - finished[chain[-1]]) * 1000,
    }


def _median_run(makespans: list[float], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The breakdown of the run whose makespan is the median (the lower middle one for an even
    count), so its parts add up to a makespan actually measured."""
    order = sorted(range(len(makespans)), key=lambda i: makespans[i])
    picked = parts[order[(len(order) - 1) // 2]] if order else {}
    return dict(picked, makespan_ms=makespans[order[(len(order) - 1) // 2]] * 1000) if picked else {}


def measure(dispatcher: Dispatcher, slots: int, *, n_calls: int = 16, duration_s: float = 0.1,
            trials: int = 5, warmup: int = 1, raw: RawFleet | None = None) -> dict[str, Any]:
    """Run the mixed batch ``trials`` times on a fleet of ``slots`` worker processes; with ``raw`` (a
    raw Celery fleet of ``slots`` processes), each run is followed by one of the same plan on it."""
    makespans: list[float] = []
    raw_makespans: list[float] = []
    parts: list[dict[str, Any]] = []
    plan = None
    for i in range(warmup + trials):
        calls = mixed_batch(n_calls, duration_s)
        t0_wall, t0 = time.time(), time.perf_counter()
        turn = dispatcher.submit(calls)
        results = turn.results(timeout_s=60)
        elapsed = time.perf_counter() - t0
        bad = [r for r in results if not r.ok]
        if bad:
            raise RuntimeError(f"plan batch failed: {bad[0].content}")
        plan = turn.plan
        raw_elapsed = None if raw is None else plan_raw.run_once(raw, plan, duration_s)
        if i >= warmup:
            makespans.append(elapsed)
            parts.append(breakdown(dispatcher, turn.turn_id, plan, t0_wall, elapsed, duration_s))
            if raw_elapsed is not None:
                raw_makespans.append(raw_elapsed)
    assert plan is not None
    durations = {c: duration_s for c in plan.order}
    lb = lower_bound_s(plan, durations, slots)
    made = median(makespans)
    return {
        "slots": slots,
        "n_calls": n_calls,
        "duration_ms": duration_s * 1000,
        "waves": plan.waves(),
        "critical_path_ms": critical_path_s(plan, durations) * 1000,
        "work_per_slot_ms": sum(durations.values()) / slots * 1000,
        "lower_bound_ms": lb * 1000,
        "fifo_simulated_ms": simulate_s(plan, durations, slots, by_rank=False) * 1000,
        "rank_first_simulated_ms": simulate_s(plan, durations, slots, by_rank=True) * 1000,
        "makespans_ms": [m * 1000 for m in makespans],
        "median_makespan_ms": made * 1000,
        "breakdowns_ms": parts,  # one per run, in run order
        "breakdown_ms": _median_run(makespans, parts),
        "efficiency": lb / made,
        "target": TARGETS["plan"],
        **({"raw_celery": plan_raw.summary(raw_makespans, lb)} if raw_makespans else {}),
    }
