"""The markdown report, rendered from one run's results (``results.json``).

``python -m bench --render`` re-renders it (and the plot) without measuring again. Every section
renders "not measured in this run" when its results are missing, so a partial run (the smoke
test, ``--only``) still gives a whole report.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXES = Path(__file__).resolve().parent / "fixes.md"

SECTIONS = (
    "Summary",
    "1. Plan efficiency",
    "2. Overhead against raw Celery",
    "3. Throughput",
    "4. Cancel latency",
    "5. Streaming",
    "6. Scale (on paper)",
    "7. Sandbox overhead",
    "8. CLI start-up",
    "9. Sent events",
    "Profiles and fixes",
)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue with the figure this run measured and whether it is met."""
    rows: list[dict[str, Any]] = []
    for p in results.get("plan_efficiency") or ():
        rows.append({"what": f"plan efficiency, {p['slots']} worker slots (lower bound / makespan)",
                     "figure": f"{p['efficiency']:.3f}", "target": ">= 0.90", "ok": p["efficiency"] >= 0.90})
    ov = results.get("overhead")
    if ov:
        a_b, c_a = ov["ratio_a_over_b"], ov["ratio_c_over_a"]
        rows.append({"what": "overhead a/b (toolfleet / raw group, 5 ms polling)", "figure": f"{a_b:.3f}",
                     "target": "<= 1.15", "ok": a_b <= 1.15})
        rows.append({"what": "overhead c/a (raw group default get / toolfleet)", "figure": f"{c_a:.1f}",
                     "target": ">= 10", "ok": c_a >= 10})
    for t in throughput_ratios(results):
        rows.append({"what": f"throughput toolfleet / raw Celery, {t['worker_processes']} worker process(es) "
                             "(median of rounds)",
                     "figure": f"{t['ratio']:.3f}", "target": ">= 0.90", "ok": t["ratio"] >= 0.90})
    cl = results.get("cancel_latency")
    for case in (cl or {}).get("cases", ()):
        for stat, limit in case.get("targets", {}).items():
            rows.append({"what": f"cancel latency, {case['case'].replace('_', ' ')}, {stat[:3]}",
                         "figure": f"{case[stat]:.1f} ms", "target": f"<= {limit:g} ms", "ok": case[stat] <= limit})
    st = results.get("session_state")
    if st:
        rows.append({"what": "stored session state: load + save of a 5 KB state (median)",
                     "figure": f"{st['dict_5kb']['load_and_save']['median_ms']:.2f} ms", "target": "<= 2 ms",
                     "ok": st["dict_5kb"]["load_and_save"]["median_ms"] <= 2})
    sb = results.get("sandbox")
    if sb:
        rows.append({"what": "what the sandbox adds to a run_command call (median)",
                     "figure": f"{sb['added_median_ms']:.1f} ms", "target": f"<= {sb['target_added_ms']:g} ms",
                     "ok": sb["added_median_ms"] <= sb["target_added_ms"]})
    return rows


def _round_median(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float]:
    """Median, min and max over the rounds of a's calls/s / b's (adjacent segments, same load)."""
    rounds = [x / y for x, y in zip(a.get("segment_calls_per_s", []), b.get("segment_calls_per_s", []), strict=True)]
    if not rounds:
        total = a["calls_per_s"] / b["calls_per_s"]
        return total, total, total
    return statistics.median(rounds), min(rounds), max(rounds)


def throughput_ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per worker-process count: toolfleet / raw Celery as the median of the rounds' ratios (the
    figure judged), their range, the ratio of the totals, and, when the run had it, the split
    through raw Celery with toolfleet's settings."""
    rows = results.get("throughput") or []
    out = []
    for n in sorted({r["worker_processes"] for r in rows}):
        by = {r["system"]: r for r in rows if r["worker_processes"] == n}
        if "toolfleet" not in by or "raw_celery" not in by:
            continue
        tf, raw, like = by["toolfleet"], by["raw_celery"], by.get("raw_celery_toolfleet_settings")
        ratio, lo, hi = _round_median(tf, raw)
        entry = {"worker_processes": n, "ratio": ratio, "round_min": lo, "round_max": hi,
                 "total_ratio": tf["calls_per_s"] / raw["calls_per_s"], "toolfleet": tf, "raw": raw}
        if like is not None:
            entry["like"] = like
            entry["settings_ratio"] = _round_median(like, raw)[0]
            entry["own_path_ratio"] = _round_median(tf, like)[0]
        out.append(entry)
    return out


