"""``toolfleet run``'s live view (rich ``Live``) while a turn runs, on a terminal only.

One row per call, in model order: its state and for how long it has been in it, read from the
turn's audit trail (:mod:`.audit`: ``pending``, ``submitted``, ``started``, ``finished``) and its
plan (what a call not yet sent waits for: ``Plan.deps``):

==========================  ========================================================
state                       when
==========================  ========================================================
``waits for a, b``          planned; the calls it waits for (plan) have no result yet
``waits for approval``      the policy asks a person (``pending``, not yet decided)
``queued``                  sent to its queue (``submitted``), no worker started it
``running on W``            a worker started it (``started``)
``✓ ok`` / ``✗ CODE``       its result is in (``finished``), with its run time
==========================  ========================================================

The title says the turn, how many calls are done and the elapsed total. Off a terminal (piped,
``--json``) nothing of this is drawn: the output stays free of control codes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .audit import AuditEvent
from .dispatcher.turn import Turn
from .models import ToolResult
from .terminal import whole_width
from .trace import ERROR_MARK, OK_MARK, CallRow, build_timeline

REFRESH_S = 0.25  # how often the view reads the audit trail and redraws


@dataclass
class CallState:
    """What the view shows for one call: ``state`` and the local monotonic time it was first seen."""

    state: str = "planned"
    since: float = field(default_factory=time.monotonic)
    text: Text = field(default_factory=Text)


class LiveView:
    """Follows one turn; :meth:`render` gives the table of its current state."""

    def __init__(self, turn: Turn, read_events: Callable[[], list[AuditEvent]], width: int = 120) -> None:
        self.turn = turn
        self.width = width  # the console's columns: ids and tool names are kept whole within them
        self.read_events = read_events
        self.started = time.monotonic()
        self.states: dict[str, CallState] = {}

    def update(self) -> None:
        """Read the audit trail once and move each call's state on."""
        try:
            rows = {r.call_id: r for r in build_timeline(self.turn.turn_id, self.read_events()).rows}
        except Exception:  # noqa: BLE001 - the view is a help: a failed read keeps the last picture
            return
        deps = self.turn.plan.deps
        for call in self.turn.calls:
            state, text = self._state_of(call.id, rows.get(call.id), deps.get(call.id, frozenset()))
            current = self.states.get(call.id)
            if current is None or current.state != state:
                self.states[call.id] = CallState(state, text=text)
            else:
                current.text = text

    def _state_of(self, call_id: str, row: CallRow | None, waits_for: frozenset[str]) -> tuple[str, Text]:
        result: ToolResult | None = self.turn.result(call_id)
        if result is not None:
            run = "" if result.run_ms is None else f" in {result.run_ms:.0f} ms"
            if result.ok:
                return "done", Text(f"{OK_MARK} ok{run}", style="green")
            return "done", Text(f"{ERROR_MARK} {result.code.value if result.code else 'error'}{run}", style="red")
        if row is not None and row.started_ms is not None:
            return "running", Text(f"running on {row.worker or '?'}", style="cyan")
        if row is not None and row.submitted_ms is not None:
            return "queued", Text("queued", style="yellow")
        if row is not None and row.pending_ms is not None and row.decided_ms is None:
            return "approval", Text("waits for approval", style="magenta")
        open_deps = sorted(d for d in waits_for if self.turn.result(d) is None)
        if open_deps:
            return "waits", Text("waits for " + ", ".join(open_deps), style="dim")
        return "planned", Text("planned", style="dim")

    def frame(self) -> Group:
        """:meth:`update`, then :meth:`render` (Live calls it on each refresh, on its own thread)."""
        self.update()
        return self.render()

    def render(self) -> Group:
        """The turn's table: ``#``, call id over its tool, state, seconds in that state (none once done:
        the state says the run time)."""
        now = time.monotonic()
        calls = self.turn.calls
        done = sum(1 for c in calls if self.turn.result(c.id) is not None)
        title = Text(f"turn {self.turn.turn_id} · {done}/{len(calls)} done · {now - self.started:.1f} s")
        if self.turn.cancelled:
            title.append(" · cancelled", style="bold red")
        table = Table()
        table.add_column("#", justify="right", no_wrap=True)
        names = [c.id for c in calls] + [c.name for c in calls] + ["call id / tool"]
        table.add_column("call id / tool", overflow="fold", width=whole_width(names, self.width, 40))
        table.add_column("state", overflow="fold")
        table.add_column("s", justify="right", no_wrap=True)
        for i, call in enumerate(calls):
            state = self.states.get(call.id) or CallState()
            seconds = "" if state.state == "done" else f"{now - state.since:.1f}"
            cell = Text(call.id) + Text("\n" + call.name, style="bold")
            table.add_row(str(i), cell, state.text or Text(state.state), seconds)
        return Group(title, table)  # the title on its own line: as wide as the console, not the table


def live_progress(turn: Turn, console: Console, timeout_s: float | None,
                  read_events: Callable[[], list[AuditEvent]]) -> list[ToolResult]:
    """Show the turn live on ``console`` (a terminal) until every call has its result; return the
    results in model order. ``timeout_s`` as in :meth:`Turn.results` (giving up cancels the turn
    and raises ``TimeoutError``). Off a terminal, only waits: nothing is drawn."""
    if not console.is_terminal:
        return turn.results(timeout_s)
    view = LiveView(turn, read_events, console.width)
    view.update()
    with Live(console=console, transient=True, refresh_per_second=1 / REFRESH_S, get_renderable=view.frame):
        for _ in turn.as_completed(timeout_s):
            pass
    return turn.results()
