"""The benchmark run: every measurement, side by side, on one stack; then the report and the plot.

``python -m bench [--quick] [--only NAMES] [--out DIR] [--redis-url URL] [--note TEXT]``.
Fleets are started per stage and stopped after it, so only the fleet being measured works.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
from kombu.utils.url import maybe_sanitize_url

from toolfleet.settings import Settings

from . import cancel_latency, overhead, plan_efficiency, sandbox_overhead, scale, sent_events, streaming, throughput
from .report import render
from .stack import ROOT, PrivateRedis, RawFleet, ToolfleetFleet

MEASUREMENTS = ("plan", "overhead", "throughput", "cancel", "streaming", "scale", "sandbox", "session_state", "cli",
                "sent_events")


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does; ``full`` meets the issue's minimums."""

    plan_trials: int
    plan_slots: tuple[int, ...]
    overhead_rounds: int
    overhead_default_get_rounds: int
    throughput_calls: int
    throughput_in_flight: int
    cancel_trials: int
    stream_trials: int
    scale_calls: int
    sandbox_rounds: int = 200
    sent_events_calls: int = 4000


FULL = Sizes(plan_trials=7, plan_slots=(2, 4, 8), overhead_rounds=40, overhead_default_get_rounds=10,
             throughput_calls=10_000, throughput_in_flight=4, cancel_trials=50, stream_trials=5,
             scale_calls=4000)
