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

import functools
import json
import os
import select
import signal
import subprocess
import threading
import time
from typing import Annotated

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import Field

from ..errors import CallCancelled, ToolFailure, ToolTimeout
from . import sandbox
from .context import ToolContext, check_fence_before_start
from .output import HeadTail
from .spec import tool
from .workspace import workspace_of

TERM_GRACE_S = 0.25  # between TERM and KILL (s); below the default cancel_grace_s (0.5 s), so a cancel
# that a command ignores still ends in this handler, with its partial output, before the dispatcher kills it
POLL_S = 0.05  # how often the wait loop looks at the cancel signal and the deadline (s)
TIMEOUT_HINT = ("the command may have done part of its work: check before repeating it; raise timeout_s, or run a "
                "shorter command")
SELF_KILL_AFTER_S = 0.5  # the sandbox ends itself this long after the call's time limit (s): see below


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
    worker allows it, and every process it starts ends when the command ends. Of a very long output
    the first and last 2 MiB are kept.
    A non-zero exit status makes the call an error whose content still holds the output.

    Args:
        command: The command line, run with `bash -c` in the workspace root.
        timeout_s: Seconds before the command is stopped; the tool's default is 300.
    """
    box = sandbox.current()
    workspace = workspace_of(ctx)
    cgroup = box.cgroup()  # its process limit (tools/limits.py); None: RLIMIT_NPROC or none
    try:  # the cgroup is closed once its sandbox has ended, on every path (a cancel or soft limit anywhere)
        info_r, info_w = (None, None) if box.unsandboxed else os.pipe()
        try:
            argv, env = box.command(["bash", "-c", command], workspace, info_fd=info_w)
            note = sandbox.UNSANDBOXED_NOTE + "\n" if box.unsandboxed else ""
            check_fence_before_start(ctx, "the command")  # right before the effect: a stale execution starts nothing
            argv = _bounded(argv, ctx, box)  # after the check: the time it took counts against the deadline
            proc = subprocess.Popen(
                argv,
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=() if info_w is None else (info_w,),
                preexec_fn=None if box.unsandboxed else functools.partial(sandbox.sandbox_child, os.getpid(), cgroup),
            )
        except BaseException:
            if info_r is not None:
                os.close(info_r)
            raise
        finally:
            if info_w is not None:
                os.close(info_w)
        from ..worker import reaper  # here: the worker package imports the tools

        entry = reaper.register(proc.pid)  # a frozen worker's sandbox ends with its liveness (worker/reaper.py)
        init: _SandboxInit | None = None
        try:  # a cancel or the soft limit landing while bwrap starts must not leave its sandbox behind
            chunks = HeadTail()  # bounded: the head and the tail of what it prints
            reader = threading.Thread(target=_drain, args=(proc, chunks), daemon=True)
            if info_r is not None:
                fd, info_r = info_r, None  # _SandboxInit.read closes it, whatever happens in it
                init = _SandboxInit.read(fd)
            reader.start()
            exited = _exit_watch(proc)
        except BaseException:
            if info_r is not None:
                os.close(info_r)
            if init is None and not box.unsandboxed:  # its init not reported yet: bwrap's child, if forked
                bwrap = _children(proc.pid)  # proc is the deadline's timeout (_bounded): bwrap is its child
                init = _SandboxInit.child_of(bwrap[0]) if bwrap else None
            _stop_group(proc, init)
            if init is not None:
                init.close()
            reaper.unregister(entry)
            raise

        def output() -> str:
            if box.unsandboxed:
                _kill_group(proc.pid)  # what the command left running holds the pipe open
            reader.join(timeout=1.0)
            return note + chunks.text() + refusal_note(box, cgroup.refused() if cgroup is not None else 0)

        try:
            while True:
                if exited(min(POLL_S, max(ctx.remaining_s, 0.001))):
                    proc.wait()
                    if init is not None:
                        init.wait_gone()  # bwrap exits before its init has finished killing the namespace
                    break
                if ctx.cancelled.is_set():
                    _stop_group(proc, init)
                    raise CallCancelled(ctx.cancel_reason or "the turn was cancelled", output=output())
                if ctx.remaining_s <= 0:
                    _stop_group(proc, init)
                    raise ToolTimeout(
                        f"command ran past its time limit and was stopped: {command}",
                        TIMEOUT_HINT,
                        output=output(),
                    )
        except SoftTimeLimitExceeded:
            _stop_group(proc, init)
            raise ToolTimeout(
                f"command ran past its time limit and was stopped: {command}",
                TIMEOUT_HINT,
                output=output(),
            ) from None
        except CallCancelled as exc:
            _stop_group(proc, init)
            raise CallCancelled(str(exc), output=exc.output or output()) from None
        finally:
            if proc.poll() is None:
                _stop_group(proc, init)
            reaper.unregister(entry)
            exited.close()  # type: ignore[attr-defined]
            if init is not None:
                init.close()
    finally:
        if cgroup is not None:
            cgroup.close()
    text = output()
    if proc.returncode == -signal.SIGKILL and reaper.lapsed():
        raise ToolFailure(
            "the command was stopped: this worker lost its liveness (frozen, or cut off from Redis) past its lease, "
            f"and its sandboxes were ended; it may have acted in part: {command}",
            "run it again",
            code="WORKER_LOST",
            output=text,
        )
    if proc.returncode != 0:
        raise ToolFailure(
            f"command exited with status {proc.returncode}: {command}",
            "read the output below for the cause",
            output=text,
        )
    return text


def refusal_note(box: sandbox.SandboxState, refused: int) -> str:
    """A line for the result when the sandbox's process limit refused ``refused`` process starts
    since it started; ``""`` for none."""
    if refused <= 0:
        return ""
    return (f"\n[the sandbox reached its limit of {box.limit.max_processes} processes (sandbox_max_processes): the "
            f"kernel refused {refused} process or thread start(s) (bash says 'fork: Resource temporarily "
            "unavailable', Python 'can't start new thread'); end processes the command left running, or start "
            "fewer at once]")


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


def _drain(proc: subprocess.Popen[bytes], chunks: HeadTail) -> None:
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        chunks.add(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(proc: subprocess.Popen[bytes], init: _SandboxInit | None) -> None:
    """TERM the command's process group, wait ``TERM_GRACE_S``, then KILL what is left.

    In the sandbox (``init`` given) the command runs in the session and group of the sandbox's init
    (pid 1 of its PID namespace, ``--new-session``): TERM goes to that group, KILL to the init, whose
    end makes the kernel kill every process of the namespace; this returns once the init is gone, so
    no process of the command is left. Unsandboxed, TERM and KILL go to ``proc``'s own group."""
    pgid = proc.pid if init is None or init.pid is None else init.pid  # no pid: bwrap failed or was slow
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    if init is not None:
        init.kill()
    _kill_group(proc.pid)
    proc.wait()
    if init is not None:
        init.wait_gone()


