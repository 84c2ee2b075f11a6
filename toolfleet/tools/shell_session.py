"""``shell``: a persistent shell per session (a live session): cwd and environment persist across
calls and turns of one session.

Serve it with ``toolfleet worker --tools toolfleet.tools.shell_session`` (and give the dispatcher's
registry the same module). The shell is a ``bash`` in the sandbox of :mod:`.sandbox`, held by the
worker that took the session's first call (:mod:`toolfleet.worker.affinity`); the session's later
calls are routed to that worker's own queue (:mod:`toolfleet.dispatcher.affinity`). When that
worker is gone, the next call gets ``SESSION_LOST`` and the call after it starts a new shell.
Close a session with :func:`toolfleet.dispatcher.affinity.close_live_session`; an idle shell ends
after ``TOOLFLEET_LIVE_SESSION_TTL_S`` (default 1800 s).

This handler runs in a pool process and is a client of the worker's session host (a Unix socket):
it sends the command, waits for the answer, and on cancel (or Celery's soft time limit) asks the
host to stop the command, which stops only that command (or restarts the shell, and says so).
"""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Annotated, Any

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import Field

from ..errors import CallCancelled, ToolFailure, ToolTimeout
from . import sandbox
from .context import ToolContext
from .spec import tool
from .workspace import workspace_of

POLL_S = 0.05  # how often the wait looks at the cancel signal (s)
STOP_REPLY_S = 5.0  # after asking the host to stop the command, how long its answer may take (s)


@tool(
    access="write",
    resources=None,
    timeout_s=300,
    timeout_arg="timeout_s",
    max_timeout_s=3600,
    risk="high",
    command_arg="command",
)
def shell(
    ctx: ToolContext,
    command: str,
    timeout_s: Annotated[float | None, Field(gt=0, le=3600)] = None,
) -> str:
    """Run a command in this session's persistent bash shell and return what it printed (stdout and stderr).

    The shell keeps its state between calls: `cd`, `export`, shell variables and functions persist
    for the whole session. It runs in a sandbox: only the workspace (and a private /tmp) is writable,
    no network unless the worker allows it. A non-zero exit status makes the call an error whose
    content still holds the output. A command that runs past its time limit is stopped; the shell
    goes on (or is restarted, which the result says).

    Args:
        command: The command line, run by the session's shell (starts in the workspace root).
        timeout_s: Seconds before the command is stopped; the tool's default is 300.
    """
    from ..worker import affinity

    if not ctx.session_id:
        raise ToolFailure("the shell tool keeps state per session, and this turn has no session id",
                          "open the turn with a session_id", code="INVALID_ARGUMENT")
    if "\0" in command:
        raise ToolFailure("a command cannot contain a NUL character", "remove it", code="INVALID_ARGUMENT")
    if affinity.socket_path is None:
        raise ToolFailure("this worker does not host live sessions", "run the worker with `toolfleet worker "
                          "--tools toolfleet.tools.shell_session`", code="TOOL_UNAVAILABLE")
    sandbox.current().command(["true"], workspace_of(ctx))  # refuses when the sandbox cannot be created
    request = {"session": ctx.session_id, "workspace": str(workspace_of(ctx)), "command": command,
               "timeout_s": max(ctx.remaining_s, 0.001)}
    ctx.check_fence()  # a stale execution (frozen, superseded) never runs the command
    reply = _ask(affinity.socket_path, request, ctx)
    return _result(reply, command)


def _ask(path: str, request: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(path)
        conn.sendall(json.dumps(request).encode() + b"\n")
        reader = conn.makefile("rb")
        poller = select.poll()
        poller.register(conn, select.POLLIN)
        stop_sent_at: float | None = None
        while True:
            try:
                if poller.poll(int(POLL_S * 1000)):
                    line = reader.readline()
                    if not line:
                        raise ToolFailure("the live session host closed the connection without an answer",
                                          "ask again", code="EXECUTION_ERROR")
                    return json.loads(line)
                if stop_sent_at is None and ctx.cancelled.is_set():
                    conn.sendall(b"cancel\n")
                    stop_sent_at = time.monotonic()
                elif stop_sent_at is None and ctx.remaining_s < -1.0:
                    conn.sendall(b"stop\n")  # the host should have stopped it at the deadline
                    stop_sent_at = time.monotonic()
                if stop_sent_at is not None and time.monotonic() - stop_sent_at > STOP_REPLY_S:
                    raise ToolFailure("the live session host did not answer after the command was stopped",
                                      "ask again", code="EXECUTION_ERROR")
            except SoftTimeLimitExceeded:
                if stop_sent_at is None:
                    conn.sendall(b"stop\n")
                    stop_sent_at = time.monotonic()


def _result(reply: dict[str, Any], command: str) -> str:
    if reply.get("code"):
        raise ToolFailure(reply.get("message", "the live session failed"), reply.get("hint", ""), code=reply["code"])
    notes = [n for n in (sandbox.UNSANDBOXED_NOTE if reply.get("unsandboxed") else "", reply.get("note", "")) if n]
    if reply.get("restarted"):
        notes.append("[the command could not be stopped without ending the shell: a new shell was started; "
                     "cwd and environment are reset]")
    text = "\n".join([*notes, reply.get("output", "")]) if notes else reply.get("output", "")
    stopped = reply.get("stopped")
    if stopped == "cancelled":
        raise CallCancelled("the turn was cancelled; the command was stopped"
                            + ("" if reply.get("restarted") else " and the session's shell goes on"), output=text)
    if stopped is not None:
        kept = "" if reply.get("restarted") else "; the session's shell goes on (cwd and environment kept)"
        raise ToolTimeout(f"command ran past its time limit and was stopped: {command}",
                          "raise timeout_s, or run it in the background (`cmd > log 2>&1 &`) and look at the log later"
                          + kept, output=text)
    if reply.get("status"):
        raise ToolFailure(f"command exited with status {reply['status']}: {command}",
                          "read the output below for the cause", output=text)
    return text