def _summary(results: dict[str, Any]) -> str:
    rows = targets(results)
    if not rows:
        return "No target was measured in this run."
    met = sum(1 for r in rows if r["ok"])
    table = _table(["target", "this run", "wanted", "verdict"],
                   [[r["what"], r["figure"], r["target"], _verdict(r["ok"])] for r in rows])
    missed = "" if met == len(rows) else (
        "\n\nEach missed target is explained, with its profile and what was changed for it, under "
        "*Profiles and fixes*.")
    return f"{met} of {len(rows)} targets met.\n\n{table}{missed}"


def _plan(results: dict[str, Any]) -> str | None:
    runs = results.get("plan_efficiency")
    if not runs:
        return None
    p0 = runs[0]
    waves = " / ".join(",".join(w) for w in p0["waves"])
    rows = [[p["slots"], _ms(p["critical_path_ms"]), _ms(p["work_per_slot_ms"]), _ms(p["lower_bound_ms"]),
             _ms(p["fifo_simulated_ms"]), _ms(p.get("rank_first_simulated_ms")),
             f"{_ms(min(p['makespans_ms']))} / **{_ms(p['median_makespan_ms'])}** / {_ms(max(p['makespans_ms']))}",
             f"{p['efficiency']:.3f}"] for p in runs]
    return (
        f"{p0['n_calls']} calls of {p0['duration_ms']:g} ms (`sleep_read` / `sleep_write` on `key:<label>`): "
        "reads of six keys, two write chains, reads after writes of the same key "
        "(`bench/plan_efficiency.py`). Plan waves (call ids by the earliest step they can start): "
        f"{waves}.\n\n"
        "Lower bound = max(critical path, total work / slots). The simulated columns run the plan with zero "
        "overhead under two queue disciplines: one FIFO queue (plain Celery), and the plan's rank first "
        "(toolfleet's message priorities: the call heading the longest chain starts first). Makespan minus "
        "the rank-first simulation is what the machinery costs; the simulations' gap to the lower bound is "
        f"what the order of starts costs. Median of {len(p0['makespans_ms'])} runs.\n\n"
        + _table(["worker slots", "critical path ms", "work / slots ms", "lower bound ms", "FIFO simulated ms",
                  "rank-first simulated ms", "makespan ms: best / median / worst", "efficiency (median)"], rows)
        + _plan_breakdown(runs)
    )


def _plan_breakdown(runs: list[dict[str, Any]]) -> str:
    measured = [p for p in runs if p.get("breakdown_ms")]
    if not measured:
        return ""
    rows = []
    for p in measured:
        b = p["breakdown_ms"]
        rows.append([p["slots"], _ms(b["makespan_ms"]), len(b["chain"]), _ms(b["submit_ms"]),
                     _ms(b["first_start_ms"]),
                     f"{_ms(b['runs_ms'])} ({_ms(b['runs_ms'] - b['handler_ms'])} over the tools' own time)",
                     _ms(b["waits_ms"]), _ms(b["collect_ms"])])
    return (
        "\n\nWhere the makespan goes, from the turns' ledger events (`plan_efficiency.breakdown`): the call "
        "that ended last, then the last call to end before it started (the dependency it waited for, or the "
        "call whose worker slot it took), and so on back to the start, for the run with the median makespan "
        "(every run's is in results.json); the parts add up to that run's makespan, to within a millisecond "
        "or two (ledger events carry Redis's clock in whole milliseconds). *Submit*: `submit()` until the "
        "turn is armed (validation, plan, "
        "ledger, sending the first group); *first start*: armed until the chain's first call started; "
        "*runs*: the chain's calls from `started` to `result`; *waits*: from each chain call's result to "
        "the next one's start (result event, the driver's send, a worker's fetch, or a free slot); "
        "*collect*: last result to `results()` returning.\n\n"
        + _table(["worker slots", "makespan ms", "calls in chain", "submit ms", "first start ms", "runs ms",
                  "waits ms", "collect ms"], rows)
    )