QUICK = Sizes(plan_trials=2, plan_slots=(2, 4), overhead_rounds=8, overhead_default_get_rounds=2,
              throughput_calls=800, throughput_in_flight=4, cancel_trials=5, stream_trials=1,
              scale_calls=640, sandbox_rounds=40, sent_events_calls=640)


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def busy_cpu_s() -> float:
    """CPU seconds processes have used on the whole machine (all cores: user, nice and system time
    from /proc/stat; interrupts and steal are left out, as no process is charged for them)."""
    try:
        user, nice, system = (int(x) for x in Path("/proc/stat").read_text().split()[1:4])
    except (OSError, ValueError):
        return float("nan")
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (fleets, Redis, tools)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def machine_speed(redis_url: str) -> dict[str, float]:
    """Two figures that say how fast this machine is for what toolfleet does, so runs on
    different machines can be compared: the median round trip of a Redis PING from Python (µs) and
    the best time of a fixed pure-Python loop (ms)."""
    client = redis.Redis.from_url(redis_url)
    pings = []
    for _ in range(2000):
        t0 = time.perf_counter()
        client.ping()
        pings.append(time.perf_counter() - t0)
    loops = []
    for _ in range(5):
        t0 = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        loops.append(time.perf_counter() - t0)
    return {"redis_ping_us": sorted(pings)[len(pings) // 2] * 1e6, "python_loop_ms": min(loops) * 1000}


def _masked(arg: str) -> str:
    """A command-line argument as the report shows it: a URL's password masked (``--opt=URL`` too)."""
    if "://" not in arg:
        return arg
    option, sep, url = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    return f"{option}{sep}{maybe_sanitize_url(url)}"


def meta(redis_url: str, command: str, note: str | None) -> dict[str, Any]:
    info = redis.Redis.from_url(redis_url).info("server")
    return {
        "speed": machine_speed(redis_url),
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        "load_before": list(os.getloadavg()),
        "redis": f"redis-server {info.get('redis_version')} (private to the run)",
        "versions": {pkg: version(pkg) for pkg in ("toolfleet", "celery", "kombu", "redis", "pydantic")},
        "note": note,
    }


def run(sizes: Sizes, only: tuple[str, ...], redis_url: str | None, out: Path, command: str,
        note: str | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    busy_before, own_before = busy_cpu_s(), own_cpu_s()
    private = None if redis_url else PrivateRedis()
    url = redis_url or private.url  # type: ignore[union-attr]
    results: dict[str, Any] = {"meta": meta(url, command, note)}
    results["meta"]["quick"] = sizes == QUICK
    try:
        if {"overhead", "throughput", "cancel", "streaming", "plan", "sent_events"} & set(only):
            _stage_two_processes(url, sizes, only, results)
        if "throughput" in only:
            _log(f"throughput, {sizes.throughput_calls} calls a side, 1 worker process")
            with ToolfleetFleet(url, 1) as tf, RawFleet(url, 1) as raw, RawFleet(url, 1, like_toolfleet=True) as rtf, \
                    RawFleet(url, 1, like_toolfleet=True, claim=True) as rcl:
                results["throughput"][:0] = throughput.measure(
                    tf, raw, rtf, rcl, total_calls=sizes.throughput_calls, in_flight=sizes.throughput_in_flight)
        if "plan" in only:
            for slots in sizes.plan_slots:
                if slots == 2:
                    continue  # measured with the two-process fleet
                _log(f"plan efficiency with {slots} worker slots")
                with ToolfleetFleet(url, slots) as tf, RawFleet(url, slots) as raw:
                    results["plan_efficiency"].append(plan_efficiency.measure(tf.dispatcher, slots,
                                                                              trials=sizes.plan_trials, raw=raw))
        if "scale" in only:
            _log(f"scale: the ledger on one Redis and on a three-master cluster, {sizes.scale_calls} calls each")
            try:
                results["scale"] = scale.measure(url, total_calls=sizes.scale_calls,
                                                 in_flight=sizes.throughput_in_flight,
                                                 cores_per_host=os.cpu_count() or 1)
            except FileNotFoundError as exc:  # no redis-server / redis-cli for the cluster
                _log(f"scale not measured: {exc}")
        if "sandbox" in only:
            _log(f"sandbox: run_command with and without it, {sizes.sandbox_rounds} calls each")
            try:
                results["sandbox"] = sandbox_overhead.measure(sizes.sandbox_rounds)
            except RuntimeError as exc:
                _log(f"sandbox not measured: {exc}")
        if "session_state" in only:
            from . import session_state

            _log("stored session state: load + save of a 5 KB state")
            results["session_state"] = session_state.measure(max(sizes.sandbox_rounds * 2, 100), url)
        if "cli" in only:
            from . import cli_speed

            _log("CLI: --help, a no-op run, up -d and down, 5 times each")
            results["cli"] = cli_speed.measure(5, url)
    finally:
        if private is not None:
            private.stop()
    results["meta"]["load_after"] = list(os.getloadavg())
    results["meta"]["wall_s"] = wall_s = time.perf_counter() - started
    if redis_url is None:  # every process of the run has been waited for: the rest is someone else's
        others_s = (busy_cpu_s() - busy_before) - (own_cpu_s() - own_before)
        results["meta"]["others_cpu_cores"] = max(others_s, 0.0) / wall_s
    write(results, out)
    return results


def _stage_two_processes(url: str, sizes: Sizes, only: tuple[str, ...], results: dict[str, Any]) -> None:
    with ToolfleetFleet(url, 2) as tf, RawFleet(url, 2) as raw:
        if "overhead" in only:
            _log("overhead, 16 no-op calls: toolfleet, raw Celery (5 ms poll, default get, with a claim), in-process")
            with RawFleet(url, 2, like_toolfleet=True, claim=True) as rcl:
                results["overhead"] = overhead.measure(tf, raw, rounds=sizes.overhead_rounds,
                                                       default_get_rounds=sizes.overhead_default_get_rounds,
                                                       raw_claim=rcl)
        if "plan" in only:
            _log("plan efficiency with 2 worker slots (toolfleet, then the same plan as a raw Celery canvas)")
            results["plan_efficiency"] = [plan_efficiency.measure(tf.dispatcher, 2, trials=sizes.plan_trials,
                                                                  raw=raw)]
        if "cancel" in only:
            _log(f"cancel latency, {sizes.cancel_trials} trials per case")
            results["cancel_latency"] = cancel_latency.measure(tf, trials=sizes.cancel_trials)
        if "streaming" in only:
            _log("streaming: early dispatch against waiting for the stream")
            with tempfile.TemporaryDirectory(prefix="bench-ws-") as tmp:
                ws = shutil.copytree(ROOT / "examples" / "cases" / "workspace", Path(tmp) / "workspace")
                results["streaming"] = streaming.measure(tf.dispatcher, str(ws), trials=sizes.stream_trials)
        if "sent_events" in only:
            _log(f"sent events on and off, {sizes.sent_events_calls} calls a side, 2 worker processes")
            results["sent_events"] = sent_events.measure(tf, total_calls=sizes.sent_events_calls,
                                                         in_flight=sizes.throughput_in_flight)
        if "throughput" in only:
            _log(f"throughput, {sizes.throughput_calls} calls a side, 2 worker processes")
            with RawFleet(url, 2, like_toolfleet=True) as rtf, RawFleet(url, 2, like_toolfleet=True, claim=True) as rcl:
                results["throughput"] = throughput.measure(
                    tf, raw, rtf, rcl, total_calls=sizes.throughput_calls, in_flight=sizes.throughput_in_flight)


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "report.md").write_text(render(results))
    from .plot import plot  # matplotlib: the bench extra (the smoke tests need only the test extra)

    plot(results, out / "bench.png")
    _log(f"wrote {out / 'report.md'} and {out / 'bench.png'}")


def render_again(out: Path) -> None:
    """Re-render the report and the plot from ``out/results.json`` (after editing ``bench/fixes.md``
    or the report's wording), recomputing the figures derived from the measurements."""
    results = json.loads((out / "results.json").read_text())
    sc = results.get("scale")
    if sc and "rows" in sc:  # a run before the measured scale section has no rows to project from
        sc["projection"] = scale.project(sc["rows"], cores_per_host=results["meta"].get("cpu_count") or 1)
    results["meta"]["rendered"] = time.strftime("%Y-%m-%d %H:%M %Z")
    write(results, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for trying the suite out")
    parser.add_argument("--only", default=",".join(MEASUREMENTS),
                        help=f"comma-separated subset of {','.join(MEASUREMENTS)}")
    parser.add_argument("--out", type=Path, default=None,
                        help="where report.md, bench.png and results.json go (default: bench/results, the "
                             "committed report; with --quick: .toolfleet/bench-quick, git-ignored)")
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of a private one")
    parser.add_argument("--note", default=None, help="a line to put at the top of the report")
    parser.add_argument("--render", action="store_true",
                        help="measure nothing: re-render report and plot from OUT/results.json")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = ROOT / (".toolfleet/bench-quick" if args.quick else "bench/results")
    if args.render:
        render_again(args.out)
        return
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = set(only) - set(MEASUREMENTS)
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    # the command goes into the report: a Redis URL in it with its password masked
    shown = [_masked(arg) for arg in sys.argv[1:]]
    command = "make bench" if os.environ.get("BENCH_VIA_MAKE") else shlex.join(["python", "-m", "bench", *shown])
    # a rediss:// URL gets the TLS options of the environment (TOOLFLEET_REDIS_CA_FILE...), which every
    # client of the run (the raw Celery baseline too) then reads from it: docs/deploying.md
    redis_url = Settings.from_env({k: v for k, v in os.environ.items() if k.startswith("TOOLFLEET_REDIS_")},
                                  redis_url=args.redis_url).redis_url if args.redis_url else None
    run(QUICK if args.quick else FULL, only, redis_url, args.out, command, args.note)
