"""``toolfleet trace TURN_ID``: a turn's audit trail as a timeline, one row per call.

Each row shows, on one time axis shared by all calls (Redis's clock, from the stream ids, so
machines with skewed clocks still line up): the wait for a person's approval (``?``), the wait in
the queue from submission to start (``░``), and the run (``█`` when ok, ``▓`` on error: a glyph,
not only a colour; ``▒`` while it runs, no result yet). A call refused before it ran is a single
``×``. The plan's parallel group shows as bars starting together; a chain as bars starting where
the previous one ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
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
    after: list[str] = field(default_factory=list)  # the call ids it waited for (the plan's deps)


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
            for call_id, waits in (data.get("deps") or {}).items():
                if str(call_id) in rows and isinstance(waits, list):
                    rows[str(call_id)].after = [str(w) for w in waits]
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


OK_RUN, ERROR_RUN, QUEUED, PENDING, REFUSED = "█", "▓", "░", "?", "×"
RUNNING = "▒"  # started, no result yet (a live turn): neither ok nor error
OK_MARK, ERROR_MARK = "✓", "✗"  # the result column: a glyph as well as a colour, for screens and pipes without colour
OPEN_MARK = "…"  # no result yet: running, queued or waiting
ID_MAX_CHARS = 40  # longest call id / tool name kept on one line (model-chosen ids can be much longer: folded)


def bar(row: CallRow, timeline: Timeline, width: int = BAR_WIDTH) -> Text:
    """The row's wait and run on the shared axis, ``width`` characters wide: ``?`` waits for a
    person, ``░`` queued, ``█`` ran ok, ``▓`` ran with an error, ``×`` refused or never started."""
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

    paint(row.pending_ms, row.decided_ms or row.finished_ms, PENDING, "magenta")
    paint(row.submitted_ms, row.started_ms or row.finished_ms, QUEUED, "yellow")
    if row.started_ms is not None:
        if row.finished_ms is None and not row.status:  # running now: no outcome to draw yet
            paint(row.started_ms, None, RUNNING, "cyan")
        else:
            ok = row.status == "ok"
            paint(row.started_ms, row.finished_ms, OK_RUN if ok else ERROR_RUN, "green" if ok else "red")
    elif row.finished_ms is not None and row.submitted_ms is None:
        cells[col(row.finished_ms)] = (REFUSED, "red")
    text = Text()
    for char, style in cells:
        text.append(char, style=style or None)
    return text


def result_text(row: CallRow) -> Text:
    """``✓ ok`` or ``✗ CODE``: a different glyph for ok and error, the colour only a help; a call
    without a result yet (a live turn) is neither: ``… running``, ``… queued``, ``… no result``."""
    if row.status == "ok":
        return Text(f"{OK_MARK} ok", style="green")
    if row.status or row.code:
        return Text(f"{ERROR_MARK} {row.code or row.status}", style="red")
    state = "running" if row.started_ms is not None else "queued" if row.submitted_ms is not None else "no result"
    return Text(f"{OPEN_MARK} {state}", style="cyan")


def print_timeline(console: Console, timeline: Timeline, width: int = BAR_WIDTH) -> None:
    """Print the turn: a table of its calls (id and tool whole, up to ``ID_MAX_CHARS``; *after*:
    the calls, by ``#``, each waited for in the plan: who waited for whom), then the
    chart (``#``, call id, the time axis at most ``width`` characters, narrowed to fit the console),
    a legend, the cancel and the notes. Readable at 80 columns and wider, and in a pipe."""
    if not timeline.rows:
        console.print(Text(f"no audit trail for turn {timeline.turn_id} (unknown, or expired)"))
        return
    title = f"turn {timeline.turn_id}"
    if timeline.session_id:
        title += f" · session {timeline.session_id}"
    id_chars = min(max(len(r.call_id) for r in timeline.rows), ID_MAX_CHARS)
    tool_chars = min(max(len(r.tool) for r in timeline.rows), ID_MAX_CHARS)
    index_chars = len(str(max(r.index for r in timeline.rows)))
    wide = console.width >= id_chars + tool_chars + 85  # id, tool, worker and after side by side
    console.print(Text(title, style="bold"))  # its own line: a table's title wraps at the table's width
    table = Table(show_lines=not wide)
    table.add_column("#", justify="right", no_wrap=True)
    if wide:
        table.add_column("call id", overflow="fold", width=max(id_chars, 7))
        table.add_column("tool", overflow="fold", width=max(tool_chars, 4))
        table.add_column("result", overflow="fold")
        table.add_column("policy", overflow="fold")
        table.add_column("worker", overflow="fold")
        table.add_column("after", overflow="fold")
        table.add_column("wait ms", justify="right", no_wrap=True)
        table.add_column("run ms", justify="right", no_wrap=True)
    else:  # narrow: the id on its own line, the tool and the worker under it
        room = max(console.width - 47 - index_chars, 12)  # borders 16, result 19, times 12
        table.add_column("call id / tool / worker", overflow="fold", width=min(max(id_chars, tool_chars, 23), room))
        table.add_column("result / policy", overflow="fold")
        table.add_column("ms", justify="right", no_wrap=True)
    number = {r.call_id: r.index for r in timeline.rows}
    for row in timeline.rows:
        policy = row.verdict + (f"\n{row.decision}" if row.decision else "")
        after = " ".join(f"#{number[c]}" if c in number else c for c in row.after)
        if wide:
            cells = [Text(row.call_id), Text(row.tool), result_text(row), Text(policy), Text(row.worker or ""),
                     Text(after)]
        else:
            names = Text(row.call_id) + Text("\n" + row.tool, style="bold")
            if row.worker:
                names += Text("\n" + row.worker, style="dim")
            if after:
                names += Text("\nafter " + after, style="dim")
            cells = [names, result_text(row) + Text("\n" + policy)]
        if wide:
            cells += [_ms(row.queued_ms), _ms(row.run_ms)]
        else:
            cells.append("\n".join(f"{what} {_ms(v)}" for what, v in (("wait", row.queued_ms), ("run", row.run_ms))
                                   if v is not None))
        table.add_row(str(row.index), *cells)
    console.print(table)

    bar_width = max(min(width, console.width - id_chars - index_chars - 10), 20)
    chart_id_chars = max(min(id_chars, console.width - bar_width - index_chars - 10), 8)  # longer ids fold
    chart = Table(title=f"timeline: 0 to {timeline.span_ms} ms", title_justify="left")
    chart.add_column("#", justify="right", no_wrap=True)
    chart.add_column("call id", overflow="fold", width=max(chart_id_chars, 7))
    chart.add_column(axis_header(timeline.span_ms, bar_width), no_wrap=True, min_width=bar_width,
                     max_width=bar_width)
    for row in timeline.rows:
        chart.add_row(str(row.index), Text(row.call_id), bar(row, timeline, bar_width))
    console.print(chart)
    running = any(r.started_ms is not None and r.finished_ms is None and not r.status for r in timeline.rows)
    console.print(f"legend: [magenta]{PENDING}[/] waits for approval  [yellow]{QUEUED}[/] queued  "
                  f"[green]{OK_RUN}[/] ran ok  [red]{ERROR_RUN}[/] ran, error  "
                  + (f"[cyan]{RUNNING}[/] running, no result yet  " if running else "")
                  + f"[red]{REFUSED}[/] refused or never started  [green]{OK_MARK}[/] ok  [red]{ERROR_MARK}[/] error")
    if timeline.cancelled:
        console.print(Text(f"cancelled: {timeline.cancelled}"))
    for row in timeline.rows:
        for note in row.notes:
            console.print(Text(f"  {row.call_id}: {note}"))


def axis_header(span_ms: float, width: int) -> str:
    """The chart column's header: the time scale of its ``width`` characters, ``0 ms`` at the left
    and the turn's span at the right (``0 ms ......... 701 ms``)."""
    left, right = "0 ms", f"{span_ms:.0f} ms"
    gap = width - len(left) - len(right)
    return left + " " * gap + right if gap >= 1 else right


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"
