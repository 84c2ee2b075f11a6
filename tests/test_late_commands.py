"""Gray failure inside ``run_command`` (guarantees F3, F7): its pool process frozen after the
handler started and before the command's sandbox starts (a GC pause, a VM stall), the whole worker
frozen with it, resumed after its caller was told ``WORKER_LOST`` / ``OUTCOME_UNKNOWN``. The
command used to run then, on the thaw: ``run_command`` is a built-in write that never called
``ctx.check_fence()`` before its effect (the docs say the built-in writes do), so nothing refused
the stale execution, and its write landed after the answer (with a freeze past the call's
deadline, after the turn's locks were let go, and within the 0.5 s the sandbox's own deadline
leaves a command started past it). It is now fenced right before the sandbox starts; a hosted
MCP server's write likewise, right before the call goes to the server."""

from __future__ import annotations

import pytest

from toolfleet import Dispatcher, ErrorCode
from toolfleet.tools.registry import default_registry

from .faults import call, freeze, pool_stopped_at, stopped, thaw, wait_until
from .fencing_trials import fencing_settings

MODULES = ["tests.tools_for_late_commands"]


@pytest.fixture
def settings(settings):
    return fencing_settings(settings)  # heartbeat 0.3 s (liveness bound 2.2 s)


def _command_held(dispatcher, worker, workspace, tmp_path, where: str, **arguments):
    """A run_command call whose pool process stopped itself right before its fence check
    (tests/tools_for_late_commands.py): its turn and that process's pid."""
    turn = dispatcher.submit([call("c", "run_command", command="echo late >> late.txt", **arguments)],
                             workspace=str(workspace))
    return turn, pool_stopped_at(worker, tmp_path / "starting-c", where)


def test_a_command_never_starts_after_its_caller_was_told_its_worker_was_lost(settings, start_worker, workspace,
                                                                              tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_CMD_DIR", str(tmp_path))
    worker = start_worker(tools=MODULES[0], concurrency=1)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn, _ = _command_held(dispatcher, worker, workspace, tmp_path, "before the sandbox starts")
        freeze(worker)  # the main process too: its heartbeats stop
        try:
            [answer] = turn.results(timeout_s=30)  # at the liveness bound: no other worker serves it
        finally:
            thaw(worker)
        # the pool takes the next message only once the frozen execution ended: join on it
        [after] = dispatcher.run([call("e", "late_cmd_echo", text="after")], timeout_s=30)
    assert answer.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), answer
    assert after.ok, after
    assert not (workspace / "late.txt").exists(), "the command ran after its caller was told its worker was lost"


def test_a_hosted_mcp_write_never_reaches_its_server_after_its_caller_was_told_its_worker_was_lost(
        settings, start_worker, tmp_path, monkeypatch):
    """The same for a write of an MCP server the worker hosts (``--mcp``): the call went to the
    server on the thaw, which appended its line after the caller's answer."""
    pytest.importorskip("mcp")
    from toolfleet.integrations.mcp_host import with_live_tools

    from .test_mcp_host import call as mcp_call
    from .test_mcp_host import marker, tiny

    monkeypatch.setenv("TOOLFLEET_TEST_LATE_CMD_DIR", str(tmp_path))
    worker = start_worker(tools=MODULES[0], concurrency=1, args=["--mcp", tiny(marker())])
    target = tmp_path / "notes.txt"
    with Dispatcher(settings, with_live_tools(default_registry(MODULES), settings)) as dispatcher:
        turn = dispatcher.submit([mcp_call("n", "tiny__note", path=str(target), text="late")])
        wait_until((tmp_path / "starting-mcp-tiny").exists, 60, "the MCP call's handler to start")
        wait_until(lambda: any(stopped(pid) for pid in worker.children()), 10,
                   "the pool process stopped before the call")
        freeze(worker)
        try:
            [answer] = turn.results(timeout_s=30)
        finally:
            thaw(worker)
        [after] = dispatcher.run([call("e", "late_cmd_echo", text="after")], timeout_s=60)
    assert answer.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), answer
    assert after.ok, after
    assert not target.exists(), "the MCP server wrote after its caller was told its worker was lost"


