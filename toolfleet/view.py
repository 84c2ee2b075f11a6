"""Terminal output of the CLI (rich): progress while a turn runs, the results table, the catalog."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .dispatcher.turn import Turn
from .models import ToolResult


def progress(turn: Turn, console: Console, timeout_s: float | None) -> list[ToolResult]:
    """Show results arriving; return them in model order."""
    with Progress(
        SpinnerColumn(),
        TextColumn("turn {task.fields[turn]}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} calls"),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("", total=len(turn.calls), turn=turn.turn_id[:8])
        for result in turn.as_completed(timeout_s):
            bar.update(task, advance=1, description=f"{result.call_id} {result.status}")
    return turn.results()


def print_results(
    console: Console, turn: Turn, results: list[ToolResult], elapsed_s: float, after_cancel_s: float | None
) -> None:
    if not results:
        console.print(f"turn {turn.turn_id}: the response has no tool calls; nothing to run")
        return
    table = Table(title=f"turn {turn.turn_id}", show_lines=True)
    for column in ("#", "call id", "tool", "status", "ms", "content"):
        table.add_column(column, overflow="fold")
    for i, r in enumerate(results):
        status = "[green]ok[/]" if r.ok else f"[red]{r.code.value if r.code else 'error'}[/]"
        ms = "" if r.run_ms is None else f"{r.run_ms:.0f}"
        lines = r.content.strip().splitlines() or [""]
        text = "\n".join(lines[:4]) + (f"\n... ({len(lines)} lines)" if len(lines) > 4 else "")
        table.add_row(str(i), escape(r.call_id), r.name, status, ms, escape(text[:400]))
    console.print(table)
    waves = turn.plan.waves()
    if waves:
        console.print(escape("plan: " + "  then  ".join("[" + ", ".join(w) + "]" for w in waves)))
    line = f"{len(results)} results in {elapsed_s:.2f} s"
    if after_cancel_s is not None:
        line += f"; final {after_cancel_s:.2f} s after the cancel"
    console.print(line)


def print_catalog(console: Console, entries: list[dict[str, Any]], namespace: str = "toolfleet") -> None:
    if not entries:
        console.print(f"no live worker in namespace {namespace!r} (start one with `toolfleet worker` or "
                      "`toolfleet up`, or pass the namespace the workers use with --namespace)")
        return
    table = Table(title="tools served by live workers")
    for column in ("tool", "access", "queue", "timeout s", "workers", "description"):
        table.add_column(column, overflow="fold")
    by_tool: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for entry in entries:
        for spec in entry["tools"]:
            by_tool.setdefault(spec["name"], (spec, []))[1].append(entry["worker"])
    for name, (spec, workers) in sorted(by_tool.items()):
        first_line = (spec.get("description") or "").splitlines()[0] if spec.get("description") else ""
        table.add_row(name, spec["access"], spec["queue"], f"{spec['timeout_s']:g}", ", ".join(workers), first_line)
    console.print(table)
    from .tools.published import version_conflicts

    for name, versions in sorted(version_conflicts(entries).items()):  # never silently mixed: refused
        told = "; ".join(f"version {v} on {', '.join(sorted(w))}" for v, w in sorted(versions.items()))
        console.print(f"[bold red]{name}: {len(versions)} different versions live ({escape(told)}); "
                      "its calls get TOOL_UNAVAILABLE until one is left[/]")
    for entry in entries:
        box = entry.get("sandbox") or {}
        if box.get("mode") == "none":
            console.print(f"[bold yellow]{entry['worker']}: run_command runs UNSANDBOXED (sandbox = \"none\")[/]")
        elif box.get("error"):
            reason = escape(str(box["error"]))
            console.print(f"[bold red]{entry['worker']}: no sandbox, run_command not served: {reason}[/]")
        elif box:
            console.print(f"{entry['worker']}: sandbox {box['mode']}, network {box.get('network')}")
