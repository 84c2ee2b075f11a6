"""``toolfleet trace TURN_ID``: a turn's audit trail as a timeline, one row per call.

Each row shows, on one time axis shared by all calls (Redis's clock, from the stream ids, so
machines with skewed clocks still line up): the wait for a person's approval (``?``), the wait in
the queue from submission to start (``░``), and the run (``█``, green when ok, red on error). A
call refused before it ran is a single ``×``. The plan's parallel group shows as bars starting
together; a chain as bars starting where the previous one ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .audit import AuditEvent

BAR_WIDTH = 48


@dataclass
class CallRow:
    """What the trail says about one call; times are Redis milliseconds (``None``: did not happen)."""

    index: int
    call_id: str
    tool: str
    verdict: str = ""
    pending_ms: int | None = None
    decided_ms: int | None = None
    decision: str = ""
    submitted_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    status: str = ""
    code: str | None = None
    worker: str | None = None
    queued_ms: float | None = None
    run_ms: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    turn_id: str
    start_ms: int
    end_ms: int
    rows: list[CallRow]
    session_id: str | None = None
    workspace: str | None = None
    cancelled: str | None = None

    @property
    def span_ms(self) -> int:
        return max(self.end_ms - self.start_ms, 1)


def build_timeline(turn_id: str, events: list[AuditEvent]) -> Timeline:
    """Fold the audit events of one turn into one row per call (model order)."""
    if not events:
        return Timeline(turn_id, 0, 0, [])
    rows: dict[str, CallRow] = {}
    info: dict[str, Any] = {}
    cancelled = None
    for event in events:
        data = event.data
        if event.type == "planned":  # one per group of calls taken (several for a streamed turn)
            info = info or data
            for call in data.get("calls", []):
                row = rows.setdefault(call["id"], CallRow(len(rows), call["id"], ""))
                row.index = call.get("index", row.index)
                row.tool = call.get("tool", row.tool)
                row.verdict = call.get("verdict", "")
            continue
        if event.type == "cancelled":
            cancelled = data.get("reason", "cancelled")
            continue
        row = rows.setdefault(event.call_id, CallRow(len(rows), event.call_id, data.get("tool", "")))
        _apply(row, event)
    start = events[0].at_ms
    end = max(e.at_ms for e in events)
    ordered = sorted(rows.values(), key=lambda r: r.index)
    return Timeline(turn_id, start, end, ordered, info.get("session_id"), info.get("workspace"), cancelled)


def _apply(row: CallRow, event: AuditEvent) -> None:
    data, at = event.data, event.at_ms
    if event.type == "pending":
        row.pending_ms = at
    elif event.type in ("approved", "denied"):
        if data.get("by") == "policy" or str(data.get("by", "")).startswith("policy@"):
            row.notes.append(f"refused by {data.get('by')}: {data.get('reason', '')}")
        else:
            row.decided_ms, row.decision = at, f"{event.type} by {data.get('by', '?')}"
    elif event.type == "submitted":
        row.submitted_ms = row.submitted_ms or at
    elif event.type == "started":
        row.started_ms = row.started_ms or at
        row.worker = data.get("worker") or row.worker
    elif event.type == "finished":
        row.finished_ms = at
        row.status, row.code = data.get("status", ""), data.get("code")
        row.worker = data.get("worker") or row.worker
        row.queued_ms, row.run_ms = data.get("queued_ms"), data.get("run_ms")
        if data.get("message") and row.status != "ok" and not row.notes:
            row.notes.append(str(data["message"]))
    elif event.type == "late":  # a stale (fenced) execution's outcome: a note, never the answer
        outcome = "ok" if data.get("status") == "ok" else data.get("code") or data.get("status", "")
        row.notes.append(f"late outcome of a stale execution on {data.get('worker') or '?'}, after the answer "
                         f"(not the call's result): {outcome} {data.get('message') or ''}".rstrip())


def bar(row: CallRow, timeline: Timeline, width: int = BAR_WIDTH) -> Text:
    """The row's wait and run on the shared axis, ``width`` characters wide."""
    cells: list[tuple[str, str]] = [(" ", "")] * width

    def col(ms: int) -> int:
        return min(int((ms - timeline.start_ms) * width / timeline.span_ms), width - 1)

    def paint(start: int | None, end: int | None, char: str, style: str) -> None:
        if start is None:
            return
        first = col(start)
        last = col(end) if end is not None else width - 1
        for i in range(first, max(last, first + 1)):
            cells[i] = (char, style)

    paint(row.pending_ms, row.decided_ms or row.finished_ms, "?", "magenta")
    paint(row.submitted_ms, row.started_ms or row.finished_ms, "░", "yellow")
    if row.started_ms is not None:
        paint(row.started_ms, row.finished_ms, "█", "green" if row.status == "ok" else "red")
    elif row.finished_ms is not None and row.submitted_ms is None:
        cells[col(row.finished_ms)] = ("×", "red")
    text = Text()
    for char, style in cells:
        text.append(char, style=style or None)
    return text


def print_timeline(console: Console, timeline: Timeline, width: int = BAR_WIDTH) -> None:
    """Print the timeline table, its axis and a legend."""
    if not timeline.rows:
        console.print(f"no audit trail for turn {timeline.turn_id} (unknown, or expired)")
        return
    title = f"turn {timeline.turn_id}"
    if timeline.session_id:
        title += f" · session {timeline.session_id}"
    table = Table(title=title, show_lines=False)
    axis = f"timeline: 0 to {timeline.span_ms} ms"
    for column in ("#", "call id", "tool", "policy", "worker", "result", axis, "wait ms", "run ms"):
        table.add_column(column, overflow="fold", no_wrap=column == axis, min_width=width if column == axis else None)
    for row in timeline.rows:
        result = "[green]ok[/]" if row.status == "ok" else f"[red]{row.code or row.status or 'no result'}[/]"
        policy = row.verdict + (f"\n{row.decision}" if row.decision else "")
        table.add_row(
            str(row.index), escape(row.call_id), escape(row.tool), escape(policy), escape(row.worker or ""),
            result, bar(row, timeline, width), _ms(row.queued_ms), _ms(row.run_ms),
        )
    console.print(table)
    console.print("legend: [magenta]?[/] waits for approval  [yellow]░[/] queued  "
                  "[green]█[/] ran ok  [red]█[/] ran, error  [red]×[/] refused or never started")
    if timeline.cancelled:
        console.print(f"cancelled: {escape(timeline.cancelled)}")
    for row in timeline.rows:
        for note in row.notes:
            console.print(f"  {escape(row.call_id)}: {escape(note)}")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"
