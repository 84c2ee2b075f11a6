"""The report's sections on load: throughput against raw Celery (with Redis's counters per call) and
scale (the ledger on one Redis against a three-master cluster, and the projection)."""

from __future__ import annotations

from typing import Any

from .report_util import TARGETS, change, table, throughput_ratios


def throughput_section(results: dict[str, Any]) -> str | None:
    rows = results.get("throughput")
    if not rows:
        return None
    text = table(
        ["system", "worker processes", "calls", "calls/s", "worker CPU ms/call", "client CPU ms/call",
         "Redis CPU ms/call", "Redis commands/call", "of which client / script-inner (MONITOR sample)",
         "Celery broker commands/call"],
        [[r["system"], r["worker_processes"], r["calls"], f"{r['calls_per_s']:.0f}",
          f"{r['worker_cpu_ms_per_call']:.2f}", f"{r['client_cpu_ms_per_call']:.2f}",
          f"{r['redis_cpu_ms_per_call']:.3f}", f"{r['redis_commands_per_call']:.1f}", _split(r),
          f"{r['redis']['celery_broker_commands_per_call']:.1f}" if r.get("redis") else "n/a"] for r in rows],
    )
    ratios = "; ".join(
        f"{t['worker_processes']} process(es): **{t['ratio']:.3f}** (rounds {t['round_min']:.2f}-{t['round_max']:.2f}; "
        f"ratio of the totals {t['total_ratio']:.3f})" for t in throughput_ratios(results))
    scaling = _scaling(rows)
    split = [t for t in throughput_ratios(results) if "like" in t]
    if split:
        scaling += (
            "\n\nWhere the difference goes, through a third side, raw Celery with toolfleet's Celery settings "
            "(task events published in batches, no prefetch, late acknowledgement, toolfleet's kombu transport, "
            "message priorities; `bench/raw_celery.py`): "
            + "; ".join(f"{t['worker_processes']} process(es): with the settings raw Celery "
                        f"{change(t['settings_ratio'])}, and toolfleet's own path (ledger claim and record, "
                        f"validation, plan, push collection) {change(t['own_path_ratio'])} on top"
                        for t in split)
            + " (medians of the rounds' ratios)."
        )
    return (
        f"No-op calls in batches of 16, {rows[0]['in_flight']} batches in flight (one client thread each), "
        "same Redis, same worker concurrency on both sides, run in "
        f"{rows[0].get('rounds', 1)} alternating segments per side. CPU and Redis figures are per call, over "
        "the measured segments. Redis commands are `total_commands_processed`, which counts the commands a "
        "Lua script runs inside Redis as well as those clients send; the split beside it comes from an "
        "untimed sample after the rounds (`MONITOR` attached, which tags a script's commands `lua`). *Celery "
        "broker commands*: kombu's per-message commands, from `INFO commandstats`: LPUSH and BRPOP, and "
        "the ack emulation's two transactions (MULTI, ZADD, HSET, EXEC on delivery; MULTI, ZREM, HDEL, EXEC on "
        "ack), counted as 4 per ZADD and 4 per ZREM, since the ledger sends HSET, MULTI and EXEC too).\n\n"
        + text + f"\n\ntoolfleet / raw Celery, median of the rounds' ratios: {ratios}; target >= "
        f"{TARGETS['throughput']:.2f}." + scaling + _top_commands(rows)
    )


def _split(r: dict[str, Any]) -> str:
    mon = r.get("redis_monitor_sample")
    return "n/a" if not mon else f"{mon['client_per_call']:.1f} / {mon['script_inner_per_call']:.1f}"


def _top_commands(rows: list[dict[str, Any]], n: int = 8) -> str:
    parts = []
    for r in rows:
        stats = (r.get("redis") or {}).get("cmdstats_per_call")
        if stats:
            top = ", ".join(f"{name.upper()} {v:.1f}" for name, v in list(stats.items())[:n])
            parts.append(f"- {r['system']}, {r['worker_processes']} process(es): {top}")
    return ("\n\nMost frequent commands per call (`INFO commandstats`, script-inner included):\n\n"
            + "\n".join(parts)) if parts else ""


def _scaling(rows: list[dict[str, Any]]) -> str:
    parts = []
    for system in ("toolfleet", "raw_celery"):
        by_n = {r["worker_processes"]: r["calls_per_s"] for r in rows if r["system"] == system}
        if 1 in by_n and 2 in by_n:
            parts.append(f"{system}: 2 processes carry {by_n[2] / by_n[1]:.2f}x what 1 does")
    return ("\n\nFrom 1 to 2 worker processes: " + "; ".join(parts) + ".") if parts else ""


def scale_section(results: dict[str, Any]) -> str | None:
    sc = results.get("scale")
    if not sc:
        return None
    pr, rb = sc["projection"], sc["redis_benchmark"]
    ops = ", ".join(f"{k} {v:,.0f}" for k, v in (rb.get("ops_per_s") or {}).items()) or "redis-benchmark not found"
    rows = [[r["hosts"], f"{r['calls_per_s']:,.0f}", r["limited_by"]] for r in pr["rows"]]
    src = sc["source"]
    return (
        f"From the toolfleet throughput run with {src['worker_processes']} worker processes: worker CPU "
        f"{src['worker_cpu_ms_per_call']:.2f} ms/call, dispatcher CPU {src['client_cpu_ms_per_call']:.2f} ms/call, "
        f"Redis CPU {src['redis_cpu_ms_per_call']:.3f} ms/call, {src['redis_commands_per_call']:.1f} Redis "
        "commands/call (scripts' inner commands counted).\n\n"
        f"Redis on this machine (`redis-benchmark -q -n {rb.get('requests', 0):,} -c {rb.get('clients', 0)}`, "
        f"private server, no pipelining): {ops} ops/s.\n\n"
        f"- One worker host of {pr['cores_per_host']} cores: ~{pr['per_host_calls_per_s']:,.0f} no-op calls/s "
        "(cores / worker CPU per call).\n"
        f"- One Redis: **~{pr['redis_ceiling_by_cpu']:,.0f} calls/s**, by its CPU per call (single-threaded: one "
        f"core); the ceiling used below. Pessimistic bound: ~{pr['redis_ceiling_by_commands'] or 0:,.0f}, "
        "redis-benchmark's median ops/s over the commands per call, which counts each command a ledger script "
        "runs inside Redis as if it were a round trip.\n"
        f"- Redis becomes the limit at about **{pr['hosts_to_saturate_redis']:.1f} hosts** of this size.\n"
        f"- A dispatcher process carries ~{pr['dispatcher_calls_per_s_per_core']:,.0f} calls/s per core of its own.\n\n"
        + table(["worker hosts", "projected no-op calls/s", "limited by"], rows)
        + "\n\nThese are no-op calls. With real tools a host carries its processes divided by the tools' "
        f"duration: 16 processes of 100 ms tools carry 160 calls/s, so one Redis serves about "
        f"**{pr['redis_ceiling'] / 160:.0f} such hosts**. The per-call costs were measured with workers, client "
        "and Redis sharing two cores, which inflates them a little (context switches); past the Redis ceiling, "
        "shard by namespace (one Redis per fleet) or move the broker to RabbitMQ and keep Redis for the ledger."
    )
