"""Issue 15, point 9: `toolfleet trace` and `toolfleet tools` stay readable at 80 and 120 columns and
in a pipe (whole call ids and tool names, a different glyph for ok and error, no 15-character
wrapping, the real queue name); the planned event keeps the session id unless it is
credential-shaped. Real Redis, real prefork workers, a real turn."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import redis
from rich.console import Console

from toolfleet import Dispatcher, ToolCall
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.terminal import PIPED_WIDTH, piped_width
from toolfleet.trace import ERROR_MARK, ERROR_RUN, OK_MARK, OK_RUN, build_timeline, print_timeline
from toolfleet.view import print_catalog, print_results
from toolfleet.worker.catalog import live_catalog

from .conftest import ROOT, make_registry

WAIT_S = 60
LONG_ID = "toolu_01A09q90qw90lq917835lq9"  # an Anthropic-shaped id, 29 characters
ERR_ID = "call_s8Jd2kLm3nP4qR5xY7zW9"
COUNT_ID = "call_count_0001"
MESSAGE = "the backend answered 503 Service Unavailable while reading the ledger"


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


def run_turn(dispatcher, workspace, session_id=None, keep=None) -> str:
    turn = dispatcher.submit([call(LONG_ID, "wait_read", 0, label="a", seconds=0.2),
                              call(ERR_ID, "boom", 1, message=MESSAGE),
                              call(COUNT_ID, "count_until_cancelled", 2, seconds=0.2)],
                             workspace=str(workspace), session_id=session_id)
    results = {r.call_id: r for r in turn.results(WAIT_S)}
    assert results[LONG_ID].ok and not results[ERR_ID].ok and results[COUNT_ID].ok
    if keep is not None:
        keep.append(turn)
    return turn.turn_id


def assert_whole_tables(text: str, width: int) -> None:
    """No line past ``width``, and every table line ends with its border (rich crops a table whose
    columns cannot shrink to the width: the right part would be lost)."""
    for line in text.splitlines():
        assert len(line) <= width, (width, line)
        if line[:1] in "┏┃┡│├└":
            assert line.rstrip()[-1:] in "┓┃┩│┤┘", (width, line, text)


def trail(settings, turn_id):
    return AuditLog(redis.Redis.from_url(settings.redis_url), Keys(settings.namespace), 60).read(turn_id)


def rendered(timeline, width: int) -> str:
    buffer = io.StringIO()
    print_timeline(Console(file=buffer, width=width, force_terminal=False, color_system=None), timeline)
    return buffer.getvalue()


def test_trace_is_readable_at_80_and_120_columns(dispatcher, worker, settings, workspace):
    turns: list = []
    timeline = build_timeline("t", trail(settings, run_turn(dispatcher, workspace, keep=turns)))
    for width in (80, 120):  # the results table of `toolfleet run` too
        buffer = io.StringIO()
        print_results(Console(file=buffer, width=width, color_system=None), turns[0], turns[0].results(), 0.5, None)
        lines = buffer.getvalue().splitlines()
        assert_whole_tables(buffer.getvalue(), width)
        for whole in (LONG_ID, ERR_ID, COUNT_ID, "count_until_cancelled", f"{ERROR_MARK} EXECUTION_ERROR"):
            assert any(whole in line for line in lines), (width, whole, buffer.getvalue())
        assert sum(f"{OK_MARK} ok" in line for line in lines) == 2
    for width in (80, 120):
        text = rendered(timeline, width)
        lines = text.splitlines()
        assert_whole_tables(text, width)
        for whole in (LONG_ID, ERR_ID, COUNT_ID, "wait_read", "boom", "count_until_cancelled"):
            assert any(whole in line for line in lines), (width, whole, text)  # on one line, not squeezed
        ok_line = next(line for line in lines if OK_MARK in line)
        err_line = next(line for line in lines if ERROR_MARK in line)
        assert "ok" in ok_line and "EXECUTION_ERROR" in err_line and OK_MARK != ERROR_MARK
        chart = {cid: next(line for line in lines if cid in line and ("█" in line or "▓" in line))
                 for cid in (LONG_ID, ERR_ID)}
        assert OK_RUN in chart[LONG_ID] and ERROR_RUN not in chart[LONG_ID]  # a glyph, not only a colour
        assert ERROR_RUN in chart[ERR_ID] and OK_RUN not in chart[ERR_ID]
        assert MESSAGE in " ".join(text.split()), text  # the error's message, wrapped at the width only
        # the chart's header is its time scale (newcomer trial: it read "48 characters")
        assert "characters" not in text and re.search(rf"0 ms +{timeline.span_ms:.0f} ms", text), text
    assert any(MESSAGE in line for line in rendered(timeline, 120).splitlines())


def test_piped_trace_and_tools_are_not_squeezed(dispatcher, worker, settings, workspace):
    turn_id = run_turn(dispatcher, workspace)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(PYTHONPATH=str(ROOT))
    where = ["--redis-url", settings.redis_url, "--namespace", settings.namespace]
    shown = subprocess.run([sys.executable, "-m", "toolfleet", "trace", turn_id, *where], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "\x1b" not in shown.stdout  # a pipe gets no control codes
    assert_whole_tables(shown.stdout, PIPED_WIDTH)
    assert any(len(line) > 80 for line in lines)  # laid out for 120 columns, not rich's 80
    assert any(MESSAGE in line for line in lines), shown.stdout  # not wrapped at ~15 characters
    for whole in (LONG_ID, ERR_ID, "count_until_cancelled"):
        assert any(whole in line for line in lines), shown.stdout

    tools = subprocess.run([sys.executable, "-m", "toolfleet", "tools", *where], env=env,
                           capture_output=True, text=True, timeout=60)
    assert tools.returncode == 0, tools.stderr
    lines = tools.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "│ boom " in line)
    assert f"{settings.namespace}.{make_registry().get('boom').queue}" in lines[at + 1], tools.stdout  # real queue
    assert "\x1b" not in tools.stdout
    assert_whole_tables(tools.stdout, PIPED_WIDTH)
    for width in (80, 120):
        buffer = io.StringIO()
        print_catalog(Console(file=buffer, width=width, color_system=None), live_catalog(settings), settings.namespace)
        assert_whole_tables(buffer.getvalue(), width)
        assert f"{settings.namespace}.count_until_cancelled" in buffer.getvalue()


def test_the_catalog_prints_what_workers_published_as_text_not_markup():
    """Worker names and sandbox reasons come from other processes: ``[/x]`` in one is printed as
    is (before: rich's MarkupError ended ``toolfleet tools`` with a traceback)."""
    spec = {"name": "t", "queue": "t", "access": "read", "timeout_s": 1.0, "description": "d"}
    entries = [{"worker": "w[/x]@h1", "tools": [spec], "sandbox": {"mode": "none"}},
               {"worker": "w[/y]@h2", "tools": [spec], "sandbox": {"error": "bwrap: [/z] not found"}},
               {"worker": "w[bold]@h3", "tools": [spec], "sandbox": {"mode": "bwrap[/m]", "network": "off"}}]
    buffer = io.StringIO()
    print_catalog(Console(file=buffer, width=200, color_system=None), entries)
    shown = buffer.getvalue()
    for text in ("w[/x]@h1: run_command runs UNSANDBOXED", "w[/y]@h2: no sandbox, run_command not served: "
                 "bwrap: [/z] not found", "w[bold]@h3: sandbox bwrap[/m], network off"):
        assert text in shown, shown


def test_piped_width_follows_columns():
    assert piped_width({}) == PIPED_WIDTH and piped_width({"COLUMNS": "200"}) == 200
    assert piped_width({"COLUMNS": "junk"}) == PIPED_WIDTH and piped_width({"COLUMNS": "3"}) == PIPED_WIDTH


def test_session_id_is_kept_unless_credential_shaped(settings, worker, workspace):
    with Dispatcher(settings, make_registry()) as d:
        plain = trail(settings, run_turn(d, workspace, session_id="chat-2026-12-01-alice"))
        secret = "sk-proj-Zx81Qw55Lk09Rt7yUi3oP2aS"  # shaped like an OpenAI key: masked
        masked = trail(settings, run_turn(d, workspace, session_id=secret))
    assert plain[0].type == "planned" and plain[0].data["session_id"] == "chat-2026-12-01-alice"
    assert build_timeline("t", plain).session_id == "chat-2026-12-01-alice"
    assert secret not in json.dumps(masked[0].data) and "***" in masked[0].data["session_id"]


def test_pending_table_keeps_ids_and_tools_whole(settings, workspace):
    from toolfleet import Policy

    with Dispatcher(settings, make_registry(), Policy.from_dict({"tools": {"wait_write": "ask"}})) as d:
        turn = d.submit([call(LONG_ID, "wait_write", 0, label="[bold]k[/bold]")], workspace=str(workspace))
        assert [p.call_id for p in turn.wait_settled(WAIT_S)] == [LONG_ID]
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        env.update(PYTHONPATH=str(ROOT), COLUMNS="80")
        shown = subprocess.run([sys.executable, "-m", "toolfleet", "pending", turn.turn_id, "--redis-url",
                                settings.redis_url, "--namespace", settings.namespace], env=env,
                               capture_output=True, text=True, timeout=60)
        turn.cancel("the test is done")
    assert shown.returncode == 0, shown.stderr
    assert_whole_tables(shown.stdout, 80)
    lines = shown.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if LONG_ID in line)
    assert "wait_write" in lines[at + 1] and "[bold]k[/bold]" in shown.stdout  # model text is not markup


