"""How many processes a sandboxed command may have: a limit the kernel keeps (docs/sandbox.md,
"Processes"). Without one, a model-proposed fork bomb (``:(){ :|:& };:``), above all one left in
the background of a live ``shell`` session (which has no time limit), filled the host's PID space and
took the worker, and every call on it, down.

Two kernel facilities, whichever the worker has; neither reads the command's text:

- **a cgroup per sandbox** (the ``pids`` controller, cgroup v1 or v2). The process that starts the
  sandbox joins it before it execs (``preexec_fn``: :meth:`SandboxCgroup.join`), so every task the
  sandbox makes (processes and threads; the deadline's ``timeout``, ``bwrap`` and its init
  included) is counted, and a ``fork``/``clone`` past ``pids.max`` fails with ``EAGAIN``, whoever
  the worker runs as, root included. ``pids.events`` counts the refusals: the result says so.
  The cgroup is removed when the sandbox has ended (what is left in it then is KILLed first).
- **``RLIMIT_NPROC`` set inside the sandbox's user namespace** (``prlimit --nproc=N:N`` is the
  sandbox's first program). Since Linux 5.14 the kernel counts it per user *and user namespace*,
  and every sandbox has a user namespace of its own, so it bounds this sandbox's processes alone
  (set on ``bwrap`` before it makes the namespace, it would count every process of the worker's
  user on the host). The command cannot raise it back (no capability). The kernel never enforces
  it for a process whose user is host root (``INIT_USER``): a root worker's sandbox maps uid 0 to
  0, so it is used for workers that are not root (the Docker image's), where it needs nothing
  from the host.

Where neither holds (a root worker whose cgroup file system is read-only or lacks ``pids``), the
worker logs a warning at start-up and ``toolfleet tools --json`` shows ``"process_limit": "none"``.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "toolfleet-"
BASE_NAME = "toolfleet"  # under the worker's own cgroup (auto): one directory all its sandboxes go in
REMOVE_WAIT_S = 2.0  # how long close() retries removing a cgroup whose last tasks are still being released


@dataclass(frozen=True)
class ProcessLimit:
    """What bounds the number of a sandbox's processes on this worker (:func:`find`): ``max_processes``
    (0: no limit), ``cgroup_base`` (a directory a cgroup per sandbox is made in, or ``None``), ``v2``
    (that directory is cgroup v2), ``prlimit`` (the ``prlimit`` binary the sandbox starts with, or
    ``None``) and ``warning`` (why neither is used, said at start-up)."""

    max_processes: int = 0
    cgroup_base: str | None = None
    v2: bool = False
    prlimit: str | None = None
    warning: str | None = None

    @property
    def kind(self) -> str:
        """``"cgroup"``, ``"rlimit"`` or ``"none"``: for ``toolfleet tools --json`` and the docs."""
        if not self.max_processes:
            return "none"
        return "cgroup" if self.cgroup_base else "rlimit" if self.prlimit else "none"

    def open(self) -> SandboxCgroup | None:
        """A new cgroup for one sandbox (``None`` when cgroups are not used here). Raises ``OSError``
        when it cannot be made: the sandbox does not start unbounded."""
        if not self.max_processes or not self.cgroup_base:
            return None
        _retry_leftovers()
        _sweep(self.cgroup_base)  # a pool process killed mid-command (SIGKILL, OOM) left its empty cgroup
        return SandboxCgroup(os.path.join(self.cgroup_base, f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"),
                             self.max_processes)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` (what the sandbox runs) under ``RLIMIT_NPROC`` when that is how the limit is kept."""
        if self.max_processes and self.prlimit:
            return [self.prlimit, f"--nproc={self.max_processes}:{self.max_processes}", "--", *argv]
        return list(argv)


class SandboxCgroup:
    """One sandbox's cgroup: made with its ``pids.max``, joined by the starting child, removed by :meth:`close`."""

    def __init__(self, path: str, max_processes: int) -> None:
        os.mkdir(path, 0o755)
        self.path = path
        self._final: int | None = None  # refused() when closed
        try:
            _write(os.path.join(path, "pids.max"), str(max_processes))
            self._procs = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            _remove(path)
            raise

    def join(self) -> None:
        """In the child that starts the sandbox (``preexec_fn``), before it execs: move it into the
        cgroup, so all it starts is counted. An ``OSError`` fails the start (never unbounded)."""
        os.write(self._procs, b"0")

    def refused(self) -> int:
        """How many forks the limit refused so far (``pids.events``' ``max``; when closed, at its close)."""
        if self._final is not None:
            return self._final
        try:
            with open(os.path.join(self.path, "pids.events")) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "max":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def close(self) -> None:
        """Remove the cgroup once the sandbox has ended; a task still in it is KILLed first. What the
        kernel has not released within ``REMOVE_WAIT_S`` is removed at a later :meth:`ProcessLimit.open`."""
        if self._final is not None:
            return
        self._final = self.refused()
        try:
            os.close(self._procs)
        except OSError:
            pass
        if not _remove(self.path, wait_s=REMOVE_WAIT_S):
            _leftovers.add(self.path)


_leftovers: set[str] = set()


