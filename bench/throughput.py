"""Measurement 3, throughput: sustained no-op calls per second, toolfleet against raw Celery.

``total_calls`` no-op calls on each side in batches of 16, with ``in_flight`` batches outstanding
at any time (``in_flight`` client threads, each submitting its next batch when the last one is
complete, the way concurrent agent sessions would), in alternating segments of toolfleet and raw
Celery. Wall time runs from the first submit to the last result of each segment. The ratio is the
median of the rounds' ratios (each round: one toolfleet and one raw segment, back to back), so a
burst of load from elsewhere skews one round, not the figure.

Alongside the rate, the run records what each call costs: CPU seconds of the worker processes, of
the client process and of Redis, and Redis commands, each divided by the calls, with Redis's
``INFO commandstats`` by command name (:mod:`bench.redis_stats`). After the timed rounds, one
untimed sample per side runs with ``MONITOR`` attached, to split the commands into those clients
send (round trips) and those Lua scripts run inside Redis.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from . import redis_stats
from .cluster import binaries
from .overhead import BATCH, run_raw, run_toolfleet
from .stack import RawFleet, ToolfleetFleet, WorkerProcess


def _client_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _drive(run_batch: Callable[[], float], batches: int, in_flight: int) -> float:
    """Run ``batches`` batches on ``in_flight`` threads; returns the wall time in seconds."""
    lock = threading.Lock()
    left = [batches]
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if left[0] <= 0 or errors:
                    return
                left[0] -= 1
            try:
                run_batch()
            except BaseException as exc:  # surfaced after the join
                errors.append(exc)
                return

    threads = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(in_flight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


class _Side:
    """One system under load: how to run a batch, its worker, and what it has used so far."""

    def __init__(self, system: str, run_batch: Callable[[], float], worker: WorkerProcess, processes: int) -> None:
        self.system, self.run_batch, self.worker, self.processes = system, run_batch, worker, processes
        self.calls = 0
        self.segment_rates: list[float] = []
        self.totals = {"wall_s": 0.0, "worker_main_cpu_s": 0.0, "worker_pool_cpu_s": 0.0, "client_cpu_s": 0.0}
        self.redis: dict[str, Any] = {}
        self.split: dict[str, float] | None = None

    def segment(self, client: redis.Redis, batches: int, in_flight: int) -> None:
        before_redis, before_worker, before_client = (redis_stats.counters(client), self.worker.cpu_split_s(),
                                                      _client_cpu_s())
        wall_s = _drive(self.run_batch, batches, in_flight)
        after_redis, after_worker, after_client = (redis_stats.counters(client), self.worker.cpu_split_s(),
                                                   _client_cpu_s())
        self.calls += batches * BATCH
        self.segment_rates.append(batches * BATCH / wall_s)
        self.totals["wall_s"] += wall_s
        self.totals["worker_main_cpu_s"] += after_worker[0] - before_worker[0]
        self.totals["worker_pool_cpu_s"] += after_worker[1] - before_worker[1]
        self.totals["client_cpu_s"] += after_client - before_client
        self.redis = redis_stats.add(self.redis, redis_stats.delta(before_redis, after_redis))

    def monitor_sample(self, client: redis.Redis, batches: int, in_flight: int) -> None:
        """Untimed: ``batches`` batches with MONITOR attached (client vs script-inner commands)."""
        found = binaries()
        kwargs = client.connection_pool.connection_kwargs
        if found is None or "host" not in kwargs:  # no redis-cli, or a unix socket
            return
        try:
            self.split = redis_stats.monitor_split(
                found[1], kwargs["host"], kwargs.get("port", 6379),
                lambda: (_drive(self.run_batch, batches, in_flight), batches * BATCH)[1], kwargs.get("password"))
        except RuntimeError:  # MONITOR refused (an ACL user without it, TLS): the split is left out
            self.split = None

    def row(self, in_flight: int, rounds: int) -> dict[str, Any]:
        t, n = self.totals, self.calls
        return {
            "system": self.system,
            "worker_processes": self.processes,
            "in_flight": in_flight,
            "rounds": rounds,
            "calls": n,
            "wall_s": t["wall_s"],
            "calls_per_s": n / t["wall_s"],
            "segment_calls_per_s": self.segment_rates,
            "worker_cpu_ms_per_call": (t["worker_main_cpu_s"] + t["worker_pool_cpu_s"]) / n * 1000,
            "worker_main_cpu_ms_per_call": t["worker_main_cpu_s"] / n * 1000,
            "worker_pool_cpu_ms_per_call": t["worker_pool_cpu_s"] / n * 1000,
            "client_cpu_ms_per_call": t["client_cpu_s"] / n * 1000,
            "redis_cpu_ms_per_call": self.redis["cpu_s"] / n * 1000,
            "redis_commands_per_call": self.redis["commands"] / n,
            "redis": redis_stats.per_call(self.redis, n),
            "redis_monitor_sample": self.split,
        }


def measure(tf: ToolfleetFleet, raw: RawFleet, raw_like_toolfleet: RawFleet | None = None,
            raw_with_claim: RawFleet | None = None, *,
            total_calls: int = 10_000, in_flight: int = 4, rounds: int = 10) -> list[dict[str, Any]]:
    """``total_calls`` no-op calls on each side, run in ``rounds`` alternating segments (the order
    of the sides reverses every round), so drifting machine load hits all alike. One row per side,
    with each segment's rate (the report pairs them by round). ``raw_like_toolfleet``, a raw Celery
    fleet with toolfleet's Celery settings, splits the difference into what those settings cost
    and what toolfleet's own path costs. ``raw_with_claim``, that fleet with a claim round trip per
    call as well (``bench.raw_celery.CLAIM_SCRIPT``), is the floor of a Celery runtime that fences
    each call before it runs."""
    sides = [
        _Side("toolfleet", lambda: run_toolfleet(tf), tf.worker, tf.concurrency),
        _Side("raw_celery", lambda: run_raw(raw), raw.worker, raw.concurrency),
    ]
    if raw_like_toolfleet is not None:
        sides.append(_Side("raw_celery_toolfleet_settings", lambda: run_raw(raw_like_toolfleet),
                           raw_like_toolfleet.worker, raw_like_toolfleet.concurrency))
    if raw_with_claim is not None:
        sides.append(_Side("raw_celery_toolfleet_settings_claim", lambda: run_raw(raw_with_claim),
                           raw_with_claim.worker, raw_with_claim.concurrency))
    client = redis.Redis.from_url(tf.redis_url)
    try:
        for side in sides:  # warm-up
            _drive(side.run_batch, in_flight * 2, in_flight)
        batches = max(-(-total_calls // (BATCH * rounds)), 1)
        for r in range(rounds):
            for side in sides if r % 2 == 0 else reversed(sides):
                side.segment(client, batches, in_flight)
        for side in sides:
            side.monitor_sample(client, in_flight * 2, in_flight)
    finally:
        client.close()
    return [side.row(in_flight, rounds) for side in sides]

