"""The persistent shell of a live session, in-process (toolfleet/worker/live_shell.py): the end
marker and exit status, state kept, stops that keep the shell, exit and restart, nothing left."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from toolfleet.tools import sandbox
from toolfleet.worker.affinity import _Spawner
from toolfleet.worker.live_shell import Shell, encode

from .leftovers import marker, processes_with, wait_gone

SPAWNER = _Spawner()
SPAWNER.start()


@pytest.fixture
def shell(tmp_path: Path):
    if sandbox.current().error:
        pytest.skip(f"no sandbox here: {sandbox.current().error}")
    s = Shell(tmp_path, SPAWNER)  # bwrap started by a thread that lives on, as in a worker (--die-with-parent)
    yield s
    s.close()


def run(shell: Shell, command: str, timeout_s: float = 20.0, cancel: threading.Event | None = None):
    return shell.run(command, time.monotonic() + timeout_s, cancel or threading.Event())


def test_output_status_and_state(shell, tmp_path):
    assert run(shell, "mkdir d && cd d && export A=1 && printf 'x'").output == "x"
    out = run(shell, "echo $A; pwd; echo err >&2; exit_code() { return 7; }; exit_code")
    assert (out.output, out.status) == (f"1\n{tmp_path}/d\nerr\n", 7)
    assert run(shell, "cat").output == ""  # stdin is /dev/null: it cannot eat the next command
    assert run(shell, 'echo "quotes \\" and $(echo sub) and \\\\ and é"').output == 'quotes " and sub and \\ and é\n'


def test_a_forged_marker_does_not_end_the_command(shell):
    out = run(shell, "echo '__toolfleet_end_0000__ 0'; echo after")
    assert out.output == "__toolfleet_end_0000__ 0\nafter\n" and out.status == 0


def test_stop_keeps_the_shell_and_ends_the_command_processes(shell):
    seconds = marker()
    run(shell, "export KEEP=1")
    out = run(shell, f"echo before; sleep {seconds}; echo never", timeout_s=0.5)
    assert out.stopped == "timeout" and not out.restarted and "before" in out.output and "never" not in out.output
    assert wait_gone(seconds) == []
    cancel = threading.Event()
    cancel.set()
    out = run(shell, "while :; do :; done", cancel=cancel)
    assert out.stopped == "cancelled" and not out.restarted
    assert run(shell, "echo $KEEP").output == "1\n"


def test_a_shell_that_cannot_be_stopped_is_restarted(shell, tmp_path):
    run(shell, "cd / ; trap '' USR1")  # the stop's trap is gone: only a restart ends the loop
    out = run(shell, "while :; do :; done", timeout_s=0.5)
    assert out.stopped == "timeout" and out.restarted
    assert run(shell, "pwd").output == f"{tmp_path}\n"


def test_exit_ends_the_shell_and_the_next_command_says_a_new_one_started(shell):
    out = run(shell, "exit 4")
    assert out.status == 4 and "next call starts a new shell" in out.note
    out = run(shell, "echo hi")
    assert out.output == "hi\n" and "new shell was started" in out.note


def test_close_leaves_no_process(shell):
    seconds = marker()
    run(shell, f"(setsid sleep {seconds} &); sleep {seconds} & echo bg")
    assert processes_with(seconds)
    shell.close()
    assert wait_gone(seconds) == []


def test_nul_is_refused():
    with pytest.raises(ValueError):
        encode("a\0b")


def test_a_worker_without_a_sandbox_does_not_serve_the_shell(settings):
    from toolfleet.tools.registry import default_registry

    before = sandbox.current()
    try:
        broken = settings.model_copy(update={"bwrap_path": "/nonexistent/bwrap"})
        registry, message = sandbox.serve_sandboxed(default_registry(["toolfleet.tools.shell_session"]), broken)
        assert "shell" not in registry.names() and "run_command" not in registry.names() and message
    finally:
        sandbox.install(before)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _stop_the_shell_itself(shell: Shell) -> int:
    """Make the shell stop itself (SIGSTOP) just after its command ended: it reads no more input."""
    run(shell, "(sleep 0.2; kill -STOP $$) & echo ok")
    shell._descendants()
    pid = shell._shell_pid or shell.proc.pid
    deadline = time.monotonic() + 10
    while _state(pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(pid) == "T"
    return pid


def test_a_command_the_shell_does_not_read_in_time_never_runs_later(shell, tmp_path):
    """Defect 1/2: the write of a command larger than the pipe buffer is bounded by the deadline;
    the half-written command is never run (the shell is restarted), and the call returns in time."""
    pid = _stop_the_shell_itself(shell)
    big = "cat > /dev/null <<'EOF'\n" + ("x" * 99 + "\n") * 3000 + "EOF\ntouch b-ran"  # 300 KB: 1.2 MB encoded
    done: list = []
    worker = threading.Thread(target=lambda: done.append(run(shell, big, timeout_s=1.0)), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(8)
    try:
        assert done, "the call blocked writing its command"
        assert time.monotonic() - started < 8
        out = done[0]
        assert out.stopped == "timeout" and out.restarted, out
    finally:
        try:
            os.kill(pid, signal.SIGCONT)  # the old shell, if still there, reads again
        except ProcessLookupError:
            pass
        worker.join(10)
    assert run(shell, "echo hi").output == "hi\n"
    assert not (tmp_path / "b-ran").exists()


def test_a_command_cancelled_or_out_of_time_before_it_is_written_does_not_run(shell, tmp_path):
    cancel = threading.Event()
    cancel.set()
    out = run(shell, "touch c-ran", cancel=cancel)
    assert out.stopped == "cancelled" and "not run" in out.note
    out = shell.run("touch t-ran", time.monotonic() - 1, threading.Event())
    assert out.stopped == "timeout" and "not run" in out.note
    assert run(shell, "ls").output == ""


def test_ending_a_session_does_not_wait_for_the_call_that_holds_it(shell):
    """Defect 2: SessionHost.end (called by the housekeeping thread: heartbeats, closes, expiry)
    never waits for the session's lock: the sandbox is killed at once, the shell closed later."""
    from types import SimpleNamespace

    from toolfleet.worker.affinity import SessionHost, _Session

    seconds = marker()
    run(shell, f"sleep {seconds} & echo bg")
    session = _Session(shell)
    host = SimpleNamespace(lock=threading.Lock(), sessions={"s": session})
    session.lock.acquire()  # a call holds the session (a write that never ends, say)
    try:
        ender = threading.Thread(target=SessionHost.end, args=(host, "s"), daemon=True)
        ender.start()
        ender.join(2)
        assert not ender.is_alive(), "end() waited for the session's lock"
        assert wait_gone(seconds, 5.0) == []
    finally:
        session.lock.release()


