"""run_command's OS sandbox (docs/sandbox.md), through real workers: writes outside the workspace
fail, no process outlives its call (ok, timeout, cancel), network none, the environment an
allow-list, a private /tmp; a worker that cannot create the sandbox does not serve run_command and
never runs a command unsandboxed unless the operator said ``sandbox = "none"``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from toolfleet import ErrorCode
from toolfleet.keys import Keys
from toolfleet.tools import sandbox
from toolfleet.tools.command import run_command
from toolfleet.tools.context import ToolContext

from .conftest import READY_TIMEOUT_S, ROOT, TEST_TOOLS
from .faults import call, wait_started
from .leftovers import marker, processes_with, wait_gone

SECRET = "sk-proj-SANDBOXTESTSECRET0123456789"


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the workspace and outside /tmp (so the sandbox sees it, read-only), with
    a file to overwrite or delete."""
    path = Path(tempfile.mkdtemp(prefix="toolfleet-outside-", dir="/var/tmp"))
    (path / "keep.txt").write_text("original\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(dispatcher, workspace: Path, command: str, **extra):
    return dispatcher.run([call("c", "run_command", command=command, **extra)], workspace=str(workspace),
                          timeout_s=60)[0]


ATTEMPTS = [
    "echo x > {OUT}/keep.txt",
    "rm -f {OUT}/keep.txt",
    "touch {OUT}/new.txt",
    "echo x > /tmp/../{OUT}/new.txt",
    "ln -s {OUT} link && echo x > link/new.txt",
    "ln {OUT}/keep.txt hard && echo x >> hard",
    "mount -o remount,rw / && touch {OUT}/new.txt",
    "unshare -Urm sh -c 'mount -o remount,rw / && touch {OUT}/new.txt'",
    "touch /etc/toolfleet-sandbox-probe",
    "python3 -c \"open('{OUT}/new.txt', 'w')\"",
    # kernel settings: a root worker's sandbox user is host uid 0, and /proc/sys files are writable by
    # their owner's mode bits alone (each writes the value already there: harmless if it failed open)
    "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern",
    "sysctl -q -w kernel.core_uses_pid=$(cat /proc/sys/kernel/core_uses_pid)",
    "test -w /proc/sysrq-trigger",
]


def test_writes_outside_the_workspace_fail(dispatcher, worker, workspace, outside):
    calls = [call(f"c{i}", "run_command", command=a.replace("{OUT}", str(outside))) for i, a in enumerate(ATTEMPTS)]
    results = dispatcher.run(calls, workspace=str(workspace), timeout_s=60)
    for attempt, result in zip(ATTEMPTS, results, strict=True):
        assert not result.ok, (attempt, result.content)
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "original\n"
    assert not Path("/etc/toolfleet-sandbox-probe").exists()


def test_workspace_is_writable_and_tmp_is_private(dispatcher, worker, workspace):
    name = f"toolfleet-private-{marker()}"
    Path("/tmp", name + ".host").write_text("host\n")
    try:
        result = run(dispatcher, workspace, f"echo made > made.txt && echo inside > /tmp/{name} && cat /tmp/{name} "
                                            f"&& echo beside > ../{name} && test ! -e /tmp/{name}.host && echo private")
        assert result.ok, result.content
        assert (workspace / "made.txt").read_text() == "made\n"
        assert not (workspace.parent / name).exists()  # beside the workspace (under /tmp) is the private /tmp
        assert "inside\n" in result.content and result.content.strip().endswith("private")
        assert not Path("/tmp", name).exists()
    finally:
        Path("/tmp", name + ".host").unlink()


def test_background_process_ends_with_a_call_that_succeeds(dispatcher, worker, workspace):
    seconds = marker()
    result = run(dispatcher, workspace, f"sleep {seconds} & echo started")
    assert result.ok and result.content == "started\n"
    assert processes_with(seconds) == []


def test_background_process_ends_with_a_call_that_times_out(dispatcher, worker, workspace):
    seconds = marker()
    result = run(dispatcher, workspace, f"sleep {seconds} & setsid sleep {seconds} & echo started; sleep 30",
                 timeout_s=1)
    assert result.code is ErrorCode.TIMEOUT and "started" in result.content
    assert processes_with(seconds) == []


def test_background_process_ends_with_a_cancelled_call(dispatcher, worker, workspace):
    seconds = marker()
    command = f"trap '' TERM; nohup sleep {seconds} >/dev/null 2>&1 & echo started; sleep 30"
    turn = dispatcher.submit([call("c", "run_command", command=command)], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c")
    assert not turn.wait(1.0)  # running
    turn.cancel()
    [result] = turn.results(timeout_s=10)
    assert result.code is ErrorCode.CANCELLED and "started" in result.content
    assert processes_with(seconds) == []


def test_network_none_blocks_the_host_redis(dispatcher, worker, workspace):
    result = run(dispatcher, workspace, "exec 3<>/dev/tcp/127.0.0.1/6379 && echo connected")
    assert not result.ok and "Connection refused" in result.content, result.content


def test_network_host_reaches_the_host_redis(start_worker, dispatcher, workspace):
    start_worker(args=["--network", "host"])
    result = run(dispatcher, workspace, "exec 3<>/dev/tcp/127.0.0.1/6379 && printf 'PING\\r\\n' >&3 && head -c 5 <&3")
    assert result.ok and "+PONG" in result.content, result.content


def test_environment_is_an_allow_list(start_worker, dispatcher, workspace, monkeypatch):
    monkeypatch.setenv("TOOLFLEET_TEST_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    start_worker()
    result = run(dispatcher, workspace, "env; cat /proc/1/environ; cat /proc/self/environ; echo end")
    assert result.ok, result.content
    assert SECRET not in result.content and "TOOLFLEET_TEST_SECRET" not in result.content
    assert "PATH=" in result.content


def _tools_json(settings) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "toolfleet", "tools", "--json", "--redis-url", settings.redis_url,
                           "--namespace", settings.namespace], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _start_logged_worker(settings, tmp_path: Path, env: dict[str, str], args: list[str] = ()) -> tuple:
    """A worker whose stderr goes to a file (to read its start-up message); joined on its ready signal."""
    log = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url, "--namespace",
            settings.namespace, "--concurrency", "1", "--tools", TEST_TOOLS,
            "--hostname", f"logged@{settings.namespace}", "--loglevel", "WARNING", *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=str(ROOT), **env), cwd=ROOT, stderr=out,
                                stdout=out, start_new_session=True)
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=READY_TIMEOUT_S + 5)
    reply = client.blpop([Keys(settings.namespace).workers_ready], timeout=READY_TIMEOUT_S)
    if reply is None:
        proc.kill()
        raise RuntimeError(f"worker did not start: {log.read_text()}")
    return proc, log


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("bwrap", ["/nonexistent/bwrap", "/bin/false"])
def test_worker_without_a_sandbox_does_not_serve_run_command(settings, dispatcher, workspace, tmp_path, bwrap):
    proc, log = _start_logged_worker(settings, tmp_path, {"TOOLFLEET_BWRAP": bwrap})
    try:
        text = log.read_text()
        assert "run_command is NOT served by this worker" in text and "bubblewrap" in text, text
        [entry] = _tools_json(settings)
        assert "run_command" not in {t["name"] for t in entry["tools"]}
        assert "read_file" in {t["name"] for t in entry["tools"]}
        assert entry["sandbox"]["mode"] == "bwrap" and bwrap in entry["sandbox"]["error"]
        result = run(dispatcher, workspace, "touch ran-unsandboxed")
        assert result.code is ErrorCode.TOOL_UNAVAILABLE, result
        assert not (workspace / "ran-unsandboxed").exists()
    finally:
        _stop(proc)


