"""The markdown report, rendered from one run's results (``results.json``).

``python -m bench --render`` re-renders it (and the plot) without measuring again. Every section
renders "not measured in this run" when its results are missing, so a partial run (the smoke
test, ``--only``) still gives a whole report.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report_redis import scale_section, throughput_section
from .report_sections import (
    cancel_section,
    cli_section,
    overhead_section,
    plan_section,
    sandbox_section,
    streaming_section,
)
from .report_summary import summary_section
from .report_util import throughput_ratios

__all__ = ["SECTIONS", "render", "throughput_ratios"]

FIXES = Path(__file__).resolve().parent / "fixes.md"


SECTIONS = (
    "Summary",
    "1. Plan efficiency",
    "2. Overhead against raw Celery",
    "3. Throughput",
    "4. Cancel latency",
    "5. Streaming",
    "6. Scale (measured: one Redis against three shards)",
    "7. Sandbox overhead",
    "8. CLI start-up",
    "9. Sent events",
    "Profiles and fixes",
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
    "Summary": summary_section,
    "1. Plan efficiency": plan_section,
    "2. Overhead against raw Celery": overhead_section,
    "3. Throughput": throughput_section,
    "4. Cancel latency": cancel_section,
    "5. Streaming": streaming_section,
    "6. Scale (measured: one Redis against three shards)": scale_section,
    "7. Sandbox overhead": sandbox_section,
    "8. CLI start-up": cli_section,
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