def test_a_stopped_command_that_keeps_forking_leaves_no_process(shell):
    """Defect 3: a command that ignores TERM and forks all the time: one KILL pass over a snapshot
    misses the children forked after it; none may be left."""
    for _ in range(3):
        seconds = marker()
        out = run(shell, f"(trap '' TERM; while :; do sleep {seconds} & done)", timeout_s=0.5)
        assert out.stopped == "timeout", out
        # KILLed, they may still show for a moment while they exit (a loaded CI machine: more than 1 s
        # once; 120 sleeps still there after 5 s once, at 25% of a CI run). What is left after 5 s is
        # described (state, parent, PID namespace) and given 15 s more: a process truly left behind
        # sleeps on for 1000 s and still fails this
        left = wait_gone(seconds, 5.0)
        if left:
            seen = _described(left[:5])
            left = wait_gone(seconds, 15.0)
            assert left == [], f"{len(left)} left; after 5 s: {seen}; shell {out}"
    assert run(shell, "echo on").output == "on\n"


def _described(processes: list[tuple[int, str]]) -> list[str]:
    import os

    out = []
    for pid, _ in processes:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            out.append(f"{pid}: state {fields[0]} ppid {fields[1]} pidns {os.readlink(f'/proc/{pid}/ns/pid')}")
        except OSError as exc:
            out.append(f"{pid}: {exc}")
    return out


