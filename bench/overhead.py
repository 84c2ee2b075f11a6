"""Measurement 2, overhead against raw Celery: 16 no-op calls, submit to the last result.

(a) toolfleet: ``Dispatcher.submit(calls).results()`` (validation, plan, ledger, push collection);
(b) a raw Celery ``group`` of the same no-op, collected with ``get(interval=0.005)``;
(c) the same group with the default ``get()`` (polls the result backend every 0.5 s);
(d) the no-op handler called in-process with asyncio (``asyncio.to_thread`` per call): the floor;
(e) with a raw fleet that has toolfleet's Celery settings and a claim round trip per call
(``bench.raw_celery``, ``like-toolfleet-claim``), its group collected as (b): raw Celery's own figure
for a runtime that fences each call before running it (docs/design.md, fencing), so a/e is the gap
left to toolfleet's own path.

They run interleaved, round by round, so drifting machine load hits them alike. Ratios are of
medians from this one run: a/b and c/a (targets: ``bench.report_util.TARGETS``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from celery import group

from toolfleet import ToolCall

from .report_util import TARGETS
from .stack import RawFleet, ToolfleetFleet
from .stats import summary_ms
from .tools import noop

BATCH = 16


def noop_calls(n: int = BATCH, prefix: str = "n") -> list[ToolCall]:
    return [ToolCall(id=f"{prefix}{i}", name="noop", arguments="{}", index=i) for i in range(n)]


def run_toolfleet(fleet: ToolfleetFleet, n: int = BATCH) -> float:
    t0 = time.perf_counter()
    results = fleet.dispatcher.submit(noop_calls(n)).results(timeout_s=30)
    elapsed = time.perf_counter() - t0
    if not all(r.ok for r in results):
        raise RuntimeError(f"no-op batch failed: {[r.content for r in results if not r.ok][:1]}")
    return elapsed


def run_raw(fleet: RawFleet, n: int = BATCH, interval_s: float | None = 0.005) -> float:
    t0 = time.perf_counter()
    pending = group(fleet.noop.s() for _ in range(n)).apply_async()
    values = pending.get(timeout=30) if interval_s is None else pending.get(timeout=30, interval=interval_s)
    elapsed = time.perf_counter() - t0
    if values != ["ok"] * n:
        raise RuntimeError(f"raw group returned {values!r}")
    return elapsed


def run_in_process(loop: asyncio.AbstractEventLoop, n: int = BATCH) -> float:
    async def batch() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(noop.handler) for _ in range(n)))
        return time.perf_counter() - t0

    return loop.run_until_complete(batch())


def measure(tf: ToolfleetFleet, raw: RawFleet, *, rounds: int = 30, default_get_rounds: int = 10,
            warmup: int = 3, raw_claim: RawFleet | None = None) -> dict[str, Any]:
    """Interleave (a)-(d), and (e) when ``raw_claim`` is given, for ``rounds`` rounds ((c) only in the
    first ``default_get_rounds``: each costs ~0.5 s by construction)."""
    samples: dict[str, list[float]] = {"toolfleet": [], "raw_poll_5ms": [], "raw_default_get": [], "in_process": []}
    if raw_claim is not None:
        samples["raw_claim_poll_5ms"] = []
    loop = asyncio.new_event_loop()
    try:
        for _ in range(warmup):
            run_toolfleet(tf)
            run_raw(raw)
            run_in_process(loop)
            if raw_claim is not None:
                run_raw(raw_claim)
        for i in range(rounds):
            samples["toolfleet"].append(run_toolfleet(tf))
            samples["raw_poll_5ms"].append(run_raw(raw))
            if raw_claim is not None:
                samples["raw_claim_poll_5ms"].append(run_raw(raw_claim))
            if i < default_get_rounds:
                samples["raw_default_get"].append(run_raw(raw, interval_s=None))
            samples["in_process"].append(run_in_process(loop))
    finally:
        loop.close()
    stats = {k: summary_ms(v) for k, v in samples.items()}
    a = stats["toolfleet"]["median_ms"]
    b = stats["raw_poll_5ms"]["median_ms"]
    c = stats["raw_default_get"]["median_ms"]
    return {
        "batch": BATCH,
        "worker_processes": tf.concurrency,
        "stats": stats,
        "ratio_a_over_b": a / b,
        "ratio_c_over_a": c / a,
        **({"ratio_a_over_e": a / stats["raw_claim_poll_5ms"]["median_ms"]} if raw_claim is not None else {}),
        "target_a_over_b": TARGETS["a_b"],
        "target_c_over_a": TARGETS["c_a"],
    }
