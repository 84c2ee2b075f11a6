"""How a live session's shell (:mod:`.live_shell`) is started so that only the worker decides what it
reads as commands: by the kernel, not by parsing what the command's processes write.

- **The command channel is one end of an AF_UNIX socketpair**, not a pipe. Linux refuses to open a
  socket through ``/proc/<pid>/fd/N`` (``ENXIO``), where it reopens a pipe for writing: a process of
  the sandbox cannot reach the channel by path. The shell's end is shut for writing
  (``shutdown(SHUT_WR)``, which holds for every descriptor of that socket): a process that holds it
  anyway (a forked subshell of the command, before it execs) can write nothing the shell would read.
  Only the worker's end, which never enters the sandbox, writes to the shell.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHELL_ARGS = ("--noprofile", "--norc", "-s")


def channel() -> tuple[socket.socket, socket.socket]:
    """``(worker's end, shell's end)`` of the command channel: the worker's end writes only (non-blocking),
    the shell's end reads only."""
    host, shell = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    shell.shutdown(socket.SHUT_WR)
    host.shutdown(socket.SHUT_RD)
    host.setblocking(False)
    return host, shell


def popen(box: Any, workspace: Path, spawn: Callable[[Callable[[], Any]], Any], stdin: socket.socket,
          info_w: int | None) -> subprocess.Popen[bytes]:
    """Start the shell in ``box`` (a :class:`~toolfleet.tools.sandbox.SandboxState`) reading ``stdin``,
    stdout and stderr to one pipe; ``spawn`` runs the start (``--die-with-parent``: a long-lived thread)."""
    argv, env = box.command(["bash", *SHELL_ARGS], workspace, info_fd=info_w)
    return spawn(lambda: subprocess.Popen(
        argv, cwd=workspace, env=env, stdin=stdin.fileno(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True, pass_fds=() if info_w is None else (info_w,)))


# ---- the processes of a shell's sandbox ----

def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return out


def living(pids: set[int]) -> set[int]:
    """``pids`` that are still running (not zombies waiting to be reaped)."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    out.add(pid)
        except (OSError, IndexError):
            pass
    return out


def send_signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