def _overhead(results: dict[str, Any]) -> str | None:
    ov = results.get("overhead")
    if not ov:
        return None
    s = ov["stats"]
    names = {"toolfleet": "(a) toolfleet `submit().results()`",
             "raw_poll_5ms": "(b) raw Celery group, `get(interval=0.005)`",
             "raw_default_get": "(c) raw Celery group, default `get()`",
             "in_process": "(d) in-process asyncio (`to_thread` per call), the floor"}
    rows = [[names[k], v["n"], _ms(v["median_ms"]), _ms(v["p10_ms"]), _ms(v["p90_ms"])] for k, v in s.items()]
    return (
        f"{ov['batch']} no-op calls, submit to the last result, {ov['worker_processes']} worker processes on each "
        "side; the four run interleaved round by round.\n\n"
        + _table(["way", "runs", "median ms", "p10 ms", "p90 ms"], rows)
        + f"\n\na/b = **{ov['ratio_a_over_b']:.3f}** (target <= 1.15); c/a = **{ov['ratio_c_over_a']:.1f}** "
        "(target >= 10)."
    )


def _throughput(results: dict[str, Any]) -> str | None:
    rows = results.get("throughput")
    if not rows:
        return None
    table = _table(
        ["system", "worker processes", "calls", "calls/s", "worker CPU ms/call", "client CPU ms/call",
         "Redis CPU ms/call", "Redis commands/call"],
        [[r["system"], r["worker_processes"], r["calls"], f"{r['calls_per_s']:.0f}",
          f"{r['worker_cpu_ms_per_call']:.2f}", f"{r['client_cpu_ms_per_call']:.2f}",
          f"{r['redis_cpu_ms_per_call']:.3f}", f"{r['redis_commands_per_call']:.1f}"] for r in rows],
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
                        f"{_change(t['settings_ratio'])}, and toolfleet's own path (ledger claim and record, "
                        f"validation, plan, push collection) {_change(t['own_path_ratio'])} on top"
                        for t in split)
            + " (medians of the rounds' ratios)."
        )
    return (
        f"No-op calls in batches of 16, {rows[0]['in_flight']} batches in flight (one client thread each), "
        "same Redis, same worker concurrency on both sides, run in "
        f"{rows[0].get('rounds', 1)} alternating segments per side. CPU and Redis figures are per call, over "
        "the measured segments.\n\n"
        + table + f"\n\ntoolfleet / raw Celery, median of the rounds' ratios: {ratios}; target >= 0.90."
        + scaling
    )


def _change(ratio: float) -> str:
    return f"{'loses' if ratio < 1 else 'gains'} {abs(1 - ratio):.0%} of its throughput (ratio {ratio:.3f})"


def _scaling(rows: list[dict[str, Any]]) -> str:
    parts = []
    for system in ("toolfleet", "raw_celery"):
        by_n = {r["worker_processes"]: r["calls_per_s"] for r in rows if r["system"] == system}
        if 1 in by_n and 2 in by_n:
            parts.append(f"{system}: 2 processes carry {by_n[2] / by_n[1]:.2f}x what 1 does")
    return ("\n\nFrom 1 to 2 worker processes: " + "; ".join(parts) + ".") if parts else ""


def _cancel(results: dict[str, Any]) -> str | None:
    cl = results.get("cancel_latency")
    if not cl:
        return None
    rows = [[c["case"].replace("_", " "), c["n"], _ms(c["p50_ms"]), _ms(c["p99_ms"]), _ms(c["max_ms"]),
             ", ".join(f"{k[:3]} <= {v:g} ms" for k, v in c.get("targets", {}).items()) or "none"]
            for c in cl["cases"]]
    return (
        "From `turn.cancel()` to `turn.results()` returning (every result final), "
        f"{cl['worker_processes']} worker processes. Queued: 4 no-op calls waiting behind long calls that hold "
        "every worker process (they end `NOT_EXECUTED`). Running command: `run_command sleep 30`, cancelled "
        "100-200 ms (random) after its `started` event (it ends `CANCELLED`, its process group killed). "
        "Running tool: a cooperative Python tool waiting on its cancel signal (no target; for comparison). "
        "The issue's targets, \"<= 50 ms and <= 250 ms\" for p50 and p99, are read as p50 <= 50 ms and "
        "p99 <= 250 ms, for both cases it names.\n\n"
        + _table(["case", "trials", "p50 ms", "p99 ms", "max ms", "targets"], rows)
    )