def test_trace_says_who_waited_for_whom(dispatcher, worker, settings, workspace):
    """The README's `toolfleet trace TURN_ID  # who waited for whom`: each call's row names the
    calls it waited for in the plan, by their #, at any width (a newcomer found no such column)."""
    turn = dispatcher.submit([ToolCall(id="r1", name="wait_read", arguments={"label": "a"}),
                              ToolCall(id="r2", name="wait_read", arguments={"label": "b"}),
                              ToolCall(id="w1", name="wait_write", arguments={"label": "a"})],
                             workspace=str(workspace))
    turn.results(timeout_s=30)
    timeline = build_timeline(turn.turn_id, trail(settings, turn.turn_id))
    assert [r.after for r in timeline.rows] == [[], [], ["r1"]]
    index = {r.call_id: r.index for r in timeline.rows}
    wide = next(line for line in rendered(timeline, 160).splitlines() if "w1" in line and "wait_write" in line)
    assert f"#{index['r1']}" in wide, wide
    assert f"after #{index['r1']}" in rendered(timeline, 80)


def test_a_call_still_running_is_not_drawn_as_an_error():
    """``toolfleet trace`` (and ``--html``) on a live turn: a call that started and has no result
    yet was drawn with the error run (``▓``, ``.seg-run-error``: "ran, error") and ``✗ no result``,
    as if it had failed. It is running: neither ok nor error."""
    from rich.console import Console

    from toolfleet.audit import AuditEvent
    from toolfleet.trace_html import render_html

    t0 = 1_800_000_000_000
    events = [
        AuditEvent(f"{t0}-0", "planned", "", {"calls": [{"index": 0, "id": "done", "tool": "wait_read"},
                                                        {"index": 1, "id": "busy", "tool": "wait_read"}]}),
        AuditEvent(f"{t0}-1", "submitted", "done", {"tool": "wait_read"}),
        AuditEvent(f"{t0}-2", "submitted", "busy", {"tool": "wait_read"}),
        AuditEvent(f"{t0 + 5}-0", "started", "done", {"worker": "w1"}),
        AuditEvent(f"{t0 + 6}-0", "started", "busy", {"worker": "w2"}),
        AuditEvent(f"{t0 + 400}-0", "finished", "done", {"tool": "wait_read", "status": "ok", "worker": "w1",
                                                           "queued_ms": 5.0, "run_ms": 395.0}),
    ]
    timeline = build_timeline("live", events)
    console = Console(width=120, record=True, force_terminal=False, color_system=None)
    print_timeline(console, timeline)
    text = console.export_text()
    busy = [line for line in text.splitlines() if "busy" in line]
    assert busy and not any(ERROR_MARK in line or ERROR_RUN in line for line in busy), text
    assert any(OK_RUN in line for line in text.splitlines() if "done" in line), text  # the finished one: ok

    page = render_html("live", events)
    lane = re.search(r'<g class="lane" data-call-id="busy">.*?</g>', page).group(0)
    assert "seg-run-error" not in lane and "seg-run-ok" not in lane, lane
    assert "seg-run-open" in lane  # drawn as running


def test_a_cut_result_cell_says_it_was_cut():
    """The results table cut a long one-line error mid-word with no marker (a newcomer needed
    ``--json`` to learn there was more); a cut cell now ends with ``…`` and says how much there is."""
    from toolfleet.view import _cell

    long_line = "- /path: wants a string (File path relative to the workspace root) " * 10
    cell = _cell(long_line)
    assert cell.splitlines()[0].endswith("…") and f"{len(long_line)} characters" in cell and "--json" in cell
    assert _cell("short\ntext") == "short\ntext"  # nothing cut, nothing added
    assert "(6 lines" in _cell("\n".join("abcdef"))
