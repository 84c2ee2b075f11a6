"""The processes of a hosted MCP server (:mod:`.mcp_host`): they die with the pool process that hosts
them, all of them, and a stop is confirmed only once none of them can act.

- **Death signal** (:func:`dying_with`): the process the pool process starts gets ``PR_SET_PDEATHSIG``
  (SIGKILL), prctl(2): it dies with the thread that started it, however the pool process ends.
- **PID namespace** (:func:`confined`): the server runs in a PID namespace of its own, so every process
  it started dies with it (below).
- **Group liveness** (:func:`group_alive`): a stop (SIGTERM, then SIGKILL of the server's process group)
  is confirmed when no member of the group is left but zombies: a zombie has ended and cannot act, and
  an orphan's zombie waits for whichever process reaps orphans here (a container's init may be slow).

PID namespace:

The worker starts ``bwrap --dev-bind / / --proc /proc --unshare-pid --die-with-parent -- COMMAND``
instead of ``COMMAND``: the host's file system, devices and network as they are (this is no sandbox:
an MCP server is the operator's own program, configured with ``--mcp``), and a PID namespace whose
init is bubblewrap's, which dies with the bwrap process the pool process started
(``--die-with-parent``; that one dies with the pool process: :func:`dying_with`). When a PID
namespace's init ends, the kernel SIGKILLs every process in it (pid_namespaces(7)), so a pool
process killed outright (a hard time limit, the OOM killer) takes the whole server with it:
``npx``'s node child, a browser the server launched, a process that left the server's process group
or session (``setsid``). A death signal on the server process alone, and ``killpg`` of its group,
miss those. A fresh ``/proc`` shows the server its own processes only (it sees itself as pid 2);
bubblewrap sets ``no_new_privs``, so setuid helpers (``sudo``, ``ping`` on some systems) gain no
privilege in a server of a worker not run as root.
Sources: bwrap(1) (``--unshare-pid``, ``--die-with-parent``, ``--proc``), pid_namespaces(7).

Where bubblewrap cannot run (not installed, namespaces refused), the server runs as before and the
worker says so at start (:func:`confined`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable

BWRAP_ARGS = ("--dev-bind", "/", "/", "--proc", "/proc", "--unshare-pid", "--die-with-parent")
PROBE_TIMEOUT_S = 10.0  # the one check, at worker start, that bwrap can make a PID namespace here
_PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=8)
def _probe(binary: str) -> tuple[str | None, str | None]:
    """``(path, None)`` when ``binary`` runs ``true`` in a PID namespace of its own, else ``(None, why not)``."""
    path = shutil.which(binary)
    if path is None:
        return None, f"the bubblewrap binary {binary!r} was not found (apt-get install bubblewrap)"
    try:
        done = subprocess.run([path, *BWRAP_ARGS, "--", "true"], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} could not be run: {exc}"
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[:300]
        return None, f"{path} failed (exit status {done.returncode}): {detail or 'no message'}"
    return path, None


def confined(argv: list[str], binary: str = "bwrap") -> tuple[list[str], str | None]:
    """``argv`` run by bubblewrap (``binary``: a name on ``PATH`` or a path) in a PID namespace of its
    own, and ``None``; or, where that cannot run, ``argv`` itself and why not (for the worker's
    start-up warning). The check runs once per binary and process (up to :data:`PROBE_TIMEOUT_S`)."""
    path, problem = _probe(binary)
    if path is None:
        return list(argv), problem
    return [path, *BWRAP_ARGS, "--", *argv], None


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), loaded before any fork; ``None`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def dying_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the thread that started it (the
    server's event-loop thread, which lives as long as its pool process) ends; a child whose parent
    is already gone kills itself. ``None`` where there is no ``prctl``."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent ended before the death signal was set
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_parent


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie. Only ESRCH says no at once;
    otherwise ``/proc`` is read (each process's state and group, proc(5)); where it cannot be read,
    any member counts."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False