def _streaming(results: dict[str, Any]) -> str | None:
    st = results.get("streaming")
    if not st:
        return None
    rows = [[r["stream"], r["chunks"], _ms(r["stream_ms"]), r["first_call_complete_at_chunk"],
             _ms(r["early_first_result_ms"]), _ms(r["after_stream_first_result_ms"]), _ms(r["saved_ms"])]
            for r in st["rows"]]
    return (
        f"Recorded streams replayed at {st['chunks_per_s']:g} chunks/s; time from the stream's first chunk to "
        f"the first tool result, median of {st['trials']} runs each way. *Early*: the events fed to "
        "`Dispatcher.open_stream` as they arrive, each call submitted the moment its arguments are complete; "
        "*after stream*: the whole stream read first, then submitted.\n\n"
        + _table(["stream", "chunks", "stream ms", "first call complete at chunk", "early: first result ms",
                  "after stream: first result ms", "saved ms"], rows)
        + f"\n\nAPI used: {st['seam']}. A call counts as complete as toolfleet's stream parsers decide "
        "(Chat: its JSON object closes or the next call starts; Responses: `function_call_arguments.done`; "
        "Anthropic: `content_block_stop`)."
    )


def _scale(results: dict[str, Any]) -> str | None:
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
        + _table(["worker hosts", "projected no-op calls/s", "limited by"], rows)
        + "\n\nThese are no-op calls. With real tools a host carries its processes divided by the tools' "
        f"duration: 16 processes of 100 ms tools carry 160 calls/s, so one Redis serves about "
        f"**{pr['redis_ceiling'] / 160:.0f} such hosts**. The per-call costs were measured with workers, client "
        "and Redis sharing two cores, which inflates them a little (context switches); past the Redis ceiling, "
        "shard by namespace (one Redis per fleet) or move the broker to RabbitMQ and keep Redis for the ledger."
    )


def _sandbox(results: dict[str, Any]) -> str | None:
    sb = results.get("sandbox")
    if not sb:
        return None
    st = sb["stats"]
    rows = [[name.replace("_", " "), st[name]["n"], _ms(st[name]["median_ms"]), _ms(st[name]["p90_ms"]),
             _ms(st[name]["p99_ms"])] for name in ("no_sandbox", "sandbox")]
    return (
        f"`run_command {sb['command']!r}` through its handler, {sb['rounds']} calls each way, alternating, in one "
        "process: with the sandbox (bubblewrap: mount, user, PID, IPC, UTS, cgroup and network namespaces) and "
        "without it (`sandbox = \"none\"`). The queueing around a call through a worker is the same either way. "
        f"**Added: {sb['added_median_ms']:.1f} ms** (median; target <= {sb['target_added_ms']:g} ms)"
        + (f", at a load average of {sb['load_1min'][0]:.1f} on {results.get('meta', {}).get('cpu_count', '?')} "
           f"cores. CPU time of the processes a call starts: {sb['cpu_ms_per_call']['sandbox']:.1f} ms with the "
           f"sandbox, {sb['cpu_ms_per_call']['no_sandbox']:.1f} ms without" if sb.get("load_1min") else "")
        + ". The rest of the added time is waiting: the kernel creating and dropping the namespaces (a mount "
        "namespace alone, `unshare -m`, costs several ms), and each extra process waiting for a core, so it grows "
        "with the machine's load. Alone: `python -m bench.sandbox_overhead`.\n\n"
        + _table(["run_command", "calls", "median ms", "p90 ms", "p99 ms"], rows)
    )


