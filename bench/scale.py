"""Measurement 6, scale: Redis CPU and commands per call, the ledger on one Redis against each shard of
a three-master Redis Cluster, measured in one run, and the calls/s projected from those figures.

Two toolfleet fleets, the same worker concurrency and the same no-op load (batches of 16, ``in_flight``
client threads, as :mod:`bench.throughput`), in alternating segments so drifting machine load hits
both alike:

- ``one_redis``: the ledger on a Redis of its own (a second private ``redis-server``), so its counters
  are the ledger's alone;
- ``cluster``: the ledger on three masters (:class:`bench.cluster.LocalCluster`, ``ledger_url``
  ``redis+cluster://``).

The broker (Celery's queues) stays the run's single Redis for both. Around each segment every server's
``INFO`` is read (:mod:`bench.redis_stats`): CPU seconds (``used_cpu_sys + used_cpu_user``), commands
(``total_commands_processed``, a script's inner commands counted) and ``INFO commandstats``; each is
divided by the segment's calls. :func:`project` turns the per-shard figures into calls/s against
shards and worker hosts; its assumptions are in its docstring and in the report.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import redis

from . import redis_stats
from .cluster import LocalCluster
from .overhead import BATCH, run_toolfleet
from .stack import PrivateRedis, ToolfleetFleet
from .throughput import _drive

__all__ = ["measure", "project"]

HOST_COUNTS = (1, 2, 4, 8, 16, 32, 64)
SHARD_COUNTS = (3, 6, 12)


class _Side:
    """One ledger layout under load: its fleet, the servers it is measured on, what it has used."""

    def __init__(self, name: str, fleet: ToolfleetFleet, ledger_nodes: list[redis.Redis]) -> None:
        self.name, self.fleet, self.ledger_nodes = name, fleet, ledger_nodes
        self.calls, self.wall_s, self.worker_cpu_s = 0, 0.0, 0.0
        self.broker: dict[str, Any] = {}
        self.ledger: list[dict[str, Any]] = [{} for _ in ledger_nodes]
        self.idle: list[dict[str, Any]] = [{} for _ in ledger_nodes]  # while the other side runs
        self.idle_wall_s = 0.0

    def segment(self, broker: redis.Redis, batches: int, in_flight: int, idle: _Side) -> None:
        """``batches`` batches of this side's load; ``idle``'s ledger servers, untouched meanwhile, are
        read too: what they use then is their background cost (cron, cluster bus, an idle worker's
        heartbeats), per second."""
        nodes = [broker, *self.ledger_nodes, *idle.ledger_nodes]
        before, worker_before = [redis_stats.counters(c) for c in nodes], self.fleet.worker.cpu_s()
        wall_s = _drive(lambda: run_toolfleet(self.fleet), batches, in_flight)
        after, worker_after = [redis_stats.counters(c) for c in nodes], self.fleet.worker.cpu_s()
        self.calls += batches * BATCH
        self.wall_s += wall_s
        self.worker_cpu_s += worker_after - worker_before
        deltas = [redis_stats.delta(b, a) for b, a in zip(before, after, strict=True)]
        self.broker = redis_stats.add(self.broker, deltas[0])
        mine = deltas[1:1 + len(self.ledger_nodes)]
        self.ledger = [redis_stats.add(total, d) for total, d in zip(self.ledger, mine, strict=True)]
        idle.idle_wall_s += wall_s
        idle.idle = [redis_stats.add(total, d)
                     for total, d in zip(idle.idle, deltas[1 + len(self.ledger_nodes):], strict=True)]

    def row(self) -> dict[str, Any]:
        n = self.calls
        nodes = [dict(redis_stats.per_call(d, n), port=c.connection_pool.connection_kwargs.get("port"))
                 for d, c in zip(self.ledger, self.ledger_nodes, strict=True)]
        commands = sum(d["commands"] for d in self.ledger) or 1.0
        # the ledger's own commands: without the cluster client's COMMAND GETKEYS look-ups
        own = [d["commands"] - d["cmdstats"].get("command", 0.0) for d in self.ledger]
        for node, d, idle, mine in zip(nodes, self.ledger, self.idle, own, strict=True):
            node["share_of_commands"] = d["commands"] / commands
            node["share_of_own_commands"] = mine / (sum(own) or 1.0)
            # background CPU (s per s) measured while idle, and this side's CPU per call net of it
            node["idle_cpu_per_s"] = idle.get("cpu_s", 0.0) / self.idle_wall_s if self.idle_wall_s else 0.0
            node["net_cpu_ms_per_call"] = max(d["cpu_s"] - node["idle_cpu_per_s"] * self.wall_s, 0.0) / n * 1000
        return {
            "ledger": self.name, "calls": n, "calls_per_s": n / self.wall_s,
            "worker_processes": self.fleet.concurrency,
            "worker_cpu_ms_per_call": self.worker_cpu_s / n * 1000,
            "broker": redis_stats.per_call(self.broker, n),
            "ledger_nodes": nodes,
            "ledger_cpu_ms_per_call": sum(x["cpu_ms_per_call"] for x in nodes),
            "ledger_net_cpu_ms_per_call": sum(x["net_cpu_ms_per_call"] for x in nodes),
            "ledger_commands_per_call": sum(x["commands_per_call"] for x in nodes),
        }


def measure(broker_url: str, *, total_calls: int = 4000, in_flight: int = 4, rounds: int = 6,
            processes: int = 2, cores_per_host: int = 2) -> dict[str, Any]:
    """The two layouts under ``total_calls`` no-op calls each, ``processes`` worker processes each;
    returns ``{"rows": [one_redis row, cluster row], "rounds", "in_flight", "projection"}``. Raises
    ``FileNotFoundError`` when ``redis-server`` / ``redis-cli`` are missing (no cluster)."""
    ledger_redis = PrivateRedis()
    broker = redis.Redis.from_url(broker_url)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
            cluster = LocalCluster(Path(tmp))
            try:
                with ToolfleetFleet(broker_url, processes, ledger_url=ledger_redis.url) as one, \
                        ToolfleetFleet(broker_url, processes, ledger_url=cluster.url) as sharded:
                    sides = [_Side("one_redis", one, [redis.Redis.from_url(ledger_redis.url)]),
                             _Side("cluster", sharded, cluster.nodes())]
                    for side in sides:  # warm-up
                        _drive(lambda s=side: run_toolfleet(s.fleet), in_flight * 2, in_flight)
                    batches = max(-(-total_calls // (BATCH * rounds)), 1)
                    for r in range(rounds):
                        first, second = sides if r % 2 == 0 else sides[::-1]
                        first.segment(broker, batches, in_flight, idle=second)
                        second.segment(broker, batches, in_flight, idle=first)
                    rows = [side.row() for side in sides]
            finally:
                cluster.stop()
    finally:
        broker.close()
        ledger_redis.stop()
    return {"rows": rows, "rounds": rounds, "in_flight": in_flight,
            "projection": project(rows, cores_per_host=cores_per_host)}


def project(rows: list[dict[str, Any]], *, cores_per_host: int = 2) -> dict[str, Any]:
    """Projected no-op calls/s against worker hosts and ledger shards, from the measured rows.

    Assumptions (the report states them): each Redis is single-threaded and has a core of its own, so
    it carries at most ``(1 - its background CPU per s) / its CPU per call net of that background``
    calls/s (background: what it used while the other layout ran); the broker (its CPU per call gross:
    it is never idle) is one Redis whatever the ledger, so it caps every column; a worker host of
    ``cores_per_host`` cores carries ``cores / worker CPU per call`` calls/s (CPU-bound, enough
    processes to hide the round trips); on S shards the ledger's net CPU per call is the cluster's
    measured total, spread as on three shards: the busiest shard's part stays ``imbalance / S``
    (``imbalance`` = busiest shard's share of the commands x 3, measured; at 3 shards the busiest
    shard as measured); ``one Redis for both``: broker and ledger on one server, its CPU the sum.
    """
    one, cl = (next(r for r in rows if r["ledger"] == name) for name in ("one_redis", "cluster"))
    per_host = cores_per_host * 1000 / cl["worker_cpu_ms_per_call"]
    broker_ms = (one["broker"]["cpu_ms_per_call"] + cl["broker"]["cpu_ms_per_call"]) / 2
    shards = cl["ledger_nodes"]
    imbalance = max(n["share_of_commands"] for n in shards) * len(shards)
    busiest = max(shards, key=lambda n: n["net_cpu_ms_per_call"])
    background = sum(n["idle_cpu_per_s"] for n in shards) / len(shards)
    single = one["ledger_nodes"][0]

    def ceiling(net_ms: float, idle_per_s: float) -> float:
        return (1 - min(idle_per_s, 0.99)) * 1000 / max(net_ms, 1e-6)

    ceilings = {"one Redis for both": ceiling(broker_ms + single["net_cpu_ms_per_call"], single["idle_cpu_per_s"]),
                "ledger on 1 Redis": ceiling(single["net_cpu_ms_per_call"], single["idle_cpu_per_s"])}
    for s in SHARD_COUNTS:
        ceilings[f"ledger on {s} shards"] = (
            ceiling(busiest["net_cpu_ms_per_call"], busiest["idle_cpu_per_s"]) if s == len(shards)
            else ceiling(cl["ledger_net_cpu_ms_per_call"] * imbalance / s, background))
    broker_ceiling = 1000 / broker_ms
    table = []
    for hosts in HOST_COUNTS:
        cells = {}
        for name, ledger_ceiling in ceilings.items():
            limiter = "redis" if name == "one Redis for both" else "ledger"
            limits = {"workers": hosts * per_host, limiter: ledger_ceiling}
            if name != "one Redis for both":
                limits["broker"] = broker_ceiling
            by = min(limits, key=limits.__getitem__)
            cells[name] = {"calls_per_s": limits[by], "limited_by": by}
        table.append({"hosts": hosts, "cells": cells})
    return {"cores_per_host": cores_per_host, "per_host_calls_per_s": per_host, "broker_cpu_ms_per_call": broker_ms,
            "broker_ceiling": broker_ceiling, "imbalance": imbalance, "ledger_ceilings": ceilings,
            "rows": table}