def test_a_command_whose_fence_redis_could_not_confirm_says_it_did_not_run(private_redis, namespace, start_worker,
                                                                           tmp_path, workspace, monkeypatch):
    """run_command's fence check, right before its sandbox starts, finds the ledger's Redis gone
    past the worker's retries (30 s): the command is not started (fail closed). That answer is the
    call's (the execution still held it), and nothing of the command ran: it says so,
    ``NOT_EXECUTED``, as a slow claim's refused recheck does. It was ``OUTCOME_UNKNOWN`` "the call
    may have done part of its work before that step; check the real state", for a command that
    never started."""
    import os
    import signal

    from toolfleet import Settings

    from .conftest import FLEET_KEY

    monkeypatch.setenv("TOOLFLEET_TEST_LATE_CMD_DIR", str(tmp_path))
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=5.0, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, tools=MODULES[0], concurrency=1, log_path=tmp_path / "worker.log")
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn, pid = _command_held(dispatcher, worker, workspace, tmp_path, "before its fence check", timeout_s=120)
        ledger_server.kill()
        try:
            os.kill(pid, signal.SIGCONT)  # the check now finds no Redis
            wait_until(lambda: "could not confirm the fencing token" in worker.log_text(), 60, "the start refused")
        finally:
            ledger_server.start()
        [answer] = turn.results(timeout_s=60)
    assert not (workspace / "late.txt").exists(), "the command ran"
    assert answer.code is ErrorCode.NOT_EXECUTED, answer
    assert "could not be reached" in answer.content and "not started" in answer.content, answer
    assert "part of its work" not in answer.error.hint, answer


def test_a_hosted_mcp_write_whose_fence_redis_could_not_confirm_says_it_did_not_run(
        private_redis, namespace, start_worker, tmp_path, monkeypatch):
    """The same for a hosted MCP server's write: its fence check, right before the call goes to
    the server, finds the ledger's Redis gone past the worker's retries; the server is sent nothing,
    and the answer says so (``NOT_EXECUTED``; it was ``OUTCOME_UNKNOWN``, "may have done part of its
    work")."""
    pytest.importorskip("mcp")
    import os
    import signal

    from toolfleet import Settings
    from toolfleet.integrations.mcp_host import with_live_tools

    from .conftest import FLEET_KEY
    from .test_mcp_host import call as mcp_call
    from .test_mcp_host import marker, tiny

    monkeypatch.setenv("TOOLFLEET_TEST_LATE_CMD_DIR", str(tmp_path))
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=5.0, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, tools=MODULES[0], concurrency=1, args=["--mcp", tiny(marker())],
                          log_path=tmp_path / "worker.log")
    target = tmp_path / "notes.txt"
    with Dispatcher(settings, with_live_tools(default_registry(MODULES), settings)) as dispatcher:
        turn = dispatcher.submit([mcp_call("n", "tiny__note", path=str(target), text="late")])
        wait_until((tmp_path / "starting-mcp-tiny").exists, 60, "the MCP call's handler to start")
        wait_until(lambda: any(stopped(pid) for pid in worker.children()), 10, "the pool process stopped")
        [pid] = [pid for pid in worker.children() if stopped(pid)]
        ledger_server.kill()
        try:
            os.kill(pid, signal.SIGCONT)  # the check now finds no Redis
            wait_until(lambda: "could not confirm the fencing token" in worker.log_text(), 60, "the call refused")
        finally:
            ledger_server.start()
        [answer] = turn.results(timeout_s=60)
    assert not target.exists(), "the MCP server wrote"
    assert answer.code is ErrorCode.NOT_EXECUTED, answer
    assert "could not be reached" in answer.content and "not started" in answer.content, answer


def test_a_command_whose_turn_was_cancelled_before_its_start_says_it_did_not_run(settings, start_worker, workspace,
                                                                                 tmp_path, monkeypatch):
    """The turn cancelled while run_command's pool process stood right before its fence check: the
    check refuses the start and the answer is ``CANCELLED``. It said "it was stopped", hint "the
    call may have done part of its work; check before repeating it", for a command that never
    started; it says it did not run, as a cancelled slow claim's recheck does."""
    import os
    import signal

    monkeypatch.setenv("TOOLFLEET_TEST_LATE_CMD_DIR", str(tmp_path))
    worker = start_worker(tools=MODULES[0], concurrency=1)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn, pid = _command_held(dispatcher, worker, workspace, tmp_path, "before its fence check")
        dispatcher.cancel(turn.turn_id, "the user changed their mind")
        os.kill(pid, signal.SIGCONT)
        [answer] = turn.results(timeout_s=30)
    assert not (workspace / "late.txt").exists(), "the command ran"
    assert answer.code is ErrorCode.CANCELLED, answer
    assert "did not run" in answer.content and "stopped" not in answer.content, answer
    assert "part of its work" not in answer.error.hint, answer