def _cli(results: dict[str, Any]) -> str | None:
    cli = results.get("cli")
    if not cli:
        return None
    names = {"python": "`python -c pass` (the floor)", "help": "`toolfleet --help`",
             "run_noop": "`toolfleet run` of one `list_dir` call, `--json`",
             "up": "`toolfleet up -d` (1 worker, no Flower)",
             "down": "`toolfleet down`"}
    rows = [[label, f"{cli[name]['median_s']:.2f}", f"{cli[name]['min_s']:.2f}-{cli[name]['max_s']:.2f}",
             f"{cli[name].get('cpu_median_s', float('nan')):.2f}",
             f"<= {cli['targets_s'][name]:g}" if name in cli["targets_s"] else "",
             _verdict(cli["met"].get(name)) if name in cli["met"] else ""] for name, label in names.items()]
    return (
        f"Each command run {cli['runs']} times as a user runs it (a new process, Python's start included), against "
        f"a live local stack for `run`; wall seconds, load average {cli['load_1min']:.1f} at the end"
        + (f" (measured on {cli['date']} with `python -m bench.cli_speed`)" if cli.get("date") else "")
        + "; CPU s is the command's own process (for `up`, not the workers it starts). `--help` and "
        "`down` import neither Celery nor redis-py (lazy imports; `tests/test_newcomer.py` checks it); `down` waits "
        "on the processes' exit (pidfd), and most of its time is the Celery worker's warm shutdown of its prefork "
        "pool. Alone: `python -m bench.cli_speed`.\n\n"
        + _table(["command", "median s", "range s", "CPU s", "target s", "met"], rows)
    )


def _sent_events_render(results: dict[str, Any]) -> str | None:
    from .sent_events import render  # imports toolfleet: only when the section is rendered

    return render(results)


def _fixes(results: dict[str, Any]) -> str:
    if results.get("meta", {}).get("quick"):
        return ("Not repeated for a quick run: `bench/fixes.md` explains the full run committed in "
                "`bench/results/`, whose figures it quotes.")
    return FIXES.read_text().strip() if FIXES.exists() else "No fixes recorded."


RENDERERS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "Summary": _summary,
    "1. Plan efficiency": _plan,
    "2. Overhead against raw Celery": _overhead,
    "3. Throughput": _throughput,
    "4. Cancel latency": _cancel,
    "5. Streaming": _streaming,
    "6. Scale (on paper)": _scale,
    "7. Sandbox overhead": _sandbox,
    "8. CLI start-up": _cli,
    "9. Sent events": lambda results: _sent_events_render(results),
    "Profiles and fixes": _fixes,
}


def _header(results: dict[str, Any]) -> str:
    m = results.get("meta", {})
    load = m.get("load_before", [None] * 3)
    load_after = m.get("load_after", [None] * 3)
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    lines = [
        "# toolfleet benchmark report",
        "",
        f"Made with `{m.get('command', 'python -m bench')}` on {m.get('date', '?')} in "
        f"{m.get('wall_s', 0):.0f} s."
        + (f" Text and derived figures re-rendered from its results with `python -m bench --render` on "
           f"{m['rendered']}." if m.get("rendered") else ""),
        "",
        f"- Machine: **{m.get('cpu_count', '?')} cores** ({m.get('cpu_model', '?')}), {m.get('platform', '?')}.",
        f"- Load average (1, 5, 15 min) before the run: {', '.join(f'{x:.2f}' for x in load if x is not None)}; "
        f"after: {', '.join(f'{x:.2f}' for x in load_after if x is not None)} (the run's own load included)."
        + (f" Processes outside the benchmark used **{m['others_cpu_cores']:.2f} cores** on average during the "
           "run (machine busy time minus the run's own CPU)." if m.get("others_cpu_cores") is not None else ""),
        f"- Redis: {m.get('redis', '?')}. {versions}.",
        *([f"- Machine speed: a Redis PING round trip from Python takes **{m['speed']['redis_ping_us']:.0f} µs** "
           f"(median), a fixed pure-Python loop of 1,000,000 additions **{m['speed']['python_loop_ms']:.0f} ms** "
           "(`bench.run.machine_speed`): per-call costs below scale with these."] if m.get("speed") else []),
        "- Figures are medians and ratios from this one run, never single absolute times; the plot is "
        "[bench.png](bench.png), the raw numbers [results.json](results.json).",
    ]
    if m.get("quick"):
        lines += ["", "> **Quick run** (`--quick`: a few trials, 800 throughput calls): the figures are indicative "
                  "only and swing widely between runs; targets are judged on a full run (`make bench`)."]
    if m.get("note"):
        lines += ["", f"> {m['note']}"]
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    """The whole report as markdown: header, then every section of :data:`SECTIONS`."""
    parts = [_header(results)]
    for title in SECTIONS:
        body = RENDERERS[title](results)
        parts.append(f"## {title}\n\n{body if body else '_Not measured in this run._'}")
    return "\n\n".join(parts) + "\n"

