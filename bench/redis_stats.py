"""What a Redis did during a measurement: its own counters, read before and after.

- :func:`counters`: ``total_commands_processed`` (commands, a script's inner commands included: Redis
  counts every command it runs, from a client or from a Lua script), ``used_cpu_sys + used_cpu_user``
  (CPU seconds of the server process, all its threads) and ``INFO commandstats`` (calls per command
  name, inner commands again included), as one dict; :func:`delta` subtracts two.
- :func:`monitor_split`: which of the commands came from clients (round trips) and which from inside
  scripts, which no INFO counter tells (Redis 7.0 counts a script's ``HSET`` as ``cmdstat_hset`` like a
  client's). It reads ``MONITOR`` while a piece of load runs: ``MONITOR`` slows Redis, so the caller
  runs it on an untimed sample, apart from the measured segments.
- :data:`CELERY_QUEUE_COMMANDS`: how the commands kombu's Redis transport sends for a message (publish,
  fetch, the unacked-hash ack emulation) are counted (:func:`broker_commands`); toolfleet pays them
  as Celery does, without the ack emulation's MULTI/EXEC (toolfleet/worker/transport.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

import redis

# kombu's Redis transport per message: LPUSH (publish), BRPOP (fetch), and its ack emulation: one
# transaction on delivery (MULTI, ZADD into the unacked index, HSET into the unacked hash, EXEC) and
# one on ack (MULTI, ZREM, HDEL, EXEC). Counted from the commands only the broker sends (the ledger
# also sends HSET, MULTI, EXEC): pushes and pops, plus 4 per ZADD and 4 per ZREM.
CELERY_QUEUE_COMMANDS = frozenset({"lpush", "rpush", "brpop", "rpop", "lpop"})
CELERY_ACK_COMMANDS = frozenset({"zadd", "zrem"})
# commands that start a script: the round trip is the client's, what the script runs is inner
SCRIPT_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})


def counters(client: redis.Redis) -> dict[str, Any]:
    """``{"commands": float, "cpu_s": float, "cmdstats": {name: calls}}`` of the server ``client``
    talks to (a plain client: on a cluster, one per node). Subcommands fold into their command
    (``client|list`` counts as ``client``)."""
    info = client.info("all")
    stats: dict[str, float] = {}
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, dict):
            name = key[len("cmdstat_"):].split("|", 1)[0]
            stats[name] = stats.get(name, 0.0) + float(value.get("calls", 0))
    return {"commands": float(info["total_commands_processed"]),
            "cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), "cmdstats": stats}


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` for two :func:`counters` (command names with no calls in between dropped)."""
    names = set(before["cmdstats"]) | set(after["cmdstats"])
    stats = {n: after["cmdstats"].get(n, 0.0) - before["cmdstats"].get(n, 0.0) for n in names}
    return {"commands": after["commands"] - before["commands"], "cpu_s": after["cpu_s"] - before["cpu_s"],
            "cmdstats": {n: v for n, v in stats.items() if v}}


def add(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """The sum of two :func:`delta` results (``total`` may be empty)."""
    stats = dict(total.get("cmdstats", {}))
    for n, v in more["cmdstats"].items():
        stats[n] = stats.get(n, 0.0) + v
    return {"commands": total.get("commands", 0.0) + more["commands"],
            "cpu_s": total.get("cpu_s", 0.0) + more["cpu_s"], "cmdstats": stats}


def broker_commands(stats: dict[str, float]) -> float:
    """kombu's per-message commands in ``stats`` (by name): publish and fetch, and each unacked-index
    update (``ZADD``/``ZREM``) with its ``HSET``/``HDEL``, plus the ``MULTI``/``EXEC`` around it where
    the transport sends one (kombu's own; toolfleet's sends a plain pipeline: at most the
    transactions the run made are counted)."""
    acks = sum(v for n, v in stats.items() if n in CELERY_ACK_COMMANDS)
    transactions = min(stats.get("multi", 0.0), acks)
    return sum(v for n, v in stats.items() if n in CELERY_QUEUE_COMMANDS) + 2 * acks + 2 * transactions


def per_call(d: dict[str, Any], calls: int) -> dict[str, Any]:
    """A :func:`delta` divided by ``calls``: ``cpu_ms_per_call``, ``commands_per_call``,
    ``script_calls_per_call`` (EVALSHA and kin), ``celery_broker_commands_per_call`` (kombu's
    per-message commands, counted as :data:`CELERY_QUEUE_COMMANDS` says) and ``cmdstats_per_call``
    (by name)."""
    stats = d["cmdstats"]
    return {
        "cpu_ms_per_call": d["cpu_s"] / calls * 1000,
        "commands_per_call": d["commands"] / calls,
        "script_calls_per_call": sum(v for n, v in stats.items() if n in SCRIPT_COMMANDS) / calls,
        "celery_broker_commands_per_call": broker_commands(stats) / calls,
        "cmdstats_per_call": {n: v / calls for n, v in sorted(stats.items(), key=lambda kv: -kv[1])},
    }


def monitor_split(redis_cli: str, host: str, port: int, run: Callable[[], int],
                  password: str | None = None) -> dict[str, float]:
    """Run ``run`` (it returns the calls it made) with ``redis-cli MONITOR`` attached to ``host:port``;
    returns ``{"calls", "client_per_call", "script_inner_per_call"}``: commands sent by clients (each a
    round trip, or part of a pipeline) and commands run inside Lua scripts (MONITOR tags them
    ``[db lua]``), per call. Joined on MONITOR's own lines (its ``OK``, then an ``ECHO`` marker sent
    after the load), never on a sleep. Raises ``RuntimeError`` when MONITOR does not attach."""
    client = redis.Redis(host=host, port=port, password=password)
    client.ping()  # connected (and its handshake done) before MONITOR attaches: only the marker is ours
    env = dict(os.environ, **({"REDISCLI_AUTH": password} if password else {}))
    proc = subprocess.Popen([redis_cli, "-h", host, "-p", str(port), "monitor"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, errors="replace", env=env)
    marker = "bench-monitor-end"
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "OK":
            raise RuntimeError("redis-cli MONITOR did not attach")
        calls = run()
        client.echo(marker)
        inner = outer = 0
        for line in proc.stdout:
            if marker in line and '"echo"' in line.lower():
                break
            if " lua] " in line:
                inner += 1
            elif line.strip():
                outer += 1
        else:
            raise RuntimeError("redis-cli MONITOR ended before the marker")
    finally:
        proc.terminate()
        proc.wait()
        client.close()
    return {"calls": calls, "client_per_call": outer / calls, "script_inner_per_call": inner / calls}
