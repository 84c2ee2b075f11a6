"""Issue 15, "progress while a batch runs": `toolfleet run` draws a live view on a terminal (each call
waits / queued / running / done with its status and time, what waits for what, the elapsed total),
and nothing of it when piped or with --json (byte-clean output). Real Redis, real prefork workers;
the terminal is a rich Console forced to terminal mode, and a real pty around the real CLI."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

from rich.console import Console

from toolfleet import ToolCall
from toolfleet.progress import LiveView, live_progress
from toolfleet.worker.catalog import live_catalog

from .conftest import ROOT, TEST_TOOLS
from .faults import wait_until

WAIT_S = 60
CALLS = [("w", "wait_write", {"label": "k", "seconds": 0.8}),  # r waits for w (same resource, w writes)
         ("r", "wait_read", {"label": "k"}),
         ("p", "wait_read", {"label": "j", "seconds": 0.8}),  # side by side with w
         ("bad", "boom", {"message": "backend down"})]


def response_file(tmp_path):
    doc = {"id": "r", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason":
           "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
               {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
               for cid, name, args in CALLS]}}]}
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(doc))
    return path


def serving(settings) -> None:
    wait_until(lambda: any(t["name"] == "wait_write" for e in live_catalog(settings) for t in e.get("tools", ())),
               30, "the worker's catalog")


def test_live_view_shows_states_waits_and_results(dispatcher, worker, workspace):
    turn = dispatcher.submit([ToolCall(id=cid, name=name, arguments=json.dumps(args), index=i)
                              for i, (cid, name, args) in enumerate(CALLS)], workspace=str(workspace))
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    results = live_progress(turn, console, WAIT_S, lambda: dispatcher.ledger.audit.read(turn.turn_id))
    assert [r.call_id for r in results] == ["w", "r", "p", "bad"]  # model order
    drawn = buffer.getvalue()
    assert "\x1b[" in drawn  # a live view: redrawn in place
    assert "waits for w" in drawn  # what waits for what, from the plan
    assert f"running on {worker.name}" in drawn
    assert "✓ ok" in drawn and "✗ EXECUTION_ERROR" in drawn
    assert f"turn {turn.turn_id}" in drawn and "4/4 done" in drawn

    view = LiveView(turn, lambda: dispatcher.ledger.audit.read(turn.turn_id))
    view.update()
    final = io.StringIO()
    Console(file=final, width=120, color_system=None).print(view.render())
    assert final.getvalue().count("✓ ok") == 3 and "✗ EXECUTION_ERROR" in final.getvalue()


def test_live_view_off_a_terminal_draws_nothing(dispatcher, worker, workspace):
    turn = dispatcher.submit([ToolCall(id="p", name="wait_read", arguments='{"label": "j"}', index=0)],
                             workspace=str(workspace))
    buffer = io.StringIO()
    results = live_progress(turn, Console(file=buffer, width=120), WAIT_S, lambda: [])
    assert results[0].ok and buffer.getvalue() == ""


def cli(settings, tmp_path, workspace, *extra: str) -> list[str]:
    return [sys.executable, "-m", "toolfleet", "run", str(response_file(tmp_path)), "--workspace", str(workspace),
            "--redis-url", settings.redis_url, "--namespace", settings.namespace, "--tools", TEST_TOOLS, *extra]


def test_cli_live_view_in_a_pty(settings, worker, tmp_path, workspace):
    serving(settings)
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120", LINES="40", TERM="xterm-256color")
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(cli(settings, tmp_path, workspace), env=env, cwd=ROOT, stdin=secondary,
                            stdout=secondary, stderr=secondary, close_fds=True)
    os.close(secondary)
    chunks: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1.0)
        if ready:
            try:
                data = os.read(primary, 65536)
            except OSError:  # the pty closed: the CLI exited
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(primary)
    assert proc.wait(timeout=30) == 0
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert "\x1b[" in shown and "waits for w" in shown and "running on" in shown, shown[-3000:]
    assert "4 results in" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # the final table after the live view


def test_cli_piped_and_json_output_is_clean(settings, worker, tmp_path, workspace):
    serving(settings)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    env.update(PYTHONPATH=str(ROOT))
    piped = subprocess.run(cli(settings, tmp_path, workspace), env=env, cwd=ROOT, capture_output=True,
                           timeout=WAIT_S)
    assert b"\x1b" not in piped.stdout and b"\r" not in piped.stdout, piped.stdout
    assert b"4 results in" in piped.stdout and "✗ EXECUTION_ERROR".encode() in piped.stdout
    as_json = subprocess.run(cli(settings, tmp_path, workspace, "--json"), env=env, cwd=ROOT, capture_output=True,
                             timeout=WAIT_S)
    assert b"\x1b" not in as_json.stdout
    doc = json.loads(as_json.stdout)  # the whole of stdout is the one JSON object
    assert [r["call_id"] for r in doc["results"]] == ["w", "r", "p", "bad"]