def test_a_secret_rotated_or_created_after_the_shell_started_stays_covered(tmp_path):
    """Defect 4: the secrets are covered as they were when the shell's sandbox was made; a key
    file re-pointed through a Kubernetes-style ``..data`` link, or toolfleet's home created later,
    must not be readable: the shell is restarted (and says so) before the next command."""
    if sandbox.current().error:
        pytest.skip(f"no sandbox here: {sandbox.current().error}")
    import shutil
    import tempfile

    place = Path(tempfile.mkdtemp(prefix="toolfleet-rot-", dir="/var/tmp"))  # outside the sandbox's /tmp
    before = sandbox.current()
    shell = None
    try:
        (place / "..v1").mkdir()
        (place / "..v1" / "key").write_text("OLD-SECRET\n")
        os.symlink("..v1", place / "..data")
        os.symlink("..data/key", place / "key")
        home = place / "home"
        config = sandbox.SandboxConfig(hidden=(str(place / "key"), str(home)))
        sandbox.install(sandbox.SandboxState(config, sandbox.probe(config)))
        workspace = tmp_path / "ws"
        workspace.mkdir()
        shell = Shell(workspace, SPAWNER)
        read = f"cat {place}/key {home}/fleet.key 2>/dev/null; echo end"
        assert run(shell, "export KEEP=1; " + read).output == "end\n"
        (place / "..v2").mkdir()
        (place / "..v2" / "key").write_text("ROTATED-SECRET\n")
        os.symlink("..v2", place / "..tmp")
        os.rename(place / "..tmp", place / "..data")
        out = run(shell, read)
        assert "ROTATED" not in out.output and out.output == "end\n", out
        assert "secret files changed" in out.note
        home.mkdir()
        (home / "fleet.key").write_text("LATE-SECRET\n")
        out = run(shell, read)
        assert "LATE" not in out.output and out.output == "end\n", out
        assert "secret files changed" in out.note
        out = run(shell, "echo ${KEEP:-reset}")
        assert out.output == "reset\n" and out.note == ""  # no change since: the shell goes on
    finally:
        if shell is not None:
            shell.close()
        sandbox.install(before)
        shutil.rmtree(place, ignore_errors=True)


# ---- the command channel: what the shell reads as commands comes from the worker only ----

_PAYLOAD = "\\ntouch injected; ls() { echo FAKE-$((6*7)); }; git() { echo FAKE-$((6*7)); }\\n"
_INJECT = f"""#!/bin/bash
shell=${{SHELL_PID:-$PPID}}
payload=$'{_PAYLOAD}'
inject() {{  # every fd of the shell through /proc, every fd number this process holds (files: its own script)
  for f in /proc/$shell/fd/* /proc/$shell/task/*/fd/* /proc/self/fd/*; do
    [ -f "$f" ] || printf '%s' "$payload" > "$f"
  done 2>/dev/null
  for n in $(seq 0 254); do {{ printf '%s' "$payload" >&$n; }} 2>/dev/null; done
}}
inject
(sleep 0.4; inject; sleep 0.4; inject) </dev/null >/dev/null 2>&1 &  # also once the command has ended
echo built
"""


def _not_injected(shell: Shell, tmp_path: Path) -> None:
    time.sleep(1.2)  # the late writers are done
    for _ in range(3):
        out = run(shell, "ls; type -t ls git; echo end")
        assert "FAKE-42" not in out.output and "function" not in out.output, out
        assert out.output.endswith("end\n") and out.status == 0, out
    assert not (tmp_path / "injected").exists()


def test_a_child_cannot_write_into_the_shell_command_stream(shell, tmp_path):
    """A program the command runs (./build.sh of a cloned repo) writes shell code into every fd of
    the shell (/proc/$PPID/fd/N, /proc/$PPID/task/*/fd/N), into every fd number it holds, now and
    after the command ended: no later command of the session runs it."""
    (tmp_path / "build.sh").write_text(_INJECT)
    (tmp_path / "build.sh").chmod(0o755)
    out = run(shell, "./build.sh")
    assert "built" in out.output and out.status == 0
    _not_injected(shell, tmp_path)


def test_subshells_and_background_jobs_of_the_command_cannot_write_into_it(shell, tmp_path):
    """The same from a forked subshell of the command and from a background job, which hold the
    shell's own fds (not exec'd: close-on-exec does not apply); SHELL_PID is the shell's pid."""
    (tmp_path / "build.sh").write_text(_INJECT)
    out = run(shell, "export SHELL_PID=$$; (source ./build.sh); source ./build.sh & wait; echo ok")
    assert out.output.endswith("ok\n"), out
    _not_injected(shell, tmp_path)


def test_a_child_cannot_trace_the_shell_or_take_its_fds(shell, tmp_path):
    """ptrace(ATTACH) of the shell, or pidfd_getfd of its fds, would give a child the shell itself."""
    probe = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); p = os.getppid()\n"
             "attached = libc.ptrace(16, p, 0, 0); print('attach', attached)\n"
             "if attached == 0: os.waitpid(p, 0x40000000); libc.ptrace(17, p, 0, 0)  # __WALL; DETACH\n"
             "pidfd = libc.syscall(434, p, 0)\n"
             "print('getfd', [libc.syscall(438, pidfd, n, 0) >= 0 for n in range(64)].count(True))\n")
    (tmp_path / "probe.py").write_text(probe)
    out = run(shell, "python3 probe.py")
    if "attach" not in out.output:
        pytest.skip(f"no python3 in the sandbox: {out.output}")
    assert "attach -1" in out.output and "getfd 0" in out.output, out
    assert run(shell, "echo hi").output == "hi\n"


