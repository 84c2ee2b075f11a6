"""The sandbox leases (``toolfleet/worker/sandbox_lease.py``), run as the worker runs them. A live
session's shell watchdog (``python -I -S sandbox_lease.py LEASE PID -- COMMAND``), around a plain
command in place of ``bwrap``: it ends the command when the lease lapses or its file is gone, passes
a renewed lease and the command's own exit through, and dies with its parent. The worker's reaper
(``--reap``): it kills the registered process groups once the lease lapses, never a pid whose start
time is not the registered one, and ends with its worker. The workers' side is
``tests/test_frozen_live_holder.py`` and ``tests/test_frozen_worker_sandbox.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.worker.sandbox_lease import LAPSE_SIGNAL, LeaseFile, read_deadline, script_argv, start_time

from .leftovers import processes_with, wait_gone

WAIT_S = 10.0


def _start(lease: LeaseFile, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(lease.wrap(list(argv)), start_new_session=True)


def _tag() -> str:
    return f"30.{uuid.uuid4().int % 10**9:09d}"  # `sleep <tag>`: its command line names it


def test_a_lease_not_renewed_ends_the_command_and_says_so(tmp_path: Path):
    lease, tag = LeaseFile(str(tmp_path / "lease")), _tag()
    lease.renew(time.monotonic() + 0.5)
    proc = _start(lease, "sleep", tag)
    assert proc.wait(timeout=WAIT_S) == -LAPSE_SIGNAL
    assert not wait_gone(tag)


def test_a_renewed_lease_keeps_the_command_and_its_exit_status_passes_through(tmp_path: Path):
    lease = LeaseFile(str(tmp_path / "lease"))
    lease.renew(time.monotonic() + 0.3)
    proc = _start(lease, "sh", "-c", "sleep 1.2; exit 3")
    while proc.poll() is None:  # renewed four times past its first deadline
        lease.renew(time.monotonic() + 0.3)
        time.sleep(0.1)
    assert proc.returncode == 3


def test_a_command_ended_by_a_signal_ends_the_watchdog_by_it(tmp_path: Path):
    lease = LeaseFile(str(tmp_path / "lease"))
    lease.renew(time.monotonic() + WAIT_S)
    assert _start(lease, "sh", "-c", "kill -TERM $$").wait(timeout=WAIT_S) == -signal.SIGTERM


def test_a_lease_file_gone_ends_the_command_at_once(tmp_path: Path):
    lease, tag = LeaseFile(str(tmp_path / "lease")), _tag()
    started = time.monotonic()
    proc = _start(lease, "sleep", tag)  # never written
    assert proc.wait(timeout=WAIT_S) == -LAPSE_SIGNAL
    assert time.monotonic() - started < WAIT_S / 2
    assert not wait_gone(tag)


def test_the_watchdog_dies_with_the_worker(tmp_path: Path):
    """The worker SIGKILLed: the watchdog gets PR_SET_PDEATHSIG (and bwrap, its child, ends with it
    by its own ``--die-with-parent``, which a plain command here has not: it is killed by the test)."""
    lease, tag = LeaseFile(str(tmp_path / "lease")), _tag()
    lease.renew(time.monotonic() + 3600)
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from toolfleet.worker.sandbox_lease import LeaseFile\n"
        f"subprocess.Popen(LeaseFile({lease.path!r}).wrap(['sleep', {tag!r}]), start_new_session=True)\n"
        "print('started', flush=True)\n"
        "time.sleep(3600)\n")], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"started\n"
        deadline = time.monotonic() + WAIT_S
        while not processes_with(f"sleep {tag}") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes_with(lease.path), "the watchdog runs"
        parent.kill()
        parent.wait()
        assert not wait_gone(lease.path, WAIT_S), "the watchdog outlived its worker"
    finally:
        for pid, _ in processes_with(f"sleep {tag}"):
            os.kill(pid, signal.SIGKILL)


@given(st.binary(max_size=64))
def test_a_lease_file_of_any_bytes_reads_as_a_time_or_as_lapsed(data: bytes):
    path = f"/tmp/toolfleet-test-lease-{os.getpid()}"
    try:
        with open(path, "wb") as f:
            f.write(data)
        deadline = read_deadline(path)
        assert deadline is None or isinstance(deadline, float)
    finally:
        os.remove(path)


def _reaper(lease: LeaseFile, registry: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(script_argv("--reap", lease.path, str(registry), str(os.getpid())), start_new_session=True)


def _group(tag: str) -> subprocess.Popen[bytes]:
    """A stand-in for a command's sandbox: a group led by a shell, a sleep in it."""
    return subprocess.Popen(["sh", "-c", f"sleep {tag}; :"], start_new_session=True)


