"""A live shell's background jobs outlive a later command's stop (toolfleet/worker/live_shell.py),
as a breaker found: a command stopped by its time limit or a cancel killed the processes an earlier
background job started while it ran (a dev server's worker), counted as the command's own."""

from __future__ import annotations

from .leftovers import marker, processes_with, wait_gone
from .test_live_shell import run, shell  # noqa: F401 - the fixture


def test_a_stop_spares_what_an_earlier_background_job_starts_meanwhile(shell):  # noqa: F811
    job, own = marker(), marker()
    started = run(shell, f"nohup bash -c 'while [ ! -e go ]; do sleep 0.02; done; sleep {job} & echo $! > job.pid; "
                         "wait' >/dev/null 2>&1 & echo started")
    assert started.output == "started\n"
    # the job forks its child while this command runs; then this command runs out of time
    out = run(shell, f"touch go; while [ ! -s job.pid ]; do sleep 0.02; done; sleep {own}", timeout_s=3)
    assert out.stopped == "timeout" and not out.restarted
    assert wait_gone(own) == []  # the command's own processes are stopped
    assert processes_with(job), "the background job's child was killed by another command's stop"
    assert run(shell, "kill -0 $(cat job.pid) && echo alive").output == "alive\n"
