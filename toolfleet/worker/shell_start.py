"""How a live session's shell (:mod:`.live_shell`) is started so that only the worker decides what it
reads as commands: by the kernel, not by parsing what the command's processes write.

- **The command channel is one end of an AF_UNIX socketpair**, not a pipe. Linux refuses to open a
  socket through ``/proc/<pid>/fd/N`` (``ENXIO``), where it reopens a pipe for writing: a process of
  the sandbox cannot reach the channel by path. The shell's end is shut for writing
  (``shutdown(SHUT_WR)``, which holds for every descriptor of that socket): a process that holds it
  anyway (a forked subshell of the command, before it execs) can write nothing the shell would read.
  Only the worker's end, which never enters the sandbox, writes to the shell.
- **The output channel is a second socketpair**, not a pipe, for the same reason the other way: a
  process that holds the shell's stdout (a daemon a program of the session left behind) could
  reopen a pipe *for reading* through ``/proc/self/fd/1``, race the worker for the shell's output,
  see a command's end marker with its nonce and write a forged one (a later command "ok" with text
  it never printed). A socket cannot be opened by path, and what the shell's end holds is only what
  the worker's end wrote to it: nothing (shut for writing). Bytes the shell writes can be read at
  the worker's end alone.
- **The shell cannot be traced by the processes it starts.** Without Yama (as on this kernel), a
  process of the sandbox (same uid) may ``ptrace`` its parent shell or ``pidfd_getfd`` its fds, and
  so run anything as the shell. The shell's ``bash`` is exec'd from an execute-only copy
  (``--perms 0111 --ro-bind-data``, owner without the read bit, every capability dropped): the
  kernel makes a process that execs a binary it cannot read *non-dumpable*, and a non-dumpable
  process can be neither traced, nor have its fds taken or opened through ``/proc/<pid>/fd`` by a
  process without ``CAP_SYS_PTRACE``. The programs the shell runs exec their own (readable)
  binaries: they stay dumpable, so ``gdb``/``strace`` of them still work. Forked subshells of the
  command share the shell's protection (and are the caller's own shell code).
- **bwrap's init never holds the command channel.** The init (pid 1 of the sandbox) is bwrap's own
  process, dumpable; it closes every inherited fd but its stdio, so bwrap gets ``/dev/null`` as its
  stdin and the channel as another fd, which a first ``bash`` makes its stdin (:func:`_from_fd`).
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..tools.sandbox import SandboxCgroup, host_binary, sandbox_child
from .sandbox_lease import LeaseFile

SHELL_PATH = "/dev/.toolfleet-shell"  # on the sandbox's own /dev (a tmpfs of bwrap's), never the host's
SHELL_ARGS = ("--noprofile", "--norc", "-s")


def channel() -> tuple[socket.socket, socket.socket]:
    """``(worker's end, shell's end)`` of the command channel: the worker's end writes only (non-blocking),
    the shell's end reads only."""
    host, shell = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    shell.shutdown(socket.SHUT_WR)
    host.shutdown(socket.SHUT_RD)
    host.setblocking(False)
    return host, shell


def output_channel() -> tuple[socket.socket, socket.socket]:
    """``(worker's end, shell's end)`` of the output channel: the shell's end writes only (the shell's
    stdout and stderr), the worker's end reads only (blocking)."""
    host, shell = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    shell.shutdown(socket.SHUT_RD)
    host.shutdown(socket.SHUT_WR)
    return host, shell


def popen(box: Any, workspace: Path, spawn: Callable[[Callable[[], Any]], Any], stdin: socket.socket,
          stdout: socket.socket, info_w: int | None, lease: LeaseFile | None = None,
          cgroup: SandboxCgroup | None = None) -> subprocess.Popen[bytes]:
    """Start the shell in ``box`` (a :class:`~toolfleet.tools.sandbox.SandboxState`) reading ``stdin``
    (the shell's end of :func:`channel`), stdout and stderr both to ``stdout`` (the shell's end of
    :func:`output_channel`); ``spawn`` runs the start (``--die-with-parent``: a long-lived thread).
    A sandboxed shell with a ``lease`` runs under its watchdog (:mod:`.sandbox_lease`): the returned
    process is then the watchdog, ``bwrap`` its child. ``cgroup`` (``box.cgroup()``): the sandbox's
    own, joined before the start execs (its process limit)."""
    bash_fd = None
    try:
        if box.unsandboxed:
            argv, env = box.command(["bash", *SHELL_ARGS], workspace)
        else:
            # read here, outside the sandbox: from root's directories, never a PATH entry a sandbox can write
            bash = host_binary("bash") or "/bin/bash"
            bash_fd = os.open(bash, os.O_RDONLY | os.O_CLOEXEC)  # bwrap copies it to an execute-only file
            argv, env = box.command(_from_fd(stdin.fileno()), workspace, info_fd=info_w,
                                    mounts=["--perms", "0111", "--ro-bind-data", str(bash_fd), SHELL_PATH])
            if lease is not None:
                argv = lease.wrap(argv)
        channel_fd = None if box.unsandboxed else stdin.fileno()  # the shell's alone: not bwrap's init's stdin
        fds = tuple(fd for fd in (info_w, bash_fd, channel_fd) if fd is not None)
        return spawn(lambda: subprocess.Popen(
            argv, cwd=workspace, env=env, stdin=stdin.fileno() if channel_fd is None else subprocess.DEVNULL,
            stdout=stdout.fileno(),
            stderr=stdout.fileno(), start_new_session=True, pass_fds=fds,
            preexec_fn=None if box.unsandboxed else functools.partial(sandbox_child, os.getpid(), cgroup)))
    finally:
        if bash_fd is not None:
            os.close(bash_fd)


def _from_fd(fd: int) -> list[str]:
    """The sandboxed shell's argv when its command channel is the inherited ``fd`` (bwrap's stdin is
    ``/dev/null``): a first ``bash`` (the execute-only copy) makes ``fd`` its stdin and execs the shell.
    bwrap's init (pid 1 of the sandbox) closes every inherited fd but its stdio, so it never holds the
    channel: it is dumpable (bwrap's binary is readable), and a program of the session took the
    channel from its fd 0 (``pidfd_getfd``), read the next block and its end marker's nonce, and
    forged the command's result (a breaker's find)."""
    return [SHELL_PATH, "--noprofile", "--norc", "-c",
            f"exec 0<&{fd} {fd}<&- && exec {SHELL_PATH} {' '.join(SHELL_ARGS)}"]


class _Spawner(threading.Thread):
    """Runs functions (``bwrap`` starts) in one thread that lives as long as the worker."""

    def __init__(self) -> None:
        super().__init__(name="toolfleet-live-spawner", daemon=True)
        self.jobs: queue.Queue[tuple[Any, queue.Queue[Any]]] = queue.Queue()

    def run(self) -> None:
        while True:
            fn, reply = self.jobs.get()
            try:
                reply.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put((False, exc))

    def __call__(self, fn: Any) -> Any:
        reply: queue.Queue[Any] = queue.Queue()
        self.jobs.put((fn, reply))
        ok, value = reply.get(timeout=30)
        if not ok:
            raise value
        return value


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
