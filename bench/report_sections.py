"""The report's sections on latency and start-up: plan efficiency, overhead, cancel latency, streaming,
sandbox and CLI (``bench/report.py`` puts them together)."""

from __future__ import annotations

from typing import Any

from .report_util import TARGETS, ms, table, verdict


def plan_section(results: dict[str, Any]) -> str | None:
    runs = results.get("plan_efficiency")
    if not runs:
        return None
    p0 = runs[0]
    waves = " / ".join(",".join(w) for w in p0["waves"])
    rows = [[p["slots"], ms(p["critical_path_ms"]), ms(p["work_per_slot_ms"]), ms(p["lower_bound_ms"]),
             ms(p["fifo_simulated_ms"]), ms(p.get("rank_first_simulated_ms")),
             f"{ms(min(p['makespans_ms']))} / **{ms(p['median_makespan_ms'])}** / {ms(max(p['makespans_ms']))}",
             f"{p['efficiency']:.3f}", _raw_plan(p)] for p in runs]
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
        "*Raw Celery, measured*: after each run, the same plan as a Celery canvas (`bench/plan_raw.py`): a group "
        "of the independent calls and of chains along the dependencies, each next call sent by the worker that "
        "ran the one before, `time.sleep` bodies, one FIFO queue, Celery's defaults, on a raw fleet of as many "
        "slots; its median makespan and efficiency.\n\n"
        + table(["worker slots", "critical path ms", "work / slots ms", "lower bound ms", "FIFO simulated ms",
                  "rank-first simulated ms", "makespan ms: best / median / worst", "efficiency (median)",
                  "raw Celery, measured: makespan ms / efficiency"], rows)
        + _plan_breakdown(runs)
    )


def _raw_plan(p: dict[str, Any]) -> str:
    raw = p.get("raw_celery")
    return "" if not raw else f"{ms(raw['median_makespan_ms'])} / {raw['efficiency']:.3f}"


def _plan_breakdown(runs: list[dict[str, Any]]) -> str:
    measured = [p for p in runs if p.get("breakdown_ms")]
    if not measured:
        return ""
    rows = []
    for p in measured:
        b = p["breakdown_ms"]
        rows.append([p["slots"], ms(b["makespan_ms"]), len(b["chain"]), ms(b["submit_ms"]),
                     ms(b["first_start_ms"]),
                     f"{ms(b['runs_ms'])} ({ms(b['runs_ms'] - b['handler_ms'])} over the tools' own time)",
                     ms(b["waits_ms"]), ms(b["collect_ms"])])
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
        + table(["worker slots", "makespan ms", "calls in chain", "submit ms", "first start ms", "runs ms",
                  "waits ms", "collect ms"], rows)
    )


def overhead_section(results: dict[str, Any]) -> str | None:
    ov = results.get("overhead")
    if not ov:
        return None
    s = ov["stats"]
    names = {"toolfleet": "(a) toolfleet `submit().results()`",
             "raw_poll_5ms": "(b) raw Celery group, `get(interval=0.005)`",
             "raw_default_get": "(c) raw Celery group, default `get()`",
             "in_process": "(d) in-process asyncio (`to_thread` per call), the floor",
             "raw_claim_poll_5ms": "(e) raw Celery with toolfleet's settings and a claim per call, group, "
                                   "`get(interval=0.005)`"}
    rows = [[names[k], v["n"], ms(v["median_ms"]), ms(v["p10_ms"]), ms(v["p90_ms"])] for k, v in s.items()]
    return (
        f"{ov['batch']} no-op calls, submit to the last result, {ov['worker_processes']} worker processes on each "
        "side (e: 2 processes of its own); they run interleaved round by round.\n\n"
        + table(["way", "runs", "median ms", "p10 ms", "p90 ms"], rows)
        + f"\n\na/b = **{ov['ratio_a_over_b']:.3f}** (target <= {TARGETS['a_b']:.2f}); "
        f"c/a = **{ov['ratio_c_over_a']:.1f}** (target >= {TARGETS['c_a']:g})."
        + ("" if "ratio_a_over_e" not in ov else
           f" a/e = **{ov['ratio_a_over_e']:.3f}**: what toolfleet's path costs beyond a claim per call.")
    )


def cancel_section(results: dict[str, Any]) -> str | None:
    cl = results.get("cancel_latency")
    if not cl:
        return None
    rows = [[c["case"].replace("_", " "), c["n"], ms(c["p50_ms"]), ms(c["p99_ms"]), ms(c["max_ms"]),
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
        + table(["case", "trials", "p50 ms", "p99 ms", "max ms", "targets"], rows)
    )


def streaming_section(results: dict[str, Any]) -> str | None:
    st = results.get("streaming")
    if not st:
        return None
    rows = [[r["stream"], r["chunks"], ms(r["stream_ms"]), r["first_call_complete_at_chunk"],
             ms(r["early_first_result_ms"]), ms(r["after_stream_first_result_ms"]), ms(r["saved_ms"])]
            for r in st["rows"]]
    return (
        f"Recorded streams replayed at {st['chunks_per_s']:g} chunks/s; time from the stream's first chunk to "
        f"the first tool result, median of {st['trials']} runs each way. *Early*: the events fed to "
        "`Dispatcher.open_stream` as they arrive, each call submitted the moment its arguments are complete; "
        "*after stream*: the whole stream read first, then submitted.\n\n"
        + table(["stream", "chunks", "stream ms", "first call complete at chunk", "early: first result ms",
                  "after stream: first result ms", "saved ms"], rows)
        + f"\n\nAPI used: {st['seam']}. A call counts as complete as toolfleet's stream parsers decide "
        "(Chat: its JSON object closes or the next call starts; Responses: `function_call_arguments.done`; "
        "Anthropic: `content_block_stop`)."
    )


def sandbox_section(results: dict[str, Any]) -> str | None:
    sb = results.get("sandbox")
    if not sb:
        return None
    st = sb["stats"]
    rows = [[name.replace("_", " "), st[name]["n"], ms(st[name]["median_ms"]), ms(st[name]["p90_ms"]),
             ms(st[name]["p99_ms"])] for name in ("no_sandbox", "sandbox")]
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
        + table(["run_command", "calls", "median ms", "p90 ms", "p99 ms"], rows)
    )


def cli_section(results: dict[str, Any]) -> str | None:
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
             verdict(cli["met"].get(name)) if name in cli["met"] else ""] for name, label in names.items()]
    return (
        f"Each command run {cli['runs']} times as a user runs it (a new process, Python's start included), against "
        f"a live local stack for `run`; wall seconds, load average {cli['load_1min']:.1f} at the end"
        + (f" (measured on {cli['date']} with `python -m bench.cli_speed`)" if cli.get("date") else "")
        + "; CPU s is the command's own process (for `up`, not the workers it starts). `--help` and "
        "`down` import neither Celery nor redis-py (lazy imports; `tests/test_newcomer.py` checks it); `down` waits "
        "on the processes' exit (pidfd), and most of its time is the Celery worker's warm shutdown of its prefork "
        "pool. Alone: `python -m bench.cli_speed`.\n\n"
        + table(["command", "median s", "range s", "CPU s", "target s", "met"], rows)
    )
