"""``run_command``: a shell command in the workspace, in the OS sandbox of :mod:`.sandbox`.

The command runs under ``bwrap`` (read-only root, the workspace the only writable place, its own PID
namespace), started in a process group of its own. Its end is seen through a pidfd. Stopping it
(time limit or cancel) sends TERM to the command's group, waits ``TERM_GRACE_S``, then KILLs the
sandbox's init: the kernel then kills every process of the PID namespace before ``bwrap`` exits, as
it does when the command's shell exits by itself, so no process it started outlives the call
(docs/sandbox.md). What it printed until then is kept in the result. With ``sandbox = "none"`` (the
operator's explicit choice) it runs unsandboxed, its process group is killed when it ends, and the
output's first line says so.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
from typing import Annotated

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import Field

from ..errors import CallCancelled, ToolFailure, ToolTimeout
from . import sandbox
from .context import ToolContext
from .spec import tool
from .workspace import workspace_of

TERM_GRACE_S = 0.25  # between TERM and KILL (s); below the default cancel_grace_s (0.5 s), so a cancel
# that a command ignores still ends in this handler, with its partial output, before the dispatcher kills it
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

    It runs in a sandbox: only the workspace (and a private /tmp) is writable, no network unless the
    worker allows it, and every process it starts ends when the command ends.
    A non-zero exit status makes the call an error whose content still holds the output.

    Args:
        command: The command line, run with `bash -c` in the workspace root.
        timeout_s: Seconds before the command is stopped; the tool's default is 300.
    """
    box = sandbox.current()
    workspace = workspace_of(ctx)
    argv, env = box.command(["bash", "-c", command], workspace)
    note = sandbox.UNSANDBOXED_NOTE + "\n" if box.unsandboxed else ""
    proc = subprocess.Popen(
        argv,
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(proc, chunks), daemon=True)
    reader.start()

    def output() -> str:
        if box.unsandboxed:
            _kill_group(proc.pid)  # what the command left running holds the pipe open
        reader.join(timeout=1.0)
        return note + b"".join(chunks).decode("utf-8", errors="replace")

    exited = _exit_watch(proc)
    try:
        while True:
            if exited(min(POLL_S, max(ctx.remaining_s, 0.001))):
                proc.wait()
                break
            if ctx.cancelled.is_set():
                _stop_group(proc, not box.unsandboxed)
                raise CallCancelled(ctx.cancel_reason or "the turn was cancelled", output=output())
            if ctx.remaining_s <= 0:
                _stop_group(proc, not box.unsandboxed)
                raise ToolTimeout(
                    f"command ran past its time limit and was stopped: {command}",
                    "raise timeout_s, or run a shorter command",
                    output=output(),
                )
    except SoftTimeLimitExceeded:
        _stop_group(proc, not box.unsandboxed)
        raise ToolTimeout(
            f"command ran past its time limit and was stopped: {command}",
            "raise timeout_s, or run a shorter command",
            output=output(),
        ) from None
    except CallCancelled as exc:
        _stop_group(proc, not box.unsandboxed)
        raise CallCancelled(str(exc), output=exc.output or output()) from None
    finally:
        if proc.poll() is None:
            _stop_group(proc, not box.unsandboxed)
        exited.close()  # type: ignore[attr-defined]
    text = output()
    if proc.returncode != 0:
        raise ToolFailure(
            f"command exited with status {proc.returncode}: {command}",
            "read the output above for the cause",
            output=text,
        )
    return text


class _exit_watch:  # noqa: N801 - used as a function
    """``exited(timeout_s)``: True as soon as ``proc`` has exited (a pidfd polled, so the end is seen
    at once, not at the next step of ``Popen.wait``'s growing sleeps), False after ``timeout_s``."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        try:
            self._fd: int | None = os.pidfd_open(proc.pid)
            self._poll = select.poll()
            self._poll.register(self._fd, select.POLLIN)
        except OSError:  # no pidfd (Linux < 5.3): fall back on Popen.wait
            self._fd = None

    def __call__(self, timeout_s: float) -> bool:
        if self._fd is None:
            try:
                self._proc.wait(timeout=timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        return bool(self._poll.poll(max(int(timeout_s * 1000), 1)))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _drain(proc: subprocess.Popen[bytes], chunks: list[bytes]) -> None:
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        chunks.append(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(proc: subprocess.Popen[bytes], sandboxed: bool = True) -> None:
    """TERM the command's process group, wait ``TERM_GRACE_S``, then KILL what is left.

    In the sandbox the command runs in the session and group of bwrap's child, the sandbox's init
    (pid 1 of its PID namespace, ``--new-session``): TERM goes to that group, KILL to the init,
    whose end makes the kernel kill every process of the namespace before ``bwrap`` can exit, so
    when this returns no process of the command is left."""
    inits = _children(proc.pid) if sandboxed else []
    for pgid in inits if sandboxed else [proc.pid]:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    if inits or not sandboxed:
        try:
            proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    # else: bwrap has not made the sandbox yet, so nothing of the command runs: KILL it at once (an
    # init made in between dies with it: --die-with-parent)
    for pid in inits:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _kill_group(proc.pid)
    proc.wait()


def _children(pid: int) -> list[int]:
    """Process ids of ``pid``'s children (Linux ``/proc/<pid>/task/<pid>/children``); [] once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []
