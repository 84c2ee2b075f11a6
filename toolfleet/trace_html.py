"""``toolfleet trace TURN_ID --html FILE``: one turn as a self-contained HTML page.

The page draws, from the turn's audit trail (:mod:`.audit`):

- the plan as a graph: one node per call (``.call-node``, its id, tool and outcome), one arrow per
  wait (``.wait-edge``: from the call waited for to the call that waits), calls by plan step in
  columns (step 0 starts at once);
- a timeline per call (``.lane``): the wait for approval (``.seg-pending``), the wait in the queue
  (``.seg-queued``), the run (``.seg-run-ok`` / ``.seg-run-error``; ``.seg-run-open`` while it runs,
  no result yet), the result's moment
  (``.result-marker``), a refusal before it ran (``.refused-marker``), on Redis's clock;
- a timeline per worker (``.worker-lane``): the runs each worker did;
- the cancel's moment (``.cancel-marker``) across both timelines, and a table of every call.

Self-contained: inline CSS and SVG, no script, no network (a Content-Security-Policy forbids any
script and any fetch). Everything shown is escaped (:func:`html.escape`): call ids, tool names and
messages come from the model or a tool, so a ``<script>`` in a call id is text, never code.
"""

from __future__ import annotations

import html
from typing import Any

from .audit import AuditEvent
from .trace import CallRow, Timeline, build_timeline

