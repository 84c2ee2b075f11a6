"""Terminal output of the CLI (rich): the results table, the catalog (the live view: :mod:`.progress`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .dispatcher.turn import Turn
from .keys import Keys
from .models import ToolResult
from .terminal import whole_width
from .trace import ERROR_MARK, OK_MARK


def print_results(
    console: Console, turn: Turn, results: list[ToolResult], elapsed_s: float, after_cancel_s: float | None
) -> None:
    if not results:
        console.print(f"turn {turn.turn_id}: the response has no tool calls; nothing to run")
        return
    table = Table(title=f"turn {turn.turn_id}", show_lines=True)
    ids, names = [r.call_id for r in results], [r.name for r in results]
    wide = console.width >= max(len(v) for v in ids) + max(len(v) for v in names) + 70
    table.add_column("#", justify="right", no_wrap=True)
    if wide:
        table.add_column("call id", overflow="fold", width=whole_width(ids + ["call id"], console.width, 70))
        table.add_column("tool", overflow="fold", width=whole_width(names + ["tool"], console.width, 70))
        table.add_column("status", overflow="fold")
        table.add_column("ms", justify="right", no_wrap=True)
    else:  # narrow: the id on its own line, the tool and the status under it
        table.add_column("call id / tool", overflow="fold",
                         width=whole_width(ids + names + ["call id / tool"], console.width, 36))
    table.add_column("content", overflow="fold")
    for i, r in enumerate(results):
        status = Text(f"{OK_MARK} ok", style="green") if r.ok else Text(
            f"{ERROR_MARK} {r.code.value if r.code else 'error'}", style="red")
        ms = "" if r.run_ms is None else f"{r.run_ms:.0f}"
        text = Text(_cell(r.content))
        if wide:
            table.add_row(str(i), Text(r.call_id), Text(r.name), status, ms, text)
        else:
            cell = Text(r.call_id) + Text("\n" + r.name, style="bold") + Text("\n") + status
            table.add_row(str(i), cell + Text(f" · {ms} ms" if ms else ""), text)
    console.print(table)
    waves = turn.plan.waves()
    if waves:
        console.print(escape("plan: " + "  then  ".join("[" + ", ".join(w) + "]" for w in waves)))
    line = f"{len(results)} results in {elapsed_s:.2f} s"
    if after_cancel_s is not None:
        line += f"; final {after_cancel_s:.2f} s after the cancel"
    console.print(line)


def _cell(content: str, max_lines: int = 4, max_chars: int = 400) -> str:
    """A result's content for the table: its first ``max_lines`` lines and ``max_chars``
    characters, saying what was left out (``--json`` shows it whole)."""
    lines = content.strip().splitlines() or [""]
    text = "\n".join(lines[:max_lines])
    if len(text) > max_chars:
        text = text[:max_chars] + "…"
    if len(lines) > max_lines or text.endswith("…"):
        text += f"\n... ({len(lines)} lines, {len(content)} characters; --json shows it whole)"
    return text


def print_catalog(console: Console, entries: list[dict[str, Any]], namespace: str = "toolfleet") -> None:
    if not entries:
        console.print(f"no live worker in namespace {namespace!r} (start one with `toolfleet worker` or "
                      "`toolfleet up`, or pass the namespace the workers use with --namespace)")
        return
    table = Table(title="tools served by live workers")
    by_tool: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for entry in entries:
        for spec in entry["tools"]:
            by_tool.setdefault(spec["name"], (spec, []))[1].append(entry["worker"])
    keys = Keys(namespace)
    queues = {name: keys.queue(spec["queue"]) for name, (spec, _) in by_tool.items()}  # what workers consume
    table.add_column("tool / queue", overflow="fold",
                     width=whole_width([*queues.values(), "tool / queue"], console.width, 40))
    table.add_column("workers", overflow="fold")
    table.add_column("description", overflow="fold", )
    for name, (spec, workers) in sorted(by_tool.items()):
        first_line = (spec.get("description") or "").splitlines()[0] if spec.get("description") else ""
        cell = Text(name, style="bold") + Text(f"\n{queues[name]}\n{spec['access']} · {spec['timeout_s']:g} s")
        table.add_row(cell, Text(", ".join(workers)), Text(first_line))
    console.print(table)
    from .tools.published import version_conflicts

    for name, versions in sorted(version_conflicts(entries).items()):  # never silently mixed: refused
        told = "; ".join(f"version {v} on {', '.join(sorted(w))}" for v, w in sorted(versions.items()))
        console.print(f"[bold red]{name}: {len(versions)} different versions live ({escape(told)}); "
                      "its calls get TOOL_UNAVAILABLE until one is left[/]")
    for entry in entries:  # what a worker published is text, not markup (a name like w[1]@host)
        box, worker = entry.get("sandbox") or {}, escape(str(entry["worker"]))
        if box.get("mode") == "none":
            console.print(f"[bold yellow]{worker}: run_command runs UNSANDBOXED (sandbox = \"none\")[/]")
        elif box.get("error"):
            reason = escape(str(box["error"]))
            console.print(f"[bold red]{worker}: no sandbox, run_command not served: {reason}[/]")
        elif box:
            console.print(f"{worker}: " + escape(f"sandbox {box['mode']}, network {box.get('network')}"))