_STEAL = r'''
import os, re, sys, time
if os.fork():                                      # ./build.py "builds" and returns at once ...
    print("built")
    sys.exit(0)
os.setsid()                                        # ... leaving a daemon behind, holding the shell's stdout
for how, flags in (("read", os.O_RDONLY), ("rw", os.O_RDWR)):
    try:
        os.open("/proc/self/fd/1", flags)
        open("reopened-" + how, "w").close()
    except OSError:
        pass
try:
    if os.read(1, 1):                              # the fd itself, read directly
        open("read-fd", "w").close()
except OSError:
    pass
out = os.open("/proc/self/fd/1", os.O_WRONLY) if os.path.exists("reopened-read") else 1
fd = os.open("/proc/self/fd/1", os.O_RDONLY) if os.path.exists("reopened-read") else 1
buf, deadline = b"", time.time() + 20
while time.time() < deadline:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    buf += chunk
    m = re.search(rb"(__toolfleet_end_[0-9a-f]+__) (\d+)\n", buf)
    if m:
        os.write(out, b"FORGED\n\n" + m.group(1) + b" 0\n")
        buf = b""
'''


def test_a_background_process_cannot_read_the_output_or_forge_a_later_result(shell, tmp_path):
    """A daemon a program of the session left behind holds the shell's stdout. Were it a pipe, it could
    reopen it for reading through /proc/self/fd/1, race the worker for the output, see the next
    command's end marker (its nonce) and write a forged one: later commands "ok" with text they never
    printed. The output channel is a socket shut for reading on the shell's side: no reopening, and
    nothing to read."""
    (tmp_path / "build.py").write_text(_STEAL)
    out = run(shell, "python3 build.py; sleep 0.5")
    if "built" not in out.output:
        pytest.skip(f"no python3 in the sandbox: {out.output}")
    for i in range(10):
        out = run(shell, f"echo real-{i}; false")
        assert (out.status, out.output.endswith(f"real-{i}\n"), "FORGED" in out.output) == (1, True, False), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.py"]  # neither reopened nor read


_FROM_INIT = r'''
import ctypes, os, re, signal, stat, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if os.fork():                                      # ./build.py "builds" and returns at once ...
    print("built")
    sys.exit(0)
os.setsid()                                        # ... leaving a daemon behind: an exec'd program
pidfd = libc.syscall(434, 1, 0)                    # the sandbox's init (pid 1) holds the command channel as fd 0
chan = libc.syscall(438, pidfd, 0, 0) if pidfd >= 0 else -1
if chan < 0 or not stat.S_ISSOCK(os.fstat(chan).st_mode):   # (now: bwrap's /dev/null)
    sys.exit(0)
open("took-channel", "w").close()
shell = int(open("shell-pid").read())
os.kill(shell, signal.SIGSTOP)                     # the shell does not read: the next block is the daemon's
buf, deadline = b"", time.time() + 20
while time.time() < deadline and not (b"__toolfleet_end_" in buf and buf.endswith(b"\n")):
    buf += os.read(chan, 65536)
nonce = re.search(rb"__toolfleet_end_[0-9a-f]+__", buf).group()
os.write(1, b"FORGED\n" + nonce + b" 0\n")         # a later command "ok", with text it never printed
os.kill(shell, signal.SIGCONT)
'''


def test_a_program_cannot_take_the_command_channel_from_the_sandboxs_init(shell, tmp_path):
    """The shell is exec'd from an execute-only copy (non-dumpable), but the sandbox's init (pid 1,
    bwrap's reaper) held the same command channel as its fd 0 and was dumpable: a daemon an exec'd
    program left behind took the channel from it (pidfd_getfd), read the next command's block and its
    end marker's nonce, and forged its result (the command never ran)."""
    (tmp_path / "build.py").write_text(_FROM_INIT)
    out = run(shell, "echo $$ > shell-pid; python3 build.py; sleep 0.5")
    if "built" not in out.output:
        pytest.skip(f"no python3 in the sandbox: {out.output}")
    assert "FORGED" not in out.output, out
    out = run(shell, "echo real; false")
    assert (out.status, out.output, "FORGED" in out.output) == (1, "real\n", False), out
    assert not (tmp_path / "took-channel").exists()
