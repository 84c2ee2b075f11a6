"""``run_command``: a shell command in the workspace, in its own process group.

Stopping a command (time limit or cancel) signals the whole group: TERM, a grace period, then
KILL, so children it spawned die with it. What it printed until then is kept in the result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Annotated

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import Field

from ..errors import CallCancelled, ToolFailure, ToolTimeout
from .context import ToolContext
from .spec import tool
from .workspace import workspace_of

TERM_GRACE_S = 0.5  # between TERM and KILL of the process group
POLL_S = 0.05  # how often the wait loop looks at the cancel signal and the deadline (s)


@tool(
    access="write",
    resources=None,
    timeout_s=300,
    timeout_arg="timeout_s",
    max_timeout_s=3600,
    risk="high",
    command_arg="command",
)
def run_command(
    ctx: ToolContext,
    command: str,
    timeout_s: Annotated[float | None, Field(gt=0, le=3600)] = None,
) -> str:
    """Run a shell command (bash) in the workspace and return what it printed (stdout and stderr).

    A non-zero exit status makes the call an error whose content still holds the output.

    Args:
        command: The command line, run with `bash -c` in the workspace root.
        timeout_s: Seconds before the command is stopped; the tool's default is 300.
    """
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=workspace_of(ctx),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(proc, chunks), daemon=True)
    reader.start()

    def output() -> str:
        reader.join(timeout=1.0)
        return b"".join(chunks).decode("utf-8", errors="replace")

    try:
        while True:
            try:
                proc.wait(timeout=min(POLL_S, max(ctx.remaining_s, 0.001)))
                break
            except subprocess.TimeoutExpired:
                pass
            if ctx.cancelled.is_set():
                _stop_group(proc)
                raise CallCancelled(ctx.cancel_reason or "the turn was cancelled", output=output())
            if ctx.remaining_s <= 0:
                _stop_group(proc)
                raise ToolTimeout(
                    f"command ran past its time limit and was stopped: {command}",
                    "raise timeout_s, or run a shorter command",
                    output=output(),
                )
    except SoftTimeLimitExceeded:
        _stop_group(proc)
        raise ToolTimeout(
            f"command ran past its time limit and was stopped: {command}",
            "raise timeout_s, or run a shorter command",
            output=output(),
        ) from None
    except CallCancelled as exc:
        _stop_group(proc)
        raise CallCancelled(str(exc), output=exc.output or output()) from None
    finally:
        if proc.poll() is None:
            _stop_group(proc)
    text = output()
    if proc.returncode != 0:
        raise ToolFailure(
            f"command exited with status {proc.returncode}: {command}",
            "read the output above for the cause",
            output=text,
        )
    return text


def _drain(proc: subprocess.Popen[bytes], chunks: list[bytes]) -> None:
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        chunks.append(chunk)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the command's process group, wait ``TERM_GRACE_S``, then KILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