NODE_W, NODE_H, COL_GAP, ROW_GAP = 220, 58, 70, 18
LABEL_W, CHART_W, LANE_H = 260, 820, 26
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1d2330;background:#fbfbfd}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.meta{color:#5b6475;margin:0 0 4px} .cancel-note{color:#b42318;font-weight:600}
svg{background:#fff;border:1px solid #e3e6ee;border-radius:6px;display:block;max-width:100%;height:auto}
svg text{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;fill:#1d2330}
.call-node rect{fill:#f4f7ff;stroke:#7a8bb5;rx:6}
.call-node.ok rect{fill:#ecfdf3;stroke:#3a9b63} .call-node.error rect{fill:#fef3f2;stroke:#d1453b}
.call-node.cancelled rect{stroke-dasharray:5 3}
.call-node .tool{fill:#5b6475} .wait-edge{stroke:#7a8bb5;stroke-width:1.6;fill:none}
.seg-pending{fill:#c084fc} .seg-queued{fill:#fcd34d} .seg-run-ok{fill:#3a9b63} .seg-run-error{fill:#d1453b}
.seg-run-open{fill:#60a5fa}
.result-marker{stroke:#1d2330;stroke-width:2} .refused-marker{stroke:#d1453b;stroke-width:2.5}
.cancel-marker{stroke:#b42318;stroke-width:2;stroke-dasharray:6 4} .cancel-label{fill:#b42318;font-weight:700}
.lane-bg{fill:#f6f7fa} .axis{stroke:#c5cad6} .tick{fill:#5b6475}
table{border-collapse:collapse;margin-top:8px;background:#fff} td,th{border:1px solid #e3e6ee;padding:4px 8px;
text-align:left;vertical-align:top} td.id{font-family:ui-monospace,monospace;word-break:break-all;max-width:360px}
.ok-text{color:#1f7a4a} .error-text{color:#b42318} .legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle}
"""


def e(value: Any) -> str:
    """``value`` as text safe in HTML content and in quoted attributes."""
    return html.escape(str(value), quote=True)


def plan_deps(events: list[AuditEvent]) -> dict[str, list[str]]:
    """What each call waits for, merged over the turn's ``planned`` events."""
    deps: dict[str, list[str]] = {}
    for event in events:
        if event.type == "planned":
            for call_id, waits in (event.data.get("deps") or {}).items():
                deps[str(call_id)] = [str(d) for d in waits]
    return deps


def cancel_moment(events: list[AuditEvent]) -> tuple[int, str] | None:
    """The first ``cancelled`` event: (Redis ms, reason), or None."""
    for event in events:
        if event.type == "cancelled":
            return event.at_ms, str(event.data.get("reason", "cancelled"))
    return None


def outcome(row: CallRow) -> tuple[str, str]:
    """(css class, shown text): ``ok`` / ``✓ ok``, ``error`` / ``✗ CODE``, ``open`` / ``… no result``."""
    if row.status == "ok":
        return "ok", "✓ ok"
    if row.status or row.code:
        return "error", f"✗ {row.code or row.status}"
    return "open", "… no result"


def run_class(kind: str) -> str:
    """The run segment's class for an :func:`outcome` kind: a call with no result yet is running
    (``seg-run-open``), never drawn as a run that ended in error."""
    return {"ok": "seg-run-ok", "open": "seg-run-open"}.get(kind, "seg-run-error")


def levels(rows: list[CallRow], deps: dict[str, list[str]]) -> dict[str, int]:
    """Each call's plan step: 0 when it waits for nothing, else one past its latest dependency."""
    level: dict[str, int] = {}
    for row in rows:  # model order: a call waits only for earlier calls
        level[row.call_id] = 1 + max((level.get(d, 0) for d in deps.get(row.call_id, [])), default=-1)
    return level


def graph_svg(rows: list[CallRow], deps: dict[str, list[str]], cancelled_ids: set[str]) -> str:
    level = levels(rows, deps)
    columns: dict[int, list[CallRow]] = {}
    for row in rows:
        columns.setdefault(level[row.call_id], []).append(row)
    pos: dict[str, tuple[int, int]] = {}
    for col, members in columns.items():
        for i, row in enumerate(members):
            pos[row.call_id] = (20 + col * (NODE_W + COL_GAP), 20 + i * (NODE_H + ROW_GAP))
    width = 40 + (max(columns) + 1) * (NODE_W + COL_GAP) - COL_GAP
    height = 40 + max(len(m) for m in columns.values()) * (NODE_H + ROW_GAP) - ROW_GAP
    parts = [f'<svg class="plan" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="plan: who waits for whom">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#7a8bb5"/></marker></defs>']
    for row in rows:
        for dep in deps.get(row.call_id, []):
            if dep not in pos:
                continue
            (x1, y1), (x2, y2) = pos[dep], pos[row.call_id]
            sx, sy, tx, ty = x1 + NODE_W, y1 + NODE_H // 2, x2, y2 + NODE_H // 2
            mid = (sx + tx) // 2
            parts.append(f'<path class="wait-edge" data-from="{e(dep)}" data-to="{e(row.call_id)}" '
                         f'd="M{sx},{sy} C{mid},{sy} {mid},{ty} {tx - 2},{ty}" marker-end="url(#arrow)">'
                         f'<title>{e(row.call_id)} waits for {e(dep)}</title></path>')
    for row in rows:
        x, y = pos[row.call_id]
        kind, shown = outcome(row)
        extra = " cancelled" if row.call_id in cancelled_ids else ""
        parts.append(
            f'<g class="call-node {kind}{extra}" data-call-id="{e(row.call_id)}" transform="translate({x},{y})">'
            f'<title>{e(row.call_id)} · {e(row.tool)} · {e(shown)}</title>'
            f'<rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
            f'<text x="10" y="18">{e(_clip(row.call_id, 28))}</text>'
            f'<text class="tool" x="10" y="34">{e(_clip(row.tool, 28))}</text>'
            f'<text x="10" y="50">{e(_clip(shown, 28))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def worker_slots(rows: list[CallRow]) -> dict[tuple[str, int], list[CallRow]]:
    """The runs of each worker packed into lanes so that runs in one lane never overlap: a worker's
    processes side by side. Keys: (worker, lane number), in worker order."""
    slots: dict[tuple[str, int], list[CallRow]] = {}
    ends: dict[str, list[int]] = {}
    ran = [r for r in rows if r.worker and r.started_ms is not None]
    for row in sorted(ran, key=lambda r: (str(r.worker), r.started_ms or 0)):
        worker, start = str(row.worker), int(row.started_ms or 0)
        lane_ends = ends.setdefault(worker, [])
        lane = next((i for i, end in enumerate(lane_ends) if end <= start), len(lane_ends))
        end = row.finished_ms if row.finished_ms is not None else 2**62
        if lane == len(lane_ends):
            lane_ends.append(end)
        else:
            lane_ends[lane] = end
        slots.setdefault((worker, lane), []).append(row)
    return dict(sorted(slots.items()))


def timeline_svg(timeline: Timeline, cancel: tuple[int, str] | None) -> str:
    rows = timeline.rows
    slots = worker_slots(rows)
    lanes = len(rows) + (len(slots) + 1 if slots else 0)
    height = 50 + lanes * LANE_H
    width = LABEL_W + CHART_W + 30

    def x(ms: int) -> float:
        return round(LABEL_W + (ms - timeline.start_ms) * CHART_W / timeline.span_ms, 1)

    def seg(cls: str, start: int | None, end: int | None, y: int, what: str) -> str:
        if start is None:
            return ""
        x1, x2 = x(start), x(end if end is not None else timeline.end_ms)
        return (f'<rect class="{cls}" x="{x1}" y="{y + 5}" width="{max(x2 - x1, 2)}" height="{LANE_H - 10}">'
                f'<title>{e(what)}: {max((end or timeline.end_ms) - start, 0)} ms</title></rect>')

    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline per call and worker">']
    for i in range(5):  # the axis: 0, 25, 50, 75, 100 % of the turn
        ms = timeline.start_ms + timeline.span_ms * i // 4
        parts.append(f'<line class="axis" x1="{x(ms)}" y1="20" x2="{x(ms)}" y2="{height - 8}"/>'
                     # the last label ends at its line, so the chart's edge does not clip it
                     + (f'<text class="tick" x="{x(ms) - 3}" y="14" text-anchor="end">' if i == 4 else
                        f'<text class="tick" x="{x(ms) + 3}" y="14">') + f'{ms - timeline.start_ms} ms</text>')
    y = 26
    for row in rows:
        kind, shown = outcome(row)
        parts.append(f'<g class="lane" data-call-id="{e(row.call_id)}">'
                     f'<rect class="lane-bg" x="{LABEL_W}" y="{y + 2}" width="{CHART_W}" height="{LANE_H - 4}"/>'
                     f'<text x="6" y="{y + 17}">{e(_clip(row.call_id, 20))} {e(_clip(row.tool, 14))}</text>')
        parts.append(seg("seg-pending", row.pending_ms, row.decided_ms or row.finished_ms, y, "waits for approval"))
        parts.append(seg("seg-queued", row.submitted_ms, row.started_ms or row.finished_ms, y, "queued"))
        if row.started_ms is not None:
            parts.append(seg(run_class(kind), row.started_ms, row.finished_ms, y,
                             f"{'runs' if kind == 'open' else 'ran'} on {row.worker or '?'}"))
        if row.finished_ms is not None:
            fx = x(row.finished_ms)
            cls = "result-marker" if row.submitted_ms is not None or row.started_ms is not None else "refused-marker"
            parts.append(f'<line class="{cls}" x1="{fx}" y1="{y + 3}" x2="{fx}" y2="{y + LANE_H - 3}">'
                         f'<title>result: {e(shown)}</title></line>')
        parts.append("</g>")
        y += LANE_H
    if slots:
        y += LANE_H // 2
        parts.append(f'<text class="tick" x="6" y="{y + 6}">workers</text>')
        y += LANE_H // 2
        for (worker, n), runs in slots.items():
            label = worker if n == 0 else f"{_clip(worker, 28)} #{n + 1}"
            parts.append(f'<g class="worker-lane" data-worker="{e(worker)}">'
                         f'<rect class="lane-bg" x="{LABEL_W}" y="{y + 2}" width="{CHART_W}" height="{LANE_H - 4}"/>'
                         f'<text x="6" y="{y + 17}">{e(_clip(label, 34))}</text>')
            for row in runs:
                kind, _ = outcome(row)
                parts.append(seg(run_class(kind), row.started_ms, row.finished_ms, y, f"{row.call_id} ({row.tool})"))
            parts.append("</g>")
            y += LANE_H
    if cancel is not None:
        cx = x(cancel[0])
        parts.append(f'<g class="cancel-marker-group"><line class="cancel-marker" x1="{cx}" y1="18" x2="{cx}" '
                     f'y2="{height - 4}"><title>cancelled: {e(cancel[1])}</title></line>'
                     f'<text class="cancel-label" x="{cx - 4}" y="{height - 8}" text-anchor="end">cancel</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def calls_table(rows: list[CallRow], deps: dict[str, list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "call id", "tool", "result", "waits for", "policy", "worker",
                                               "wait ms", "run ms", "notes"))
    body = []
    for row in rows:
        kind, shown = outcome(row)
        cells = [e(row.index), e(row.call_id), e(row.tool), f'<span class="{kind}-text">{e(shown)}</span>',
                 e(", ".join(deps.get(row.call_id, []))), e(" ".join(filter(None, [row.verdict, row.decision]))),
                 e(row.worker or ""), _ms(row.queued_ms), _ms(row.run_ms), "<br>".join(e(n) for n in row.notes)]
        body.append("<tr class=\"call-row\">" + "".join(
            f'<td{" class=id" if i in (1, 2) else ""}>{c}</td>' for i, c in enumerate(cells)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(turn_id: str, events: list[AuditEvent]) -> str:
    """The page of one turn from its audit events (oldest first), as a complete HTML document."""
    timeline = build_timeline(turn_id, events)
    title = f"toolfleet turn {turn_id}"
    head = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style></head><body>")
    if not timeline.rows:
        return head + f"<h1>{e(title)}</h1><p>no audit trail (unknown, or expired)</p></body></html>"
    deps = plan_deps(events)
    cancel = cancel_moment(events)
    cancelled_ids = {str(c) for ev in events if ev.type == "cancelled" for c in ev.data.get("not_executed", [])}
    meta = [f"{len(timeline.rows)} call(s) in {timeline.span_ms} ms (Redis's clock)"]
    if timeline.session_id:
        meta.append(f"session {timeline.session_id}")
    if timeline.workspace:
        meta.append(f"workspace {timeline.workspace}")
    legend = "".join(f'<span><i class="sw" data-for="{cls}" style="background:{color}"></i>{e(label)}</span>'
                     for cls, color, label in (
        ("seg-pending", "#c084fc", "waits for approval"), ("seg-queued", "#fcd34d", "queued"),
        ("seg-run-ok", "#3a9b63", "ran, ok"), ("seg-run-error", "#d1453b", "ran, error"),
        ("seg-run-open", "#60a5fa", "running, no result yet"),
        ("result-marker", "#1d2330", "result (tick)"), ("cancel-marker", "#b42318", "cancel (dashed)")))
    parts = [head, f"<h1>{e(title)}</h1>", f'<p class="meta">{e(" · ".join(meta))}</p>']
    if cancel is not None:
        parts.append(f'<p class="cancel-note">cancelled at {cancel[0] - timeline.start_ms} ms: {e(cancel[1])}</p>')
    parts += ["<h2>Plan: who waits for whom</h2>", graph_svg(timeline.rows, deps, cancelled_ids),
              "<h2>Timeline per call and worker</h2>", f'<p class="legend">{legend}</p>',
              timeline_svg(timeline, cancel), "<h2>Calls</h2>", calls_table(timeline.rows, deps), "</body></html>"]
    return "".join(parts)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"
