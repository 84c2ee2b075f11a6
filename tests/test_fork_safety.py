"""A pool process forked while another thread of the worker's main process holds a lock must not
inherit that lock held (toolfleet/forksafe.py). The CI failure that found it: in
tests/test_slow_fencing.py a call ended ``TIMEOUT`` "ran past its hard time limit" without ever
starting. Its pool process had been forked to replace one killed at its hard limit while the
steps thread, recording that kill, held ``Runtime._lock``; the new process's first call waited
on that lock until the hard limit killed it."""

from __future__ import annotations

import os
import threading

from toolfleet import Dispatcher, ErrorCode
from toolfleet.policy import commands
from toolfleet.stack import _free_port
from toolfleet.tools.registry import default_registry
from toolfleet.worker import redaction
from toolfleet.worker.main_steps import MainSteps
from toolfleet.worker.runtime import Runtime

from .conftest import make_registry
from .faults import call, kill_pid, wait_until

HAZARD_TOOLS = "tests.pool_hazard_tools"


def _hold(lock, release: threading.Event, taken: threading.Event) -> None:
    with lock:
        taken.set()
        release.wait(10)


def _fork_and_try(locks, then=lambda: None) -> int:
    """Fork while other threads hold ``locks``; the child takes each (2 s at most), runs ``then``
    and exits 0, or exits 1 on a lock it could not take. Returns the child's exit status."""
    release = threading.Event()
    for lock in locks:
        taken = threading.Event()
        threading.Thread(target=_hold, args=(lock, release, taken), daemon=True).start()
        assert taken.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists here
        code = 1
        try:
            if all(lock.acquire(timeout=2) for lock in locks):
                for lock in locks:
                    lock.release()
                then()
                code = 0
        finally:
            os._exit(code)
    release.set()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _first_and_replacement_run(worker, settings, workspace) -> None:
    """A call runs on the worker's first pool process, and another on the one forked to replace it
    once it is killed (the moment of the CI failure: a fork right after a death)."""
    with Dispatcher(settings, default_registry([HAZARD_TOOLS])) as dispatcher:
        first = dispatcher.run([call("a", "hello", who="first")], workspace=str(workspace), timeout_s=30)[0]
        assert first.ok, first.content
        (old,) = worker.children()
        kill_pid(old)
        wait_until(lambda: len(worker.children()) == 1 and worker.children()[0] != old, 10, "a new pool process")
        second = dispatcher.run([call("b", "hello", who="second")], workspace=str(workspace), timeout_s=30)[0]
        assert second.ok, second.content


def test_a_child_forked_while_threads_hold_the_worker_locks_gets_them_unlocked(settings) -> None:
    runtime = Runtime(settings, make_registry())
    runtime.ledger  # noqa: B018 - the main process's client exists, as in a worker that recorded a kill
    locks = [runtime._lock, runtime.watcher._lock, runtime.watcher.failures._lock, MainSteps()._lock,
             redaction._running_lock, redaction._install_lock, commands._BASHLEX_LOCK]
    assert _fork_and_try(locks, then=lambda: runtime.ledger.redis.ping()) == 0


def test_a_worker_whose_pool_forks_while_its_locks_are_held_runs_its_calls(settings, start_worker, workspace):
    """Every fork of this worker's pool happens while other threads of its main process hold the
    runtime's, the cancel watcher's and the log redaction's locks (tests/pool_hazard_tools.py):
    the first pool process's call, and the call of the process forked to replace a killed one,
    both run (before: each waited on an inherited lock until its hard limit, ``TIMEOUT``)."""
    worker = start_worker(concurrency=1, tools=HAZARD_TOOLS)
    _first_and_replacement_run(worker, settings, workspace)


