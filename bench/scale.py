"""Measurement 6, scale on paper: what N worker hosts and one Redis would carry.

From the throughput run's per-call costs (CPU of the workers, of the dispatcher and of Redis, and
Redis commands per call) and Redis's own capacity on this machine (``redis-benchmark`` against a
private ``redis-server``, never against a shared one):

- a worker host with ``k`` cores carries about ``k / worker_cpu_per_call`` no-op calls per second
  (it is CPU-bound once it runs enough processes to hide the Redis round trips);
- one Redis (single-threaded) carries at most ``1 / redis_cpu_per_call`` calls per second: the
  ceiling used. ``redis-benchmark ops/s / commands per call`` is reported beside it as a pessimistic
  bound: it counts each command a Lua script runs inside Redis as if it were a network round trip;
- N hosts carry ``min(N * per_host, redis_ceiling)``: Redis becomes the limit past
  ``redis_ceiling / per_host`` hosts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

from .stack import PrivateRedis

REDIS_BENCH_TESTS = "set,get,lpush,rpop,hset,zadd"
HOST_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def redis_ops_per_s(requests: int = 100_000, clients: int = 50) -> dict[str, Any]:
    """``redis-benchmark -q`` against a private ``redis-server`` started for it; ops/s per test."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"available": False}
    server = PrivateRedis()
    try:
        out = subprocess.run(
            [binary, "-h", "127.0.0.1", "-p", str(server.port), "-q", "-n", str(requests), "-c", str(clients),
             "-t", REDIS_BENCH_TESTS],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout
    finally:
        server.stop()
    ops = {}
    for line in out.replace("\r", "\n").splitlines():
        m = re.match(r"^\s*([A-Z_]+)(?: \([^)]*\))?: ([\d.]+) requests per second", line)
        if m:
            ops[m.group(1).lower()] = float(m.group(2))
    return {"available": True, "requests": requests, "clients": clients, "ops_per_s": ops,
            "median_ops_per_s": sorted(ops.values())[len(ops) // 2] if ops else None}


def project(per_call: dict[str, float], redis_bench: dict[str, Any], *, cores_per_host: int) -> dict[str, Any]:
    """Project calls/s for N hosts from the per-call costs of a throughput run (``per_call`` holds
    ``worker_cpu_ms_per_call``, ``client_cpu_ms_per_call``, ``redis_cpu_ms_per_call``,
    ``redis_commands_per_call``)."""
    per_host = cores_per_host * 1000 / per_call["worker_cpu_ms_per_call"]
    redis_by_cpu = 1000 / per_call["redis_cpu_ms_per_call"] if per_call["redis_cpu_ms_per_call"] > 0 else None
    ops = redis_bench.get("median_ops_per_s")
    redis_by_ops = ops / per_call["redis_commands_per_call"] if ops else None
    ceiling = redis_by_cpu or redis_by_ops
    rows = [{"hosts": n, "calls_per_s": min(n * per_host, ceiling) if ceiling else n * per_host,
             "limited_by": "redis" if ceiling and n * per_host >= ceiling else "workers"} for n in HOST_COUNTS]
    return {
        "cores_per_host": cores_per_host,
        "per_host_calls_per_s": per_host,
        "dispatcher_calls_per_s_per_core": 1000 / per_call["client_cpu_ms_per_call"],
        "redis_ceiling_by_cpu": redis_by_cpu,
        "redis_ceiling_by_commands": redis_by_ops,
        "redis_ceiling": ceiling,
        "hosts_to_saturate_redis": ceiling / per_host if ceiling else None,
        "rows": rows,
    }
