"""Gray failure: a worker frozen (SIGSTOP of its process group, as tests/faults.freeze does) while
``run_command`` runs. The command's sandbox is not in the worker's process group (``bwrap
--new-session``, ``Popen(start_new_session=True)``), so the freeze does not stop it. It ran on, past
its time limit, its hard limit and the caller's ``WORKER_LOST``, and its write landed after the next
turn's write of the same file (a gray-failure trial; promises 14 / F5: "No write of a turn lands
after the next turn's on the same path"; S2: "No process outlives its call"). The sandbox now ends
itself half a second past the call's time limit (tools/command.py ``_bounded``: ``timeout -s KILL``
around bwrap, outside the sandbox where the command cannot signal it; bwrap's end ends the
sandbox's PID namespace), and once the worker's liveness lease lapses its reaper ends it sooner,
before the caller is told ``WORKER_LOST`` (``toolfleet/worker/reaper.py``)."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from toolfleet import ErrorCode

from .faults import call, freeze, kill_pid, thaw, wait_started, wait_until
from .fencing_trials import fencing_settings
from .leftovers import processes_with, wait_gone


@pytest.fixture
def settings(settings):
    return fencing_settings(settings)  # heartbeat 0.3 s (liveness bound 2.2 s), margin 0.5 s


@pytest.mark.parametrize("command", [
    "touch running; sleep 4; echo t1 >> same.txt",
    # the write in a background subshell: it ends only because the namespace ends with the init
    "touch running; (sleep 4; echo t1 >> same.txt) & sleep 30",
    # a breaker's trial: the command stops its parent, which was the deadline's timeout when that ran
    # inside the sandbox; outside, the parent is the sandbox's init, which the signal does not reach
    "kill -STOP $PPID; kill -STOP -1; touch running; sleep 4; echo t1 >> same.txt",
], ids=["foreground", "background", "stops-its-parent"])
def test_a_frozen_workers_command_writes_nothing_after_the_next_turns_write(dispatcher, start_worker, workspace,
                                                                            command):
    workers = [start_worker(concurrency=1), start_worker(concurrency=1)]
    path = workspace / "same.txt"
    # turn 1: a 1 s time limit (hard limit 1.75 s); its write would come at 4 s
    turn1 = dispatcher.submit([call("w", "run_command", command=command, timeout_s=1)], workspace=str(workspace))
    record = wait_started(dispatcher, turn1.turn_id, "w")
    victim = next(w for w in workers if w.name == record["worker"])
    wait_until((workspace / "running").exists, 10, "the command running")  # in its sandbox, not only claimed
    freeze(victim)
    frozen_at = time.monotonic()
    try:
        first = turn1.results(timeout_s=30)[0]  # WORKER_LOST once the liveness bound passed
        # the caller has turn 1's answer: turn 2 writes the same file (its locks wait out turn 1's hold)
        second = dispatcher.run([call("w", "run_command", command="echo t2 >> same.txt")],
                                workspace=str(workspace), timeout_s=30)[0]
        answered_s = time.monotonic() - frozen_at
        # the worker stays frozen 5 s in all: past turn 1's hard limit + margin (2.25 s) and its command's 4 s
        time.sleep(max(frozen_at + 5.0 - time.monotonic(), 0.0))
    finally:
        thaw(victim)
    assert first.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), first.content
    assert second.ok, second.content
    lines = path.read_text().split()
    print(f"\nturn 1 {first.code.value}; turn 2 ok {answered_s:.1f} s after the freeze; same.txt = {lines}")
    assert "t1" not in lines or lines.index("t1") < lines.index("t2"), (
        f"turn 1's command (answered {first.code.value}, its worker frozen) wrote after turn 2: {lines}")


def test_a_frozen_workers_command_is_gone_when_its_caller_is_told_worker_lost(dispatcher, start_worker, workspace):
    """The same freeze, with a command whose own time limit (60 s) is far off: before the worker's
    sandbox reaper (``toolfleet/worker/reaper.py``) it ran on for its whole time limit after the caller
    was told ``WORKER_LOST``, and its write landed 4 s in. The reaper, outside the frozen group, ends
    it once the worker's lease lapses, before any dispatcher can judge the worker dead."""
    victim = start_worker(concurrency=1)  # the only one: its call is answered at the liveness bound (F1), not
    # sent again after its 60 s deadline (a journaled write, F4)
    tag = f"4.{uuid.uuid4().int % 10**9:09d}"  # `sleep <tag>`: about 4 s, and its command line names it
    command = f"touch running; sleep {tag}; echo late >> late.txt"
    turn = dispatcher.submit([call("w", "run_command", command=command, timeout_s=60)], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "w")
    wait_until((workspace / "running").exists, 10, "the command running")
    freeze(victim)
    frozen_at = time.monotonic()
    try:
        [first] = turn.results(timeout_s=30)
        answered_s = time.monotonic() - frozen_at
        left = processes_with(tag)
        time.sleep(max(frozen_at + 5.0 - time.monotonic(), 0.0))  # past the command's 4 s
    finally:
        thaw(victim)
    print(f"\n{first.code.value} {answered_s:.1f} s after the freeze; the command's processes then: {left}")
    assert first.code in (ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), first.content
    assert not left, f"{first.code.value} answered while the frozen worker's command still ran: {left}"
    assert not (workspace / "late.txt").exists(), "the frozen worker's command wrote after its caller's answer"


@pytest.mark.parametrize("how", ["killed", "frozen-then-cancelled"])
def test_a_dead_pool_processs_command_is_gone_when_its_caller_has_the_answer(dispatcher, start_worker, workspace,
                                                                              how):
    """Only the pool process dies (SIGKILL; or is frozen, then the cancel's revoke kills it) while
    its command runs; the worker's main process lives, so its liveness lease holds and the reaper
    has nothing to do. The caller is answered within a fraction of a second (``OUTCOME_UNKNOWN``);
    the command (``timeout`` → ``bwrap`` → ``bash``, 60 s time limit) ran on and wrote 4 s in,
    after the answer (a breaker's find). Now what the pool process starts dies with it
    (``PR_SET_PDEATHSIG``: tools/sandbox.py ``sandbox_child``)."""
    start_worker(concurrency=1)
    tag = f"4.{uuid.uuid4().int % 10**9:09d}"
    command = f"touch running; sleep {tag}; echo late >> late.txt"
    turn = dispatcher.submit([call("w", "run_command", command=command, timeout_s=60)], workspace=str(workspace))
    pool_pid = wait_started(dispatcher, turn.turn_id, "w")["pid"]
    wait_until((workspace / "running").exists, 10, "the command running")
    hit_at = time.monotonic()
    if how == "killed":
        kill_pid(pool_pid)
    else:
        os.kill(pool_pid, signal.SIGSTOP)
        turn.cancel()
    try:
        [first] = turn.results(timeout_s=30)
        answered_s = time.monotonic() - hit_at
        left = wait_gone(tag, timeout_s=1.0)  # a SIGKILLed process shows in /proc a moment while it exits
        time.sleep(max(hit_at + 5.0 - time.monotonic(), 0.0))  # past the command's 4 s: would it write?
    finally:
        kill_pid(pool_pid)  # a frozen one too: Celery starts another
    print(f"\n{first.code.value} {answered_s:.2f} s after the pool process was {how}; left: {left}")
    assert not first.ok, first
    assert not left, f"{first.code.value} answered while the dead pool process's command still ran: {left}"
    assert not (workspace / "late.txt").exists(), "the command wrote after its caller's answer"