class _SandboxInit:
    """The sandbox's init (pid 1 of its PID namespace), as bwrap reports it on ``--info-fd``, held
    by a pidfd. bwrap exits as soon as the command's shell does, *before* the init has finished
    making the kernel kill the namespace's other processes; the init's pidfd becomes readable only
    after that (the kernel zaps a PID namespace before it notifies its init's exit), so waiting on it
    is waiting until no process of the command is left."""

    GONE_WAIT_S = 5.0  # the init dies with bwrap (--die-with-parent); KILLed if it has not by then

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._fd: int | None = None
        if pid is not None:
            try:
                self._fd = os.pidfd_open(pid)
            except OSError:  # already gone (or no pidfd: Linux < 5.3; bwrap's --die-with-parent still holds)
                self._fd = None

    @classmethod
    def read(cls, info_fd: int) -> _SandboxInit:
        """Read bwrap's ``--info-fd`` JSON (written once the sandbox exists) from ``info_fd``, up to
        its end or the fd's, and close it; waits at most ``sandbox.PROBE_TIMEOUT_S``. A bwrap that
        failed first exits without writing (its ``timeout`` with it, which closes the fd): then
        there is no init to wait for."""
        data = b""
        poller = select.poll()
        poller.register(info_fd, select.POLLIN)
        deadline = time.monotonic() + sandbox.PROBE_TIMEOUT_S
        try:
            while (left := deadline - time.monotonic()) > 0 and poller.poll(int(left * 1000) + 1):
                chunk = os.read(info_fd, 4096)
                if not chunk:
                    break
                data += chunk
                if _whole_json(data):  # the deadline's timeout holds the fd open too: no EOF till it ends
                    break
        finally:
            os.close(info_fd)
        try:
            pid = int(json.loads(data)["child-pid"])
        except (ValueError, KeyError, TypeError):
            pid = None
        return cls(pid)

    @classmethod
    def child_of(cls, bwrap_pid: int) -> _SandboxInit | None:
        """The sandbox's init found as ``bwrap``'s child (``/proc/<pid>/task/<tid>/children``), for
        a start interrupted before bwrap reported it; ``None`` when bwrap has not forked it (then
        killing bwrap is enough: the child it forks later is killed with it, --die-with-parent)."""
        children = _children(bwrap_pid)
        return cls(children[0]) if children else None

    def kill(self) -> None:
        if self._fd is not None:
            try:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait_gone(self) -> None:
        """Return once the init (and so every process of the namespace) is gone: bounded by
        ``GONE_WAIT_S``, then the init is KILLed and waited for again."""
        if self._fd is None:
            return
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        if not poller.poll(int(self.GONE_WAIT_S * 1000)):
            self.kill()
            poller.poll(int(self.GONE_WAIT_S * 1000))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _whole_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (``/proc/<pid>/task/<tid>/children``); ``[]`` when it is gone."""
    try:
        return [int(child) for task in os.listdir(f"/proc/{pid}/task")
                for child in open(f"/proc/{pid}/task/{task}/children").read().split()]
    except (OSError, ValueError):
        return []


def _bounded(argv: list[str], ctx: ToolContext, box: sandbox.SandboxState) -> list[str]:
    """The sandbox's argv (``bwrap ...``) under a deadline kept outside it: coreutils ``timeout -s
    KILL`` runs bwrap, ``SELF_KILL_AFTER_S`` past the call's time limit (within Celery's hard limit,
    SOFT_LIMIT_MARGIN_S after it). The worker stops the command at its limit; this holds when the
    worker cannot: frozen (SIGSTOP, a paused VM), the sandbox, in a session of its own, runs on.
    On its deadline ``timeout`` KILLs bwrap and itself (their process group); bwrap's end takes the
    sandbox's init with it (``--die-with-parent``), and the init's end makes the kernel end every
    process of its PID namespace, so nothing of the call acts after its hard limit, which the
    watchdog and the locks count on (a gray-failure trial: a frozen worker's ``sleep 4; echo t1 >>
    f`` wrote after the next turn's write).

    Outside, not in the sandbox: inside, ``timeout`` was the command shell's parent, in its PID
    namespace and of its user, so ``kill -STOP $PPID`` switched the deadline off (a breaker's trial:
    a frozen worker's command wrote after the next turn's write again); and it sat in the process
    group a stop's TERM goes to, so it sent the command a second TERM. Unsandboxed: unchanged.
    ``timeout`` is found in root's directories first (:func:`.sandbox.deadline_binary`), never in a
    directory a sandbox could have written."""
    if box.unsandboxed:
        return argv
    return [sandbox.deadline_binary(), "-s", "KILL",
            f"{max(ctx.remaining_s, 0.0) + SELF_KILL_AFTER_S:.3f}", *argv]