def test_handler_refuses_when_the_sandbox_cannot_be_created(workspace):
    """Even a process that reaches the handler (no start-up check) never runs the command unsandboxed."""
    previous = sandbox.current()
    try:
        assert sandbox.configure(sandbox.SandboxConfig(bwrap="/bin/false")).error
        ctx = ToolContext(call_id="c", turn_id="t", tool_name="run_command", workspace=workspace,
                          deadline=time.monotonic() + 10)
        with pytest.raises(Exception) as info:
            run_command(ctx=ctx, command="touch ran-unsandboxed")
        assert getattr(info.value, "code", None) == "TOOL_UNAVAILABLE"
        assert "sandbox cannot be created" in str(info.value)
        assert not (workspace / "ran-unsandboxed").exists()
    finally:
        sandbox.configure(previous.config)


def test_sandbox_none_is_explicit_and_shown(settings, dispatcher, workspace, tmp_path):
    proc, log = _start_logged_worker(settings, tmp_path, {}, ["--sandbox", "none"])
    try:
        assert 'sandbox = "none"' in log.read_text()
        [entry] = _tools_json(settings)
        assert entry["sandbox"]["mode"] == "none" and "run_command" in {t["name"] for t in entry["tools"]}
        table = subprocess.run([sys.executable, "-m", "toolfleet", "tools", "--redis-url", settings.redis_url,
                                "--namespace", settings.namespace], cwd=ROOT, capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200"), timeout=60)
        assert "UNSANDBOXED" in table.stdout, table.stdout
        seconds = marker()
        result = run(dispatcher, workspace, f"sleep {seconds} & echo started")
        assert result.ok and result.content.splitlines() == [sandbox.UNSANDBOXED_NOTE, "started"]
        assert wait_gone(seconds) == []  # its process group is killed (SIGKILL) when it ends
    finally:
        _stop(proc)


def test_sandbox_setting_from_the_environment(settings, tmp_path):
    from toolfleet.settings import Settings

    chosen = Settings.from_env({"TOOLFLEET_SANDBOX": "none", "TOOLFLEET_SANDBOX_NETWORK": "host",
                                "TOOLFLEET_BWRAP": "/opt/bwrap"})
    assert (chosen.sandbox, chosen.sandbox_network, chosen.bwrap_path) == ("none", "host", "/opt/bwrap")
    assert Settings().sandbox == "bwrap" and Settings().sandbox_network == "none"


@pytest.mark.parametrize("option", [["--sandbox", "maybe"], ["--network", "bridge"]])
def test_worker_refuses_an_unknown_sandbox_setting(settings, option):
    proc = subprocess.run([sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url,
                           "--namespace", settings.namespace, *option], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert proc.returncode == 1 and "invalid setting" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_sandboxs_own_deadline_counts_the_time_its_fence_check_took(workspace, monkeypatch):
    """run_command's sandbox runs under ``timeout -s KILL`` set to end it SELF_KILL_AFTER_S past the
    call's time limit (what holds when the worker is frozen). The fence check right before the
    sandbox starts is a Redis round trip, retried while Redis does not answer: the deadline was
    read before it, so a check that took 1.2 s gave the sandbox 1.2 s more than its bound past the
    call's limit (a frozen worker's command then acted after the turn's locks were let go)."""
    from toolfleet.tools import command

    if sandbox.current().unsandboxed:
        pytest.skip("no sandbox here")
    started: list[tuple[float, list[str]]] = []
    real_popen = subprocess.Popen

    def popen(argv, *args, **kwargs):
        started.append((time.monotonic(), list(argv)))
        return real_popen(argv, *args, **kwargs)

    def slow_check() -> str | None:  # Redis answered late: this execution still holds its call
        time.sleep(1.2)
        return None

    monkeypatch.setattr(command.subprocess, "Popen", popen)
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="run_command", workspace=workspace,
                      deadline=time.monotonic() + 5, fence_check=slow_check)
    assert run_command(ctx=ctx, command="true") == ""
    [(at, argv)] = started
    assert argv[:3] == [sandbox.deadline_binary(), "-s", "KILL"], argv
    ends_at = at + float(argv[3])
    assert ends_at <= ctx.deadline + command.SELF_KILL_AFTER_S + 0.05, ends_at - ctx.deadline
