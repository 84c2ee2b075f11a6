"""A cancel or a soft time limit that lands while the sandbox is starting (between bwrap's start
and the handler's wait loop) leaves no process behind: bwrap is stopped, and its sandbox goes with
it. Found by a helper with a bwrap slowed to 1.5 s: the cancel at 0.5 s left the sandbox's init
alive for good (the handler's stop ran only from its wait loop on)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from toolfleet import ToolContext
from toolfleet.errors import CallCancelled
from toolfleet.tools import command, sandbox
from toolfleet.tools.command import run_command

from .leftovers import marker, wait_gone


@pytest.fixture
def real_sandbox():
    previous = sandbox.current()
    state = sandbox.configure(sandbox.SandboxConfig())
    if state.error:
        pytest.skip(f"no sandbox here: {state.error}")
    yield
    sandbox.configure(previous.config)


def _ctx(workspace: Path) -> ToolContext:
    return ToolContext(call_id="c", turn_id="t", tool_name="run_command", workspace=workspace,
                       deadline=time.monotonic() + 60)


def test_an_interrupt_right_after_the_sandbox_started_leaves_nothing(real_sandbox, tmp_path, monkeypatch):
    seconds = marker()
    read = command._SandboxInit.read

    def read_then_interrupted(fd: int):
        read(fd)  # the sandbox's init is up and runs the command
        raise CallCancelled("cancelled while the sandbox started")

    monkeypatch.setattr(command._SandboxInit, "read", staticmethod(read_then_interrupted))
    with pytest.raises(CallCancelled):
        run_command(ctx=_ctx(tmp_path), command=f"sleep {seconds} & sleep {seconds}")
    assert wait_gone(seconds, timeout_s=5) == []


def test_an_interrupt_while_a_slow_bwrap_starts_leaves_nothing(tmp_path, monkeypatch):
    import shutil

    real = shutil.which("bwrap")
    if real is None:
        pytest.skip("no bwrap")
    slow = tmp_path / "slow-bwrap"
    slow.write_text(f'#!/bin/sh\nsleep 1.5\nexec {real} "$@"\n')
    slow.chmod(0o755)
    previous = sandbox.current()
    sandbox.install(sandbox.SandboxState(sandbox.SandboxConfig(bwrap=str(slow))))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    seconds = marker()

    def interrupt(*_):
        raise CallCancelled("cancelled while bwrap starts")

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(CallCancelled):
            run_command(ctx=_ctx(workspace), command=f"sleep {seconds}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sandbox.install(previous)
    # the wrapper (it would exec bwrap after its sleep) and all it started are gone
    assert wait_gone(str(slow), timeout_s=2) == [] and wait_gone(seconds, timeout_s=5) == []


def test_a_live_shell_interrupted_while_its_sandbox_starts_leaves_nothing(real_sandbox, tmp_path, monkeypatch):
    """The live shell (``shell`` tool) starts its sandbox the same way (a reviewer's find)."""
    import os
    import select

    from toolfleet.worker import live_shell

    read = command._SandboxInit.read
    inits: list[int | None] = []

    def read_then_interrupted(fd: int):
        inits.append(read(fd).pid)  # the sandbox's init is up, running the shell
        raise CallCancelled("cancelled while the shell's sandbox started")

    monkeypatch.setattr(live_shell._SandboxInit, "read", staticmethod(read_then_interrupted))
    with pytest.raises(CallCancelled):
        live_shell.Shell(tmp_path)
    assert inits and inits[0] is not None
    try:
        fd = os.pidfd_open(inits[0])
    except ProcessLookupError:
        return  # gone already
    try:  # join on the init's exit (its pidfd becomes readable), 5 s at most
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        gone = bool(poller.poll(5000))
        if not gone:
            os.kill(inits[0], 9)
        assert gone, "the shell's sandbox init outlived the interrupted start"
    finally:
        os.close(fd)


def test_a_sandbox_that_cannot_start_leaves_no_descriptor_open(real_sandbox, tmp_path, monkeypatch):
    """``Popen`` failing (an exec refused, no memory to fork, a cancel landing in it) leaves neither
    end of the pipe the sandbox's init reports on open (before: the read end stayed open for the
    pool process's life, one descriptor per failed start)."""
    import os
    import subprocess

    def refused(*_args, **_kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(subprocess, "Popen", refused)
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(OSError):
            run_command(ctx=_ctx(tmp_path), command="true")
    assert set(os.listdir("/proc/self/fd")) - before == set()
