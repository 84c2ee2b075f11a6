"""Measurement 1's raw Celery side: the same plan run as a Celery canvas, measured, not simulated.

Issue 16 asks, where a target is above what Celery itself allows here, for raw Celery's own figure
from the same run. For plan efficiency that is the batch's plan written the way a Celery user
would write it: a ``group`` of the independent calls and of ``chain`` s along the dependencies
(each next call sent by the worker that ran the one before it: Celery's own chaining, with no
client hop), every call a plain ``time.sleep`` task (``bench.raw.sleep``), one FIFO queue, Celery's
defaults, nothing claimed, checked or recorded. Results are collected with ``get(interval=0.005)``,
as the overhead section's (b).

The canvas can say this plan because its dependencies, once transitively reduced, form a forest
(each call waits for at most one other): :func:`forest` checks that and raises ``ValueError`` for a
plan that needs joins (a chord per join would add Celery's chord machinery to the measurement).
"""

from __future__ import annotations

import time
from typing import Any

from celery import chain, group
from celery.result import AsyncResult, ResultSet

from toolfleet.dispatcher import Plan

from .stack import RawFleet
from .stats import median


def forest(plan: Plan) -> dict[str, str | None]:
    """Each call's one parent in the transitive reduction of ``plan.deps`` (None for a root).

    Raises ``ValueError`` when a call has two parents that neither reaches the other through."""
    ancestors: dict[str, set[str]] = {}
    parent: dict[str, str | None] = {}
    for c in plan.order:  # deps are always earlier in model order
        deps = set(plan.deps[c])
        reach = set(deps)
        for d in deps:
            reach |= ancestors[d]
        ancestors[c] = reach
        direct = {d for d in deps if not any(d in ancestors[e] for e in deps if e != d)}
        if len(direct) > 1:
            raise ValueError(f"call {c} waits for {sorted(direct)}: a join, which a canvas of chains cannot say")
        parent[c] = next(iter(direct), None)
    return parent


def canvas(plan: Plan, sleep_task: Any, duration_s: float) -> tuple[Any, dict[str, str]]:
    """The plan as one ``group`` of chains; returns it and the Celery task id of each call."""
    parent = forest(plan)
    children: dict[str | None, list[str]] = {}
    for c in plan.order:
        children.setdefault(parent[c], []).append(c)
    ids: dict[str, str] = {}

    def subtree(c: str) -> Any:
        sig = sleep_task.si(duration_s, c)
        ids[c] = sig.freeze().id
        below = [subtree(k) for k in children.get(c, [])]
        if not below:
            return sig
        return chain(sig, below[0] if len(below) == 1 else group(below))

    return group([subtree(c) for c in children.get(None, [])]), ids


def run_once(raw: RawFleet, plan: Plan, duration_s: float) -> float:
    """One run of the plan on ``raw``'s worker: ``apply_async`` until every call's result is in (s)."""
    work, ids = canvas(plan, raw.sleep, duration_s)
    t0 = time.perf_counter()
    work.apply_async()
    pending = ResultSet([AsyncResult(ids[c], app=raw.app) for c in plan.order], app=raw.app)
    values = pending.get(timeout=60, interval=0.005)
    elapsed = time.perf_counter() - t0
    if values != list(plan.order):
        raise RuntimeError(f"raw canvas returned {values!r}")
    return elapsed


def summary(makespans_s: list[float], lower_bound_s: float) -> dict[str, Any]:
    made = median(makespans_s)
    return {"makespans_ms": [m * 1000 for m in makespans_s], "median_makespan_ms": made * 1000,
            "efficiency": lower_bound_s / made}
