"""Gray failure between a claim and its handler (guarantee F7, docs/guarantees.md): a worker
frozen while its claim's reply is in flight, or right after reading it, resumes after its caller
was told ``WORKER_LOST``. The handler used to start then, on the thaw, and its write landed after
the answer (a frozen holder acting after its lease: "a step of a holder that lost its lease is
refused where the effect happens"). A claim that took longer than ``recheck_after_s`` to reach
the handler is now checked again first; a quick one costs nothing. Real prefork workers: the pool
process stops itself right after its claim (tests/tools_for_late_claims.py), the test freezes
the rest of the worker and thaws it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from toolfleet import Dispatcher, ErrorCode
from toolfleet.tools.registry import default_registry
from toolfleet.worker.side_effects import recheck_after_s

from .faults import call, freeze, thaw, wait_until
from .fencing_trials import fencing_settings

MODULES = ["tests.tools_for_late_claims"]


@pytest.fixture
def settings(settings):
    return fencing_settings(settings)  # heartbeat 0.3 s (liveness bound 2.2 s)


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state ``T`` in /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _stopped_after_claim(worker, folder: Path, call_id: str) -> int:
    wait_until((folder / f"claimed-{call_id}").exists, 30, "the call claimed")
    [pid] = worker.children()
    wait_until(lambda: _stopped(pid), 10, "the pool process stopped after its claim")
    return pid


def test_a_handler_never_starts_after_its_caller_was_told_worker_lost(settings, start_worker, tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_DIR", str(tmp_path))
    worker = start_worker(args=["--tools", MODULES[0]], concurrency=1)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn = dispatcher.submit([call("w", "late_write", label="late")])
        _stopped_after_claim(worker, tmp_path, "w")
        freeze(worker)  # the main process too: its heartbeats stop
        try:
            [answer] = turn.results(timeout_s=30)  # at the liveness bound
        finally:
            thaw(worker)
        # the pool takes the next message only once the frozen execution ended: join on it
        [after] = dispatcher.run([call("e", "late_echo", text="after")], timeout_s=30)
    assert answer.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), answer  # journaled or not
    assert after.ok, after
    assert not (tmp_path / "wrote-late").exists(), "the handler ran after its caller was told its worker was lost"


def test_a_slow_claim_whose_call_is_still_held_runs(settings, start_worker, tmp_path, monkeypatch):
    """The check after a slow claim refuses only an execution that lost its call."""
    monkeypatch.setenv("TOOLFLEET_TEST_LATE_DIR", str(tmp_path))
    worker = start_worker(args=["--tools", MODULES[0]], concurrency=1)
    with Dispatcher(settings, default_registry(MODULES)) as dispatcher:
        turn = dispatcher.submit([call("w", "late_write", label="held")])
        pid = _stopped_after_claim(worker, tmp_path, "w")  # stopped at least recheck_after_s (the wait above)
        os.kill(pid, signal.SIGCONT)  # the main process never stopped: the worker stayed alive
        [result] = turn.results(timeout_s=30)
    assert result.ok, result
    assert (tmp_path / "wrote-held").exists()


def test_the_recheck_comes_before_any_answer_without_the_worker(settings):
    """Under half of ``cancel_grace_s`` and of a heartbeat, and at most 0.25 s."""
    assert recheck_after_s(settings) == min(0.25, settings.cancel_grace_s / 2, settings.heartbeat_s / 2)
    quick = settings.model_copy(update={"cancel_grace_s": 0.1, "heartbeat_s": 2.0})
    assert recheck_after_s(quick) == 0.05