def test_the_reaper_kills_the_registered_groups_once_the_lease_lapses_and_no_other(tmp_path: Path):
    lease, registry = LeaseFile(str(tmp_path / "lease")), tmp_path / "running"
    registry.mkdir()
    lease.renew(time.monotonic() + 0.5)
    mine, stale, unregistered = _group(_tag()), _group(_tag()), _group(_tag())
    (registry / f"{mine.pid}-{start_time(mine.pid)}").touch()
    (registry / f"{stale.pid}-1").touch()  # the pid of an entry now names another process: never killed
    reaper, left = _reaper(lease, registry), [stale, unregistered]
    try:
        assert mine.wait(timeout=WAIT_S) == -signal.SIGKILL
        assert stale.poll() is None and unregistered.poll() is None
        lease.renew(time.monotonic() + 3600)  # renewed: a group registered now is left alone
        again = _group(_tag())
        left.append(again)
        (registry / f"{again.pid}-{start_time(again.pid)}").touch()
        time.sleep(0.3)  # several of the reaper's lapsed-lease rounds (50 ms)
        assert again.poll() is None
    finally:
        for proc in left:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reaper.kill()
        reaper.wait()


def test_the_reaper_ends_with_its_worker(tmp_path: Path):
    lease, registry = LeaseFile(str(tmp_path / "lease")), tmp_path / "running"
    registry.mkdir()
    lease.renew(time.monotonic() + 3600)
    parent = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys\n"
        "from toolfleet.worker.sandbox_lease import script_argv\n"
        f"subprocess.Popen(script_argv('--reap', {lease.path!r}, {str(registry)!r}, str(os.getpid())), "
        "start_new_session=True)\n"
        "print('started', flush=True)\n"
        "import time; time.sleep(3600)\n")], stdout=subprocess.PIPE)
    assert parent.stdout is not None and parent.stdout.readline() == b"started\n"
    deadline = time.monotonic() + WAIT_S
    while not processes_with(str(registry)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert processes_with(str(registry)), "the reaper runs"
    parent.kill()
    parent.wait()
    assert not wait_gone(str(registry), WAIT_S), "the reaper outlived its worker"


def test_a_shell_its_lease_ended_is_never_restarted_quietly(tmp_path: Path):
    """A shell the lease ended is a lost session: ``Shell.run`` raises :class:`LeaseLapsed` where it
    would have started a new shell (a breaker's suspicion: a lapse between the host's check and the
    run gave the caller a "new shell" note, not SESSION_LOST)."""
    from toolfleet.worker.live_shell import LeaseLapsed, Shell

    from .test_live_shell import SPAWNER

    workspace = tmp_path / "ws"
    workspace.mkdir()
    lease = LeaseFile(str(tmp_path / "lease"))
    lease.renew(time.monotonic() + 2.0)  # never renewed: it lapses 2 s from now
    shell = Shell(workspace, SPAWNER, lease)
    try:
        assert shell.run("echo hi", time.monotonic() + WAIT_S, threading.Event()).output.strip() == "hi"
        assert shell.proc is not None
        assert shell.proc.wait(timeout=WAIT_S) == -LAPSE_SIGNAL
        assert shell.lease_lapsed
        with pytest.raises(LeaseLapsed) as lapsed:
            shell.run("echo again", time.monotonic() + WAIT_S, threading.Event())
        assert lapsed.value.ran is False
    finally:
        shell.close()
