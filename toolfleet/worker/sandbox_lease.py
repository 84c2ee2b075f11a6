"""Sandboxes end when their worker's liveness lapses, even if the worker is frozen: a lease each.

Two leases, one mechanism (a lease file of a monotonic deadline, renewed only after Redis confirmed
the liveness key it shadows, read by a process outside the worker's process group):

- **A live session's shell** (below): one watchdog per shell, around its ``bwrap``, shadowing the
  holder's ``live_worker`` key.
- **``run_command``'s sandboxes** (:func:`reap`): one *reaper* per worker, shadowing the worker's
  catalog key (``3 * heartbeat_s``, renewed every heartbeat: the dispatcher answers a silent
  worker's calls ``WORKER_LOST`` once it has lapsed). Each running command registers its deadline
  process (``timeout``, the leader of its session, bwrap its child) as a file ``<pid>-<start time>``
  in the reaper's private directory; when the lease lapses the reaper KILLs every registered group
  whose start time still matches (never a reused pid), so a frozen worker's command stops acting
  before its caller is told ``WORKER_LOST``, not only at its own time limit.

The dispatcher answers ``SESSION_LOST`` ("its processes are lost") once the holder's liveness key
(``live_worker``, ``2 * heartbeat_s`` long, renewed every ``heartbeat_s / 2``) lapses in Redis. A
holder that is frozen (SIGSTOP of its process group, a GC stall) or cut off from Redis
is not dead, and the shell's sandbox is in a session of its own (``bwrap --new-session``): without
this, its processes ran on and wrote after the caller was told they were gone (a gray-failure trial,
``tests/test_frozen_live_holder.py``).

So every sandboxed shell runs under a **lease watchdog**: this file, run as a script by the worker's
Python (``python -I -S sandbox_lease.py <lease file> <worker pid> -- bwrap ...``), in the shell's own
session (outside the worker's process group, so a freeze of the worker does not stop it). It starts
``bwrap`` as its child and reads the **lease file**, which the holder rewrites after each liveness
renewal Redis confirmed: one number, a :func:`time.monotonic` time (``CLOCK_MONOTONIC``, shared by
every process of the machine), ``margin_s`` before the earliest time the renewed key can lapse.
Once that time passes with no newer one written (or the file is gone), the watchdog KILLs ``bwrap``
(its end takes the sandbox's init and so every process of its PID namespace: ``--die-with-parent``)
and ends itself by ``SIGALRM``, which :attr:`~toolfleet.worker.live_shell.Shell.lease_lapsed` reads.
It sleeps until the deadline it knows (no polling) and wakes when ``bwrap`` exits, whose status it
then exits with. It dies with the worker (``PR_SET_PDEATHSIG``), like ``bwrap``.

The lease file lives in the session host's private directory under ``/tmp``, which every sandbox
covers with a tmpfs of its own: no command of a session can renew its own lease.

Bound (docs/guarantees.md L3): a holder's shells are killed ``margin_s`` before its liveness key can
lapse, and gone once the kill completes (milliseconds idle; up to 0.7 s with every core loaded by the
session, so the watchdog raises its priority and the margin is up to 1 s), before any ``SESSION_LOST``
is answered. Not covered: a pause of the whole machine or container, which pauses the watchdog too.
A holder that only lost Redis (it runs on) finds its shells ended and answers its sessions' next
calls ``SESSION_LOST`` too, never a silent new shell.

This module is stdlib-only: the watchdog runs it with ``-I -S`` (no site, no ``PYTHON*`` variables).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

LAPSE_SIGNAL = signal.SIGALRM
"""The watchdog ends itself with this signal when the lease lapsed (``Popen.returncode == -14``)."""


def margin_s(heartbeat_s: float) -> float:
    """How long before the liveness key's earliest lapse the shells end: ``min(1 s, heartbeat_s / 2)``.
    The kill and the namespace's end take milliseconds on an idle machine, but a session that loads
    every core (hundreds of busy loops: a breaker's trial) stretched them to 0.5-0.7 s past the
    deadline; the watchdog also raises its own priority. A healthy holder's beat may still be a
    whole heartbeat late (beats every half heartbeat) before its shells end."""
    return min(1.0, heartbeat_s / 2)


def boost() -> None:
    """Raise this process's CPU priority (nice -10) so a sandbox that loads every core does not delay
    its kill; without the privilege (CAP_SYS_NICE) it stays as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass


class LeaseFile:
    """The holder's side: ``renew(deadline)`` after each liveness renewal Redis confirmed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.deadline = float("-inf")  # the last one written

    def renew(self, deadline: float) -> None:
        """Write ``deadline`` (a :func:`time.monotonic` time, s) atomically (a rename: a watchdog
        never reads half a number); safe from several threads (a stale one written last only
        shortens the lease)."""
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(repr(deadline))
        os.replace(tmp, self.path)
        self.deadline = deadline

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` (``bwrap ...``) run under the lease watchdog of this file. The caller starts it
        with ``start_new_session=True`` and the fds ``bwrap`` needs in ``pass_fds`` (they pass on)."""
        return script_argv(self.path, str(os.getpid()), "--", *argv)


def script_argv(*args: str) -> list[str]:
    """How the worker runs this file: its own Python, isolated (``-I -S``), with ``args``."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *args]


def private_dir(kind: str) -> str:
    """A new ``/tmp/toolfleet-<kind>-<pid>-*`` directory (``0700``; every sandbox covers ``/tmp`` with a
    tmpfs of its own, so no command can reach it), once those of ``kind`` whose worker died without
    its shutdown are removed."""
    import shutil
    import tempfile
    from pathlib import Path

    for path in Path("/tmp").glob(f"toolfleet-{kind}-*-*"):
        try:
            os.kill(int(path.name.split("-")[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue
    return tempfile.mkdtemp(prefix=f"toolfleet-{kind}-{os.getpid()}-", dir="/tmp")


def read_deadline(path: str) -> float | None:
    """The lease file's deadline, or ``None`` when it is gone or unreadable (then the lease is over)."""
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def _die_with_parent(parent: int) -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the worker died before the prctl: nobody to renew the lease
        os._exit(1)


def start_time(pid: int) -> str | None:
    """``pid``'s start time (clock ticks since boot, ``/proc/<pid>/stat`` field 22): with the pid, a
    name no later process can have; ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def reap(path: str, registry: str, worker: int, idle_wake_s: float = 1.0) -> None:
    """The reaper's loop: until ``worker`` is gone, sleep until the lease's deadline (at most
    ``idle_wake_s``, to notice the worker's end); while it has lapsed, KILL the process group of every
    sandbox registered in ``registry`` (then every 50 ms, for a group registered meanwhile)."""
    while True:
        deadline = read_deadline(path)
        left_s = -1.0 if deadline is None else deadline - time.monotonic()
        if left_s <= 0:
            _kill_registered(registry)
        if os.getppid() != worker:  # the worker ended (its children are reparented): so does the reaper
            return
        time.sleep(0.05 if left_s <= 0 else min(left_s, idle_wake_s))


def _kill_registered(registry: str) -> None:
    try:
        names = os.listdir(registry)
    except OSError:
        return
    for name in names:
        pid_text, _, started = name.partition("-")
        try:
            pid = int(pid_text)
        except ValueError:
            continue
        if start_time(pid) == started:
            try:
                os.killpg(pid, signal.SIGKILL)  # timeout and bwrap; bwrap's end ends the namespace
            except OSError:
                pass


def _exit_as(returncode: int) -> None:
    if returncode >= 0:
        os._exit(returncode)
    signal.signal(-returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -returncode)
    os._exit(128 - returncode)


def main(args: list[str]) -> None:
    """``<lease file> <worker pid> -- argv...``: run ``argv`` until it exits or the lease lapses;
    ``--reap <lease file> <registry dir> <worker pid>``: the reaper (:func:`reap`)."""
    if len(args) == 4 and args[0] == "--reap":
        os.chdir("/")
        boost()
        reap(args[1], args[2], int(args[3]))
        return
    if len(args) < 4 or args[2] != "--":
        sys.stderr.write("usage: sandbox_lease.py LEASE_FILE WORKER_PID -- COMMAND...\n")
        os._exit(2)
    path, parent, argv = args[0], int(args[1]), args[3:]
    _die_with_parent(parent)
    child = subprocess.Popen(argv, close_fds=False)  # the channels and bwrap's info fd pass on
    boost()  # after the fork: the sandbox keeps the worker's priority
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # never hold the shell's channels: their EOF is the shell's end
    pidfd = os.pidfd_open(child.pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    while True:
        deadline = read_deadline(path)
        left_s = -1.0 if deadline is None else deadline - time.monotonic()
        if left_s <= 0:
            child.kill()  # bwrap's end ends the sandbox (--die-with-parent of its init)
            child.wait()
            _exit_as(-int(LAPSE_SIGNAL))
        if poller.poll(int(left_s * 1000) + 1):
            _exit_as(child.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
