"""Loop detection across the batches of one session (real Redis, real workers)."""

from __future__ import annotations

import json

from toolfleet import Dispatcher, Policy, ToolCall

from .conftest import make_registry

WAIT_S = 60


def batch(dispatcher, session: str, workspace, name: str, n: int = 1, **arguments):
    calls = [ToolCall(id=f"{name}-{i}", name=name, arguments=json.dumps(arguments), index=i) for i in range(n)]
    return dispatcher.run(calls, workspace=str(workspace), session_id=session, timeout_s=WAIT_S)


def test_third_identical_call_in_three_batches_is_a_loop(dispatcher, worker, workspace):
    first = batch(dispatcher, "s1", workspace, "read_file", path="README.md")
    second = batch(dispatcher, "s1", workspace, "read_file", path="README.md")
    third = batch(dispatcher, "s1", workspace, "read_file", path="README.md")
    assert first[0].ok and second[0].ok
    assert third[0].code.value == "LOOP_DETECTED"
    assert "3 times in a row" in third[0].content and "Hint:" in third[0].content
    assert third[0].attempts == 0 and third[0].worker is None  # not run


def test_other_sessions_and_other_arguments_do_not_count(dispatcher, worker, workspace):
    batch(dispatcher, "s2", workspace, "read_file", path="README.md")
    batch(dispatcher, "s2", workspace, "read_file", path="README.md")
    assert batch(dispatcher, "s3", workspace, "read_file", path="README.md")[0].ok  # another session
    assert batch(dispatcher, "s2", workspace, "read_file", path="docs/runbook.md")[0].ok  # breaks the run
    assert batch(dispatcher, "s2", workspace, "read_file", path="README.md")[0].ok
    assert batch(dispatcher, "s2", workspace, "read_file", path="README.md")[0].ok
    assert batch(dispatcher, "s2", workspace, "read_file", path="README.md")[0].code.value == "LOOP_DETECTED"


def test_pollable_tool_is_not_flagged_while_time_passes(dispatcher, worker, workspace):
    # each status check takes 0.1 s, more than the tool's poll interval (0.05 s)
    results = [batch(dispatcher, "s4", workspace, "job_status", job="build-7")[0] for _ in range(5)]
    assert all(r.ok for r in results), [r.content for r in results]


def test_pollable_tool_repeated_at_once_is_flagged(dispatcher, worker, workspace):
    results = batch(dispatcher, "s5", workspace, "job_status", n=3, job="build-7")
    assert [r.code.value if r.code else "ok" for r in results] == ["ok", "ok", "LOOP_DETECTED"]
    assert "poll" in results[2].content


def test_without_a_session_nothing_is_counted(dispatcher, worker, workspace):
    calls = [ToolCall(id=f"r{i}", name="read_file", arguments='{"path": "README.md"}', index=i) for i in range(4)]
    assert all(r.ok for r in dispatcher.run(calls, workspace=str(workspace), timeout_s=WAIT_S))


def test_limit_comes_from_the_policy(settings, worker, workspace):
    with Dispatcher(settings, make_registry(), Policy.from_dict({"loops": {"limit": 0}})) as off:
        results = [batch(off, "s6", workspace, "read_file", path="README.md")[0] for _ in range(4)]
    assert all(r.ok for r in results)
