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
        ["system", "worker processes", "calls", "calls/s", "worker CPU ms/call", "of which main / pool",
         "client CPU ms/call",
         "Redis CPU ms/call", "Redis commands/call", "of which client / script-inner (MONITOR sample)",
         "Celery broker commands/call"],
        [[r["system"], r["worker_processes"], r["calls"], f"{r['calls_per_s']:.0f}",
          f"{r['worker_cpu_ms_per_call']:.2f}", _cpu_split(r), f"{r['client_cpu_ms_per_call']:.2f}",
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
    claimed = [t for t in split if "claim" in t]
    if claimed:
        scaling += (
            "\n\nThe claim's share, through a fourth side: that raw Celery with one claim per call as well, a round "
            "trip to a Lua script of the shape of toolfleet's claim (the turn's flags read, a fencing token taken, "
            "the start recorded, a started event; `bench/raw_celery.py` `CLAIM_SCRIPT`), before the task's body. "
            "A runtime on Celery that claims each call in a round trip of its own before running it, as toolfleet "
            "does (docs/design.md: the claim is what keeps a cancelled, answered or superseded call from running), "
            "is held to this side's rate on this machine: "
            + "; ".join(f"{t['worker_processes']} process(es): it reaches **{t['claim_ratio']:.3f}** of raw Celery, "
                        f"and toolfleet {t['beyond_claim_ratio']:.3f} of it" for t in claimed)
            + " (medians of the rounds' ratios)."
        )
    scaling += _cpu_gap(claimed)
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


def _cpu_split(r: dict[str, Any]) -> str:
    main, pool = r.get("worker_main_cpu_ms_per_call"), r.get("worker_pool_cpu_ms_per_call")
    return "n/a" if main is None or pool is None else f"{main:.2f} / {pool:.2f}"


def _cpu_gap(claimed: list[dict[str, Any]]) -> str:
    """Where toolfleet's worker CPU per call goes beyond the claim floor's (the fourth side), by
    process; ``claimed``: the :func:`throughput_ratios` entries that have that side."""
    key_main, key_pool = "worker_main_cpu_ms_per_call", "worker_pool_cpu_ms_per_call"
    parts = []
    for t in claimed:
        tf, fl = t["toolfleet"], t["claim"]
        if key_main in tf and key_main in fl:  # results from before the split have neither
            parts.append(f"{t['worker_processes']} process(es): "
                         f"{tf['worker_cpu_ms_per_call'] - fl['worker_cpu_ms_per_call']:+.2f} ms, of which main "
                         f"process {tf[key_main] - fl[key_main]:+.2f} ms and pool "
                         f"{tf[key_pool] - fl[key_pool]:+.2f} ms")
    if not parts:
        return ""
    return ("\n\ntoolfleet's worker CPU per call beyond the claim floor's (the fourth side): " + "; ".join(parts)
            + " (what each part holds: *Profiles and fixes*).")


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
    if not sc or "rows" not in sc:  # none, or a results.json from before the measured section
        return None
    one, cl = (next(r for r in sc["rows"] if r["ledger"] == name) for name in ("one_redis", "cluster"))
    pr = sc["projection"]
    servers = []
    for r, label in ((one, "ledger on one Redis"), (cl, "ledger on 3 shards")):
        servers.append([label, "broker (Celery's queues)", *_server(r["broker"]), "", "", "",
                        f"{r['calls_per_s']:.0f}"])
        for i, node in enumerate(r["ledger_nodes"]):
            name = "ledger" if len(r["ledger_nodes"]) == 1 else f"ledger shard {i + 1} (:{node['port']})"
            servers.append([label, name, *_server(node), f"{node['idle_cpu_per_s'] * 1000:.1f}",
                            f"{node['net_cpu_ms_per_call']:.3f}", f"{node['share_of_commands']:.0%}", ""])
        if len(r["ledger_nodes"]) > 1:
            servers.append([label, "ledger, all shards", f"{r['ledger_cpu_ms_per_call']:.3f}",
                            f"{r['ledger_commands_per_call']:.1f}", "", "", f"{r['ledger_net_cpu_ms_per_call']:.3f}",
                            "100%", ""])
    shares = " / ".join(f"{n['share_of_commands']:.0%}" for n in cl["ledger_nodes"])
    own = " / ".join(f"{n.get('share_of_own_commands', n['share_of_commands']):.0%}" for n in cl["ledger_nodes"])
    names = list(pr["ledger_ceilings"])
    proj = [[r["hosts"], *(f"{r['cells'][n]['calls_per_s']:,.0f} ({r['cells'][n]['limited_by']})" for n in names)]
            for r in pr["rows"]]
    ceilings = ", ".join(f"{n}: {c:,.0f}" for n, c in pr["ledger_ceilings"].items())
    return (
        f"Measured, not projected from one Redis: the same toolfleet no-op load (batches of 16, {sc['in_flight']} "
        f"in flight, {one['worker_processes']} worker processes) run with the ledger on a Redis of its own and "
        f"with the ledger on a three-master Redis Cluster (`ledger_url` `redis+cluster://`, `bench/cluster.py`), "
        f"{one['calls']} calls each in {sc['rounds']} alternating segments; the broker is the run's single Redis "
        "for both. Per server, from its `INFO` before and after each segment: CPU (`used_cpu_sys + used_cpu_user`), "
        "commands (`total_commands_processed`, script-inner included) and script calls (`cmdstat_evalsha` and "
        "kin: client commands), each divided by the calls. *Background*: what a ledger server used per second "
        "while the other layout ran (its cron, the cluster bus, an idle worker's heartbeats); the net CPU per call "
        "takes it out.\n\n"
        + table(["layout", "server", "CPU ms/call", "commands/call", "scripts/call", "background CPU ms/s",
                 "CPU ms/call net of background", "share of ledger commands", "calls/s of the load"], servers)
        + f"\n\n**Each shard's share of the ledger's commands: {shares}**; without the cluster client's `COMMAND` "
        f"look-ups (below), which all go to one node: {own}. A third each would be 33%: turns land on shards by "
        "their random turn ids, and the shard holding the namespace's fence counter and the tools' breakers "
        f"carries a little more. Busiest shard / mean: {pr['imbalance']:.2f}. On three shards "
        f"the ledger runs {cl['ledger_net_cpu_ms_per_call']:.3f} ms of Redis CPU per call in all (net of "
        f"background), against {one['ledger_net_cpu_ms_per_call']:.3f} on one Redis, and "
        f"{cl['ledger_commands_per_call']:.1f} commands against {one['ledger_commands_per_call']:.1f}"
        + _getkeys(cl) + ".\n\n"
        "Projection, from these figures. Assumptions: each Redis is single-threaded and gets a core of its own, "
        "so it carries at most (1 s - its background CPU per s) / (its net CPU per call) calls/s; the broker "
        "stays one Redis "
        f"({pr['broker_cpu_ms_per_call']:.3f} ms/call, the mean of the two layouts: **~{pr['broker_ceiling']:,.0f} "
        "calls/s whatever the ledger**), so it caps every column but the first; a worker host of "
        f"{pr['cores_per_host']} cores carries ~{pr['per_host_calls_per_s']:,.0f} calls/s (cores / worker CPU ms "
        "per call, measured on the cluster layout; CPU-bound once it runs enough processes to hide the round "
        "trips); on S shards the ledger's net CPU per call is the three-shard total, and the busiest shard "
        "keeps the measured imbalance (its part = imbalance / S, its background the shards' mean; 3 shards: the "
        "busiest shard as measured); "
        "*one Redis for both* puts broker and ledger on one server (the default), its CPU the sum. Ceilings "
        f"(calls/s): {ceilings}. The per-call CPU was measured with workers, clients and every Redis sharing "
        f"{results.get('meta', {}).get('cpu_count', '?')} cores, which inflates it a little (context switches); "
        "no-op calls: with real tools a host carries its processes divided by the tools' duration.\n\n"
        + table(["worker hosts", *names], proj)
        + "\n\nPast the broker's ceiling the next step is the broker, not the ledger: RabbitMQ (quorum queues, "
        "docs/scaling.md) or a broker Redis per namespace."
    )


def _server(p: dict[str, Any]) -> list[str]:
    return [f"{p['cpu_ms_per_call']:.3f}", f"{p['commands_per_call']:.1f}", f"{p['script_calls_per_call']:.1f}"]


def _getkeys(cl: dict[str, Any]) -> str:
    """The cluster client's ``COMMAND GETKEYS`` round trips, when the shards' commandstats show them."""
    n = sum(node["cmdstats_per_call"].get("command", 0.0) for node in cl["ledger_nodes"])
    if n < 0.1:
        return ""
    return (f", of which {n:.1f} per call are `COMMAND` (redis-py's cluster client asks a node for the keys of "
            "each command whose keys it cannot place itself, XREAD among them: one extra round trip each)")