def _retry_leftovers() -> None:
    for path in list(_leftovers):
        if _remove(path):
            _leftovers.discard(path)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _remove(path: str, wait_s: float = 0.0) -> bool:
    """rmdir the cgroup ``path``; KILL what is still in it and retry for up to ``wait_s``. True when gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("could not remove the sandbox cgroup %s: %s", path, exc)
                return False
        _kill_all(path)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)  # the kernel releases an exited task's count shortly after it is reaped


def _kill_all(path: str) -> None:
    try:
        _write(os.path.join(path, "cgroup.kill"), "1")  # cgroup v2, Linux 5.14+
        return
    except OSError:
        pass
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ---- finding the facility, once per worker (at start-up, before the pool forks) ----

def find(max_processes: int, cgroup: str = "auto", bwrap_bin: str | None = None) -> ProcessLimit:
    """What will bound each sandbox's processes on this worker: a cgroup per sandbox where ``cgroup``
    (``"auto"``: the worker's own cgroup, ``pids`` controller; a directory: there; ``"off"``: never)
    can be used, else ``RLIMIT_NPROC`` in the sandbox's user namespace when the worker is not root,
    else nothing (``warning`` says why). ``max_processes`` 0: no limit, no warning."""
    if max_processes <= 0:
        return ProcessLimit()
    per_namespace = _kernel() >= (5, 14)  # RLIMIT_NPROC counted per user namespace (ucounts)
    prlimit = (shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin")
               if os.getuid() != 0 and per_namespace else None)
    why = "sandbox_cgroup is off"
    if cgroup != "off":
        try:
            base, v2 = _cgroup_base(cgroup)
            _prepare(base, v2)
            _sweep(base)
            return ProcessLimit(max_processes, base, v2)  # the cgroup alone: no prlimit exec per sandbox
        except (OSError, LookupError) as exc:
            why = f"no cgroup for sandboxes ({exc})"
    if prlimit:
        return ProcessLimit(max_processes, prlimit=prlimit)
    reason = ("the worker runs as root, whose processes RLIMIT_NPROC does not bound" if os.getuid() == 0
              else "this kernel (before 5.14) counts RLIMIT_NPROC across the worker's user, not per sandbox"
              if not per_namespace else "the prlimit binary (util-linux) was not found")
    warning = (f"sandboxed commands have NO process limit (sandbox_max_processes = {max_processes} is not "
               f"enforced): {why}, and {reason}. A fork bomb can exhaust this host's processes until its call's "
               "time limit (a live shell's: until its session ends); give the worker a writable cgroup with the "
               "pids controller (sandbox_cgroup), or run it as a user other than root (docs/sandbox.md, Processes)")
    return ProcessLimit(max_processes, warning=warning)


def _kernel() -> tuple[int, int]:
    try:
        major, minor = os.uname().release.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def _cgroup_base(setting: str) -> tuple[str, bool]:
    """The directory sandboxes' cgroups go in, and whether it is cgroup v2."""
    if setting != "auto":
        if not os.path.isdir(setting):
            raise LookupError(f"sandbox_cgroup {setting!r} is not a directory")
        return setting, os.path.exists(os.path.join(setting, "cgroup.controllers"))
    own = _own_cgroups()
    for mount, root, kind, options in _cgroup_mounts():
        if (kind == "cgroup" and "pids" in options and "pids" in own) or (kind == "cgroup2" and "" in own and
                                                                           "pids" not in own):
            path = own["pids" if kind == "cgroup" else ""]
            if root != "/" and (path + "/").startswith(root.rstrip("/") + "/"):
                path = path[len(root.rstrip("/")):] or "/"
            base = os.path.join(mount, path.lstrip("/"))
            if kind == "cgroup2":  # no processes in a cgroup with controllers for children: only a root one here
                with open(os.path.join(base, "cgroup.subtree_control")) as f:
                    if "pids" not in f.read().split():
                        raise LookupError(f"the worker's cgroup v2 {base} does not delegate the pids controller; "
                                          "set sandbox_cgroup to a delegated cgroup")
            return os.path.join(base, BASE_NAME), kind == "cgroup2"
    raise LookupError("no cgroup pids controller mounted")


def _own_cgroups() -> dict[str, str]:
    """``/proc/self/cgroup``: controller name (``""`` for v2) → path."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                out[name] = path
    return out


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """``(mount point, root, "cgroup"|"cgroup2", super options)`` of each cgroup mount (``/proc/self/mountinfo``)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], fields[3], tail[0], set(tail[2].split(","))))
    return out


def _prepare(base: str, v2: bool) -> None:
    """Make ``base`` (v2: with ``pids`` for its children) and check that a child cgroup can be made
    there with a ``pids.max``. Raises ``OSError`` when not."""
    os.makedirs(base, 0o755, exist_ok=True)
    if v2:
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            if "pids" not in f.read().split():
                _write(os.path.join(base, "cgroup.subtree_control"), "+pids")
    trial = SandboxCgroup(os.path.join(base, f"{PREFIX}{os.getpid()}-probe-{secrets.token_hex(4)}"), 1)
    trial.close()


def _sweep(base: str) -> None:
    """Remove the empty cgroups that processes gone since left in ``base`` (a worker, or a pool process
    killed between a sandbox's start and its close): at a worker's start and at each sandbox's."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            os.kill(int(name[len(PREFIX):].split("-", 1)[0]), 0)
            continue  # its worker process lives: its own close removes it
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        try:
            os.rmdir(os.path.join(base, name))
        except OSError:
            pass


def describe(limit: ProcessLimit) -> dict[str, Any]:
    return {"max_processes": limit.max_processes, "process_limit": limit.kind}