def test_a_worker_with_metrics_whose_pool_forks_while_prometheus_locks_are_held_runs_its_calls(
        settings, start_worker, workspace, monkeypatch):
    """With ``--metrics-port`` the main process's catalog heartbeat and steps thread (the result of
    a killed call) write prometheus_client's multiprocess values under its one lock, and a pool
    process counts a call as running under it before its claim. Every fork of this worker's pool
    happens while other threads hold it and the results counter's lock: the calls run (before:
    the first waited on the inherited lock until its hard limit, ``NOT_EXECUTED``)."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    worker = start_worker(concurrency=1, tools=HAZARD_TOOLS, args=["--metrics-port", str(_free_port())])
    _first_and_replacement_run(worker, settings, workspace)


def test_a_call_killed_at_its_hard_limit_before_it_started_is_not_executed(settings, start_worker, workspace):
    """A pool process stuck before its claim (no soft limit reaches it) is killed at the call's
    hard limit: the call never started, so it is ``NOT_EXECUTED`` (nothing happened; safe to ask
    again), not ``TIMEOUT`` "ran past its hard time limit", whose hint says it may have done part
    of its work. A call that started and overran still ends ``TIMEOUT``
    (tests/test_main_process_liveness.py). The worker's next call runs."""
    start_worker(concurrency=1, tools=HAZARD_TOOLS)
    with Dispatcher(settings, default_registry([HAZARD_TOOLS])) as dispatcher:
        result = dispatcher.run([call("s", "stuck_write", label="x", stuck_s=6)], workspace=str(workspace),
                                timeout_s=30)[0]
        assert result.code is ErrorCode.NOT_EXECUTED, result.content
        assert "stuck before it could start the call" in result.content
        after = dispatcher.run([call("h", "hello", who="after")], workspace=str(workspace), timeout_s=30)[0]
        assert after.ok, after.content


def test_a_call_whose_soft_limit_lands_before_its_claim_is_not_executed(settings, start_worker, workspace):
    """A pool process held up before its claim (here: its journal key function) past the call's
    soft time limit: the call never started, so it is ``NOT_EXECUTED``, not ``TIMEOUT`` "ran past
    its time limit and was stopped" (attempts 0), which says it ran. The worker's next call runs."""
    start_worker(concurrency=1, tools=HAZARD_TOOLS)
    with Dispatcher(settings, default_registry([HAZARD_TOOLS])) as dispatcher:
        result = dispatcher.run([call("s", "slow_to_start_write", label="x", stuck_s=6)], workspace=str(workspace),
                                timeout_s=30)[0]
        assert result.code is ErrorCode.NOT_EXECUTED, result.content
        assert result.attempts == 0
        after = dispatcher.run([call("h", "hello", who="after")], workspace=str(workspace), timeout_s=30)[0]
        assert after.ok, after.content


def test_a_call_whose_pool_process_is_terminated_before_its_claim_is_not_executed(settings, start_worker,
                                                                                    workspace, tmp_path):
    """An operator's revoke with terminate (Flower's "Terminate", ``celery control revoke -t``)
    kills a pool process stuck before its claim: the call never started, so it is
    ``NOT_EXECUTED``, not ``CANCELLED`` "stopped when its turn was cancelled", whose hint says it may
    have done part of its work (its turn was not even cancelled). The worker's next call runs."""
    marker = tmp_path / "stuck"
    start_worker(concurrency=1, tools=HAZARD_TOOLS)
    with Dispatcher(settings, default_registry([HAZARD_TOOLS])) as dispatcher:
        turn = dispatcher.submit([call("s", "stuck_long_write", label="t", stuck_s=60, marker=str(marker))],
                                 workspace=str(workspace))
        wait_until(marker.exists, 30, "the pool process stuck before its claim")
        dispatcher.app.control.revoke(f"{turn.turn_id}:s", terminate=True, signal="SIGKILL")
        result = turn.results(timeout_s=30)[0]
        assert result.code is ErrorCode.NOT_EXECUTED, result.content
        assert "terminated" in result.content and result.attempts == 0  # the revoke's end, not the hard limit's
        after = dispatcher.run([call("h", "hello", who="after")], workspace=str(workspace), timeout_s=30)[0]
        assert after.ok, after.content


def test_a_soft_limit_in_a_journal_key_function_does_not_run_the_write_under_another_key(
        settings, start_worker, workspace, tmp_path):
    """A journaled write's key function (run before the claim) held up past the soft time limit:
    the limit's exception was taken for a broken key function and the call ran under the fallback
    key ``turn:call``, so the journal did not see the earlier write of the same key and it was done
    twice. Now the call is not run (``NOT_EXECUTED``) and the write is done once."""
    done = tmp_path / "writes"
    start_worker(concurrency=1, tools=HAZARD_TOOLS)
    with Dispatcher(settings, default_registry([HAZARD_TOOLS])) as dispatcher:
        first = dispatcher.run([call("w1", "keyed_write", label="k", stuck_s=0, path=str(done))],
                               workspace=str(workspace), timeout_s=30)[0]
        assert first.ok, first.content
        again = dispatcher.run([call("w2", "keyed_write", label="k", stuck_s=6, path=str(done))],
                               workspace=str(workspace), timeout_s=30)[0]
        assert done.read_text() == "k\n", "the write was done twice"
        assert again.code is ErrorCode.NOT_EXECUTED, again.content
