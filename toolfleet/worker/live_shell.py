"""One persistent ``bash`` in the sandbox of :mod:`toolfleet.tools.sandbox`, run command by command.

The shell is a long-lived ``bwrap ... -- bash --noprofile --norc -s`` reading its script from its
stdin, the command channel: one end of a socketpair only the worker writes to, and a shell its own
processes can neither trace nor write commands into (:mod:`.shell_start` says how the kernel holds
that). Each command is written to the channel as one block:

    __tf_c=$'\\x63\\x64...'                       # the command's bytes, ANSI-C quoted (bash's own parser)
    eval "$__tf_c" </dev/null                    # runs in the shell itself: cd, export, set persist
    printf '\\n<end marker> %d\\n' "$?"            # the end marker, with the command's exit status

The end marker holds a random nonce made for that command, so the output of the command cannot end
it early by accident. stdout and stderr share one output channel (a socketpair, not a pipe: a process
of the session can neither read it nor learn a nonce; :mod:`.shell_start`), so the output is in the
order printed.
A command reads ``/dev/null`` as its stdin: it cannot eat the blocks that follow it.

Every write to the shell is non-blocking and bounded by the call's deadline (an absolute
:func:`time.monotonic` time, so a call that waited for its session's lock has only what is left): a
command cancelled or out of time before it is written is not run, and a block that could not be
written whole (the shell does not read: it stopped itself, say) restarts the shell, so half a
command never waits in the pipe to run later.

Stopping the current command (time limit, cancel): the processes the command started (descendants
of the sandbox's init not there before it, nor below one that was: what an earlier command's
background job starts meanwhile lives on) get TERM, then KILL after ``TERM_GRACE_S``,
pass after pass until none is left (a child forked after a pass's snapshot gets the next one; a
command that forks faster than that for ``STOP_WAIT_S`` has its shell restarted);
the shell then ends the ``eval`` and prints the end marker, and the session goes on with its cwd
and environment. When the command is the shell itself (a ``while :; do :; done`` loop in bash) the
marker does not come within ``STOP_WAIT_S``: the whole sandbox is killed and a new shell started
(cwd back to the workspace root, environment reset), and the result says so.

``exit`` ends the shell: the call reports the exit status, and the next call starts a new shell
(said in its output). The sandbox's PID namespace and ``--die-with-parent`` hold as for
``run_command`` (docs/sandbox.md): :meth:`Shell.close` kills the sandbox's init, so no process of
the session is left. ``--die-with-parent`` is tied to the *thread* that started ``bwrap``, so the
caller passes ``spawn``, which runs the start in a thread that lives as long as the worker.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..tools import sandbox
from ..tools.command import _SandboxInit, refusal_note
from ..tools.sandbox import SandboxCgroup
from .sandbox_lease import LAPSE_SIGNAL, LeaseFile
from .shell_outcome import LeaseLapsed, Outcome, ShellEnded, encode
from .shell_output import ShellOutput, _join, _recv, _text
from .shell_start import channel, children, killpg, living, output_channel, popen, send_signal

TERM_GRACE_S = 0.25  # between TERM and KILL of the command's processes (s)
STOP_WAIT_S = 0.75  # after KILL, how long the end marker may take before the shell is restarted (s)
KILL_PASS_S = 0.01  # between KILL passes over the command's processes (s)
POLL_S = 0.05  # how often a waiting command looks at its cancel signal (s)
BOOTSTRAP_WRITE_S = 5.0  # how long the new shell may take to accept its bootstrap (s)
MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # kept per command: head and tail, the middle dropped (said)
BOOTSTRAP = b"trap 'return 143 2>/dev/null' USR1\n__tf_run() { eval \"$__tf_c\"; }\n"


class Shell:
    """A persistent shell in ``workspace``. Not thread-safe: one command at a time (the caller holds
    a per-session lock). ``spawn(fn)`` runs ``fn`` (which starts ``bwrap``) in a long-lived thread."""

    def __init__(self, workspace: Path, spawn: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
                 lease: LeaseFile | None = None) -> None:
        self.workspace = workspace
        self._spawn = spawn
        self._lease = lease  # the holder's liveness lease: a sandboxed shell ends when it lapses (.sandbox_lease)
        self._cond = threading.Condition()
        self._out = ShellOutput(MAX_OUTPUT_BYTES)  # the output so far, head and tail (.shell_output)
        self._eof = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._chan: socket.socket | None = None  # the worker's end of the command channel
        self._reader: socket.socket | None = None  # the worker's end of the output channel
        self.init: _SandboxInit | None = None
        self.unsandboxed = False
        self._hidden: tuple[str, ...] = ()  # the secret mounts of the running sandbox (sandbox.hidden_now)
        self._life = threading.Lock()  # kill() (any thread) vs close(): never signal a closed pidfd
        self.ended = False  # end(): its session was closed; no restart
        self._cgroup: SandboxCgroup | None = None  # the running sandbox's own: its process limit (tools/limits.py)
        self._refused = 0  # process starts its limit had refused when the last command's result was told
        self._unsaid = 0  # refusals in sandboxes closed since then (a restart during the command): told next
        self._start()

    # ---- life ----
    def _start(self) -> None:
        box = sandbox.current()
        self.unsandboxed = box.unsandboxed
        info_r, info_w = (None, None) if box.unsandboxed else os.pipe()
        self._chan, shell_end = channel()
        self._reader, shell_out = output_channel()
        try:  # what covers the secrets, taken before the argv: a rotation in between restarts, never leaks
            self._hidden = box.hidden_now(self.workspace)
            self._cgroup, self._refused = box.cgroup(), 0
            try:
                self.proc = popen(box, self.workspace, self._spawn, shell_end, shell_out, info_w, self._lease,
                                  self._cgroup)
            except BaseException:
                if self._cgroup is not None:
                    self._cgroup.close()
                raise
        finally:
            shell_end.close()
            shell_out.close()
            if info_w is not None:
                os.close(info_w)
        self.init = None
        try:  # a cancel or soft time limit landing while bwrap starts must not leave its sandbox behind
            self.init = _SandboxInit.read(info_r) if info_r is not None else _SandboxInit(None)
        except BaseException:
            if info_r is not None and self.proc is not None:  # its init not reported yet: bwrap's child
                bwrap = children(self.proc.pid) if self._lease is not None else [self.proc.pid]
                self.init = _SandboxInit.child_of(bwrap[0]) if bwrap else None
            self.close()  # the init killed, or bwrap before it forked one
            raise
        self._shell_pid: int | None = None
        # USR1 ends the running command: the trap's `return` leaves the function the command runs in;
        # not taken in time: seen at the first command (the shell is restarted when its block cannot be)
        self._write(BOOTSTRAP, time.monotonic() + BOOTSTRAP_WRITE_S, threading.Event())
        with self._cond:
            self._out.clear()
            self._eof = False
        threading.Thread(target=self._drain, args=(self.proc, self._reader), name="toolfleet-shell-out",
                         daemon=True).start()

    def _drain(self, proc: subprocess.Popen[bytes], out: socket.socket) -> None:
        for chunk in iter(lambda: _recv(out), b""):
            with self._cond:
                if proc is not self.proc:
                    return
                self._out.add(chunk)  # past MAX_OUTPUT_BYTES: the head and the newest tail
                self._cond.notify_all()
        with self._cond:
            if proc is self.proc:
                self._eof = True
                self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and not self._eof

    @property
    def lease_lapsed(self) -> bool:
        """The shell's sandbox was ended by its lease watchdog: the holder's liveness lapsed (frozen,
        or cut off from Redis) and the session counts as lost (:mod:`.sandbox_lease`)."""
        return self._lease is not None and self.proc is not None and self.proc.poll() == -int(LAPSE_SIGNAL)

    def end(self) -> None:
        """:meth:`kill` for good (the session was closed): a call running sees its end, and no
        :meth:`restart` starts another shell in its place (:class:`ShellEnded`)."""
        self.ended = True
        self.kill()

    def kill(self) -> None:
        """SIGKILL the shell's sandbox (its init: the kernel ends every process of it) without
        waiting; safe from any thread, while a command runs. Never blocks: a :meth:`close` under way
        is killing it already. The command running sees the shell's end; :meth:`close` still follows."""
        if not self._life.acquire(blocking=False):
            return
        try:
            if self.init is not None and self.init.pid is not None:
                self.init.kill()
            elif self.proc is not None:
                killpg(self.proc.pid)
        finally:
            self._life.release()

    def close(self) -> None:
        """End the shell and every process of its sandbox; returns once they are gone (bounded:
        about 15 s at worst)."""
        with self._life:
            self._close()

    def _close(self) -> None:
        proc, init = self.proc, self.init
        if proc is None:
            for end in (self._chan, self._reader):  # bwrap did not start
                if end is not None:
                    end.close()
            return
        if init is not None and init.pid is not None:
            init.kill()
        else:
            killpg(proc.pid)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if init is not None:
            init.wait_gone()
            init.close()
        cgroup = self._cgroup
        if cgroup is not None:
            cgroup.close()  # what is left in it is KILLed: nothing of the sandbox outlives it
            self._unsaid += max(cgroup.refused() - self._refused, 0)  # its count goes with it: kept
            self._cgroup, self._refused = None, 0
        for end in (self._chan, self._reader):
            try:
                if end is not None:
                    if end is self._reader:
                        end.shutdown(socket.SHUT_RDWR)  # wakes the drain thread if it still waits
                    end.close()
            except OSError:
                pass

    def restart(self, ran: bool = False) -> None:
        """A new shell in place of this one. Raises :class:`LeaseLapsed` (``ran``: whether the call's
        command had been written) instead when the lease ended this one: its session is lost, and a
        quiet new shell would hide that."""
        if self.lease_lapsed:
            raise LeaseLapsed(ran)
        self.close()
        if self.ended:  # its session was closed: a new shell would outlive it
            raise ShellEnded(ran)
        self._start()

    # ---- one command ----
    def run(self, command: str, deadline: float, cancelled: threading.Event) -> Outcome:
        """:meth:`_run`, its note saying when the sandbox's process limit refused process starts
        during the command (a fork bomb in the background goes on hitting it: each result says so)."""
        outcome = self._run(command, deadline, cancelled)
        cgroup = self._cgroup  # once: a session's end may close the shell from another thread meanwhile
        now = cgroup.refused() if cgroup is not None else 0
        refused, self._unsaid, self._refused = self._unsaid + max(now - self._refused, 0), 0, now
        extra = refusal_note(sandbox.current(), refused).strip()  # the old sandbox's too, when it was restarted
        return replace(outcome, note=_join(outcome.note, extra)) if extra else outcome

    def _run(self, command: str, deadline: float, cancelled: threading.Event) -> Outcome:
        """Run ``command`` in the shell until ``deadline`` (a :func:`time.monotonic` time, s), then
        stop it (``stopped = "timeout"``), or until ``cancelled`` is set (``"cancelled"``). A command
        whose time is up or that is cancelled before it is written does not run; one that cannot be
        written whole in time (the shell does not read) is never run: the shell is restarted
        (``restarted``). Raises ``ValueError`` for a NUL in ``command``, and :class:`LeaseLapsed` where
        it would restart a shell its lease ended (the session is lost: never a quiet new shell)."""
        script = encode(command)
        note = ""
        if not self.alive:
            self.restart()
            note = "[a new shell was started: the previous one had ended; cwd and environment are reset]"
        elif sandbox.current().hidden_now(self.workspace) != self._hidden:
            self.restart()  # a secret rotated or created since the shell started is not covered in it
            note = ("[a new shell was started: the worker's secret files changed since this shell started, and its "
                    "sandbox must cover them; cwd, environment and background processes are reset]")
        if cancelled.is_set() or time.monotonic() >= deadline:
            return self._not_run(cancelled, note)
        mark = f"__toolfleet_end_{secrets.token_hex(12)}__".encode()
        assert self.proc is not None
        before = self._descendants()
        with self._cond:
            start = len(self._out)
            self._out.dropped = 0
        block = f"__tf_c={script}\n__tf_run </dev/null\nprintf '\\n%s %d\\n' '{mark.decode()}' \"$?\"\n"
        written = self._write(block.encode(), deadline, cancelled)
        if written == 0 and not self._eof_seen():
            return self._not_run(cancelled, note)
        if written < len(block.encode()) and not self._eof_seen():  # half a command in the channel: never run it
            text = self._take()
            self.restart()
            return Outcome(text, None, stopped="cancelled" if cancelled.is_set() else "timeout", restarted=True,
                           note=_join(note, "[the shell did not read the command in time: it was not run]"))
        while True:
            found = self._wait_mark(mark, start, min(POLL_S, max(deadline - time.monotonic(), 0.001)))
            if found is not None:
                return Outcome(*found, note=note)
            if self._eof_seen():
                return self._ended(note)
            if cancelled.is_set() or time.monotonic() >= deadline:
                why = "cancelled" if cancelled.is_set() else "timeout"
                return self._stop(mark, start, before, why, note)

    def _write(self, data: bytes, deadline: float, cancelled: threading.Event) -> int:
        """Write ``data`` to the shell's input (non-blocking) until ``deadline`` or ``cancelled``;
        returns the number of bytes written (all of them when the shell is gone: seen as its end)."""
        assert self._chan is not None
        poller = select.poll()
        poller.register(self._chan.fileno(), select.POLLOUT)
        done = 0
        while done < len(data):
            try:
                done += self._chan.send(data[done:done + 65536])
                continue
            except BlockingIOError:
                pass
            except OSError:  # EPIPE, ECONNRESET: the shell is gone
                return len(data)
            left = deadline - time.monotonic()
            if left <= 0 or cancelled.is_set():
                break
            poller.poll(int(min(left, POLL_S) * 1000) + 1)
        return done

    def _not_run(self, cancelled: threading.Event, note: str) -> Outcome:
        why = "cancelled" if cancelled.is_set() else "timeout"
        return Outcome("", None, stopped=why, note=_join(note, f"[the command was not run: {why} before it started]"))

    def _wait_mark(self, mark: bytes, start: int, timeout_s: float) -> tuple[str, int] | None:
        with self._cond:
            at = self._out.find(mark)  # goes on from its last look: linear in the output (.shell_output)
            if at < 0:
                self._cond.wait(timeout_s)
                at = self._out.find(mark)
            if at < 0:
                return None
            end = self._out.find_newline(at)
            if end < 0:
                return None  # the status is still on its way
            status = int(self._out.slice(at + len(mark), end).strip() or b"0")
            text = self._out.slice(0, max(at - 1, 0))  # the newline printed before the marker is ours
            dropped = self._out.dropped
            self._out.consume(end + 1)
        return _text(text, dropped), status

    def _eof_seen(self) -> bool:
        with self._cond:
            return self._eof

    def _take(self) -> str:
        with self._cond:
            dropped = self._out.dropped
            text = self._out.take()
        return _text(text, dropped)

    def _ended(self, note: str) -> Outcome:
        assert self.proc is not None
        status = self.proc.wait()
        text = self._take()
        self.close()
        return Outcome(text, status, note=(note + "\n" if note else "") +
                       f"[the shell exited (status {status}); the next call starts a new shell]", exited=True)

    def _stop(self, mark: bytes, start: int, before: set[int], why: str, note: str) -> Outcome:
        """Stop the processes the command started; restart the shell if the marker does not come."""
        self._descendants()  # learns the shell's pid if not known yet
        shell_pid = self._shell_pid if self.init is not None and self.init.pid is not None else self.proc.pid  # type: ignore[union-attr]
        if shell_pid is not None:
            try:
                os.kill(shell_pid, signal.SIGUSR1)  # the trap returns from the command once its child ends
            except (ProcessLookupError, PermissionError):
                pass
        send_signal(self._descendants(before), signal.SIGTERM)
        found = self._wait_until(mark, start, TERM_GRACE_S)
        # one KILL pass misses a child forked after its snapshot: pass again until none is left (bounded)
        kill_until = time.monotonic() + STOP_WAIT_S
        while left := living(self._descendants(before)):
            if time.monotonic() >= kill_until:
                found = None  # it forks faster than it is killed: only ending the sandbox ends it
                break
            send_signal(left, signal.SIGKILL)
            if found is None:
                found = self._wait_mark(mark, start, KILL_PASS_S)
            else:
                time.sleep(KILL_PASS_S)
        else:
            if found is None:
                found = self._wait_until(mark, start, STOP_WAIT_S)
        if found is not None:
            return Outcome(found[0], None, stopped=why, note=note)
        text = self._take()
        self.restart(ran=True)
        return Outcome(text, None, stopped=why, restarted=True, note=note)

    def _wait_until(self, mark: bytes, start: int, wait_s: float) -> tuple[str, int] | None:
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            found = self._wait_mark(mark, start, min(left, POLL_S))
            if found is not None or self._eof_seen():
                return found
        return None

    def _descendants(self, earlier: set[int] | frozenset[int] = frozenset()) -> set[int]:
        """Host pids of the processes below the shell: below the sandbox's init, the shell itself
        excluded (unsandboxed: below the shell). ``earlier``: processes of earlier commands (a
        background job), left out with all below them (a stop must not end what a job started)."""
        assert self.proc is not None
        if self.init is None or self.init.pid is None:
            root, shell_pid = self.proc.pid, None
        else:
            root = self.init.pid
            if self._shell_pid is None:
                kids = children(root)
                if len(kids) == 1:  # the first child of the init is the shell
                    self._shell_pid = kids[0]
            shell_pid = self._shell_pid
        found: set[int] = set()
        todo = children(root)
        while todo:
            pid = todo.pop()
            if pid not in found and pid not in earlier:
                found.add(pid)
                todo.extend(children(pid))
        found.discard(shell_pid)  # type: ignore[arg-type]
        return found
