"""The distributed path through the public API: real Redis, real prefork workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from toolfleet import ErrorCode, ToolCall

from .conftest import ROOT
from .leftovers import marker, processes_with


def call(cid: str, name: str, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments))


def test_results_pair_by_id_and_come_back_in_model_order(dispatcher, worker):
    # the first call is the slowest, so completion order differs from model order
    calls = [
        call("slow", "wait_read", label="a", seconds=0.6),
        call("fast1", "wait_read", label="b"),
        call("fast2", "wait_read", label="c"),
    ]
    turn = dispatcher.submit(calls)
    completed = [r.call_id for r in turn.as_completed(timeout_s=30)]
    results = turn.results(timeout_s=30)
    assert completed[-1] == "slow" and sorted(completed) == ["fast1", "fast2", "slow"]
    assert [r.call_id for r in results] == ["slow", "fast1", "fast2"]
    assert [r.content for r in results] == ["read a", "read b", "read c"]
    assert all(r.status == "ok" and r.attempts == 1 and r.worker for r in results)


def test_a_bad_call_never_stops_the_good_ones(dispatcher, worker):
    calls = [
        call("bad_name", "no_such_tool"),
        ToolCall(id="bad_json", name="wait_read", arguments='{"label": '),
        call("bad_type", "wait_read", label=3),
        call("fails", "boom", message="kaput"),
        call("good", "wait_read", label="x"),
        call("data", "structured", n=3),
    ]
    results = {r.call_id: r for r in dispatcher.run(calls, timeout_s=30)}
    assert results["bad_name"].code is ErrorCode.UNKNOWN_TOOL
    assert results["bad_json"].code is ErrorCode.INVALID_ARGUMENT
    assert results["bad_type"].code is ErrorCode.INVALID_ARGUMENT and "/label" in results["bad_type"].content
    assert results["fails"].code is ErrorCode.EXECUTION_ERROR and "kaput" in results["fails"].content
    assert results["good"].ok and results["good"].content == "read x"
    assert results["data"].data == {"items": [0, 1, 2]}


def test_conflicting_writes_run_in_model_order_and_reads_see_them(dispatcher, worker, workspace):
    calls = [call(f"w{i}", "append_line", path="log.txt", line=str(i)) for i in range(6)]
    calls.append(call("r", "read_file", path="log.txt"))
    turn = dispatcher.submit(calls, workspace=str(workspace))
    results = turn.results(timeout_s=30)
    assert all(r.ok for r in results)
    assert (workspace / "log.txt").read_text() == "0\n1\n2\n3\n4\n5\n"
    assert results[-1].content == "0\n1\n2\n3\n4\n5\n"
    assert turn.plan.deps["w3"] == {"w2"}  # its immediate predecessor: w0 and w1 through it


def test_time_limit_stops_one_call_and_not_the_others(dispatcher, worker, workspace):
    calls = [
        call("limited", "run_command", command="echo started; sleep 30", timeout_s=0.5),
        call("other", "wait_read", label="ok", seconds=0.2),
    ]
    results = dispatcher.run(calls, timeout_s=30, workspace=str(workspace))
    assert results[0].code is ErrorCode.TIMEOUT
    assert "started" in results[0].content  # what it printed before it was stopped
    assert "part of its work" in results[0].error.hint  # a write stopped part-way
    assert results[1].ok


def test_a_write_stopped_at_its_time_limit_says_it_may_have_done_part_of_its_work(dispatcher, worker):
    """A model told only "ask for less work" applies a half-done write twice; a read's hint is
    unchanged (running it again is harmless)."""
    write, read = dispatcher.run([call("w", "slow_write", label="x", seconds=30),
                                  call("r", "swallowing_sleep", seconds=30)], timeout_s=30)
    assert write.code is read.code is ErrorCode.TIMEOUT, (write, read)
    assert "may have done part of its work" in write.error.hint, write
    assert "part of its work" not in read.error.hint, read


def test_hard_time_limit_kills_a_handler_that_swallows_the_soft_one(dispatcher, worker):
    # swallowing_sleep has timeout_s=1 and catches every Exception; kill_grace_s=1 in tests
    results = dispatcher.run([call("s", "swallowing_sleep", seconds=30)], timeout_s=30)
    assert results[0].code is ErrorCode.TIMEOUT
    # the handler ran (issue 11, case 6): the claim in the ledger tells who ran it and for how long
    assert results[0].attempts == 1 and results[0].worker == worker.name, results[0]
    assert results[0].run_ms is not None and results[0].run_ms >= 2000  # hard limit 1 + 0.5 + 1 s


def test_cancel_mid_batch(dispatcher, worker, workspace):
    seconds = marker()
    calls = [
        call("done_first", "wait_read", label="quick"),
        call("running_cmd", "run_command", command=f"sleep {seconds} & wait"),
        call("running_py", "stubborn_sleep", seconds=60),
        call("never", "run_command", command="touch never-ran"),
    ]
    turn = dispatcher.submit(calls, workspace=str(workspace))
    first = next(turn.as_completed(timeout_s=30))
    assert first.call_id == "done_first"
    _wait_started(dispatcher, turn, {"running_cmd", "running_py"})
    cancelled_at = time.monotonic()
    turn.cancel()
    results = {r.call_id: r for r in turn.results(timeout_s=5)}
    assert time.monotonic() - cancelled_at <= 1.0
    assert results["done_first"].ok
    assert results["running_cmd"].code is ErrorCode.CANCELLED
    assert results["running_py"].code is ErrorCode.CANCELLED
    assert results["never"].code is ErrorCode.NOT_EXECUTED
    assert not (workspace / "never-ran").exists()
    assert processes_with(seconds) == []  # the command's child died with it (its pid is the sandbox's own)


def test_cancel_from_another_process(dispatcher, worker, settings):
    turn = dispatcher.submit([call("c", "wait_read", label="x", seconds=60), call("d", "wait_write", label="x")])
    _wait_started(dispatcher, turn, {"c"})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolfleet",
            "cancel",
            turn.turn_id,
            "--redis-url",
            settings.redis_url,
            "--namespace",
            settings.namespace,
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    results = turn.results(timeout_s=5)
    assert [r.code for r in results] == [ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED]


def test_every_call_gets_exactly_one_result_under_cancel(dispatcher, worker):
    calls = [call(f"c{i}", "wait_write" if i % 3 else "wait_read", label=f"k{i % 4}", seconds=0.05) for i in range(24)]
    turn = dispatcher.submit(calls)
    seen = []
    for result in turn.as_completed(timeout_s=30):
        seen.append(result.call_id)
        if len(seen) == 5:
            turn.cancel()
    assert sorted(seen) == sorted(c.id for c in calls)
    stored = dispatcher.ledger.results(turn.turn_id)
    assert set(stored) == {c.id for c in calls}
    assert [r.call_id for r in turn.results()] == [c.id for c in calls]


def _wait_started(dispatcher, turn, call_ids: set[str]) -> None:
    """Join on the turn's `started` events."""
    last = "0-0"
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while not call_ids <= seen:
        assert time.monotonic() < deadline, f"calls {call_ids - seen} never started"
        for event in dispatcher.ledger.events(turn.turn_id, after=last, block_ms=1000):
            last = event.stream_id
            if event.type == "started":
                seen.add(event.call_id)


@pytest.mark.parametrize("concurrency", [1])
def test_one_process_worker_still_honours_the_plan(start_worker, dispatcher, concurrency):
    start_worker(concurrency=concurrency)
    calls = [call("a", "wait_write", label="k"), call("b", "wait_read", label="k"), call("c", "wait_read", label="z")]
    assert [r.content for r in dispatcher.run(calls, timeout_s=30)] == ["wrote k", "read k", "read z"]
