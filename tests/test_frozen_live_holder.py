"""Gray failure: the holder of a live session frozen (SIGSTOP of its process group), not killed.
Its liveness key lapses, the session's next call is answered ``SESSION_LOST`` ("the live session's
shell is gone ... its cwd, environment and processes are lost") and the call after it starts a new
shell on another worker. But the old shell's sandbox left the worker's process group (``bwrap
--new-session``): the freeze did not stop it, and a job it runs goes on writing into the workspace
after the caller was told the session's processes are gone, after the new shell's write.

A known gap (docs/guarantees.md L3, docs/sessions.md): ending them needs a deadline the sandbox keeps
by itself, renewed by the holder's heartbeats (a watchdog in the sandbox, fed through a socket, that
ends it when the beats stop), with the rescue waiting that long before it answers; not built yet.
Marked xfail (not strict: it depends on timing) so the suite says it is open."""

from __future__ import annotations

import time
import uuid

import pytest

from toolfleet import ErrorCode

from .faults import freeze, thaw
from .leftovers import processes_with, wait_gone
from .test_live_sessions import ARGS, fast, live, sh  # noqa: F401 - fixtures


@pytest.mark.xfail(reason="known gap: a frozen holder's shell runs on until the holder resumes (L3)", strict=False)
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
