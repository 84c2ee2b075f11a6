"""Gray failure: the holder of a live session frozen (SIGSTOP of its process group), not killed.
Its liveness key lapses, the session's next call is answered ``SESSION_LOST`` ("the live session's
shell is gone ... its cwd, environment and processes are lost") and the call after it starts a new
shell on another worker. The old shell's sandbox left the worker's process group (``bwrap
--new-session``), so the freeze does not stop it: before the shell's lease watchdog
(``toolfleet/worker/sandbox_lease.py``, docs/guarantees.md L3) a job it ran went on writing into the
workspace after the caller was told the session's processes were gone, after the new shell's write.
Now the watchdog, outside the frozen group, ends the sandbox before the liveness key can lapse."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from toolfleet import Dispatcher, ErrorCode
from toolfleet.tools.registry import default_registry
from toolfleet.worker.sandbox_lease import margin_s

from .conftest import TEST_TOOLS
from .faults import call, freeze, thaw, wait_until
from .leftovers import processes_with, wait_gone
from .test_live_sessions import ARGS, SHELL_TOOLS, WAIT_S, fast, live, sh  # noqa: F401 - fixtures


def test_a_frozen_holders_shell_is_gone_when_session_lost_is_answered(start_worker, fast, live, workspace):  # noqa: F811
    workers = [start_worker(concurrency=1, args=ARGS, settings=fast) for _ in range(2)]
    tag = f"8.{uuid.uuid4().int % 10**9:09d}"  # `sleep <tag>`: about 8 s, and its command line names it
    # a background job of the session (live sessions keep them across calls) that writes in 8 s: past
    # SESSION_LOST, which L3's test bounds by 2.5 heartbeats + 5 s
    [setup] = sh(live, workspace, "g", f"(sleep {tag}; echo late >> log.txt) > /dev/null 2>&1 & echo ok")
    assert setup.ok, setup.content
    holder = next(w for w in workers if w.name == setup.worker)
    freeze(holder)
    frozen_at = time.monotonic()
    try:
        [lost] = sh(live, workspace, "g", "echo hi")
        lost_s = time.monotonic() - frozen_at
        assert lost.code is ErrorCode.SESSION_LOST, lost.content
        left = processes_with(tag)  # "its processes are lost": they should be
        [new] = sh(live, workspace, "g", "echo new >> log.txt")  # a new shell, on the other worker
        assert new.ok and new.worker != holder.name, new.content
        time.sleep(max(frozen_at + 9.5 - time.monotonic(), 0.0))
        lines = (workspace / "log.txt").read_text().splitlines()
    finally:
        thaw(holder)
    wait_gone(tag, 5.0)
    print(f"\nSESSION_LOST {lost_s:.1f} s after the freeze; old shell's processes then: {len(left)}; log.txt = {lines}")
    assert not left, f"SESSION_LOST answered while the lost shell's processes still run: {left}"
    assert lines == ["new"], f"the lost shell wrote after the new shell: {lines}"


@pytest.mark.parametrize("when", ["idle", "running a command"])
def test_a_holder_cut_off_from_redis_past_its_lease_ends_its_shell_and_says_session_lost(
        private_redis, start_worker, fast, workspace, when):  # noqa: F811
    """The other gray failure: the holder runs on, but its liveness renewals do not get through
    (``CLIENT PAUSE`` of its ledger Redis, 3 s: past the 2 s key, whose lapse lets a dispatcher answer
    ``SESSION_LOST``). Its shell's lease lapses, so the shell and the job it left running end within
    the lease (before the key can lapse), and once Redis answers again the session's next call is
    ``SESSION_LOST`` (for a command that was running: stopped, "may have acted in part"), never a
    quiet new shell whose cwd and processes are not the ones the model set up; the call after it
    starts a new shell. Before the lease, the shell ran on and the next call ran in it."""
    ledger = private_redis(persistent=False)
    settings = fast.model_copy(update={"ledger_url": ledger.url})
    start_worker(concurrency=1, args=ARGS, settings=settings)
    tag = f"8.{uuid.uuid4().int % 10**9:09d}"
    with Dispatcher(settings, default_registry([TEST_TOOLS, SHELL_TOOLS])) as dispatcher:
        [setup] = sh(dispatcher, workspace, "g", f"(sleep {tag}; echo late >> log.txt) > /dev/null 2>&1 & echo ok")
        assert setup.ok, setup.content
        turn = None
        if when == "running a command":
            turn = dispatcher.submit([call("r", "shell", command="touch running; sleep 20; echo done")],
                               workspace=str(workspace), session_id="g")
            wait_until(lambda: (workspace / "running").exists(), WAIT_S, "the command running in the shell")
        pause_s = 3.0
        paused = redis.Redis.from_url(ledger.url)
        paused.execute_command("CLIENT", "PAUSE", int(pause_s * 1000), "WRITE")
        paused_at = time.monotonic()
        left = wait_gone(tag, 2 * fast.heartbeat_s - margin_s(fast.heartbeat_s) + 1.0)
        gone_s = time.monotonic() - paused_at
        assert not left, f"the shell's job still runs {gone_s:.1f} s into the holder's loss of Redis: {left}"
        assert gone_s < pause_s, gone_s  # within the lease, while Redis still refused the renewals
        if turn is not None:
            [lost] = turn.results(timeout_s=WAIT_S)
            assert lost.code is ErrorCode.SESSION_LOST, lost.content
            assert "may have acted in part" in lost.content, lost.content
        else:
            [lost] = sh(dispatcher, workspace, "g", "echo hi")
            assert lost.code is ErrorCode.SESSION_LOST, lost.content
            assert "lost its liveness" in lost.content and "did not run" in lost.content, lost.content
        [new] = sh(dispatcher, workspace, "g", "echo new >> log.txt; echo ok")
        assert new.ok, new.content
    assert (workspace / "log.txt").read_text().splitlines() == ["new"]
