"""Issue 15, point 5: Flower tells the truth. An error result is a FAILED task (task-failed event,
FAILURE in Celery's event state, which is Flower's), an ok one SUCCESS, without a traceback in
the worker's log; queued calls are seen (task-sent: PENDING) before they start, named by their
tool. Real worker, real events over Redis (``app.events.Receiver`` into ``app.events.State``),
and a real Flower's ``/api/tasks``. The turn ledger stays the source of results: the results
asserted here come from it."""

from __future__ import annotations

import json
import time
import urllib.request

from toolfleet import Dispatcher, ToolCall
from toolfleet.models import ErrorCode
from toolfleet.tools.registry import Registry
from toolfleet.tools.spec import tool_from_schema
from toolfleet.worker.app import TASK_NAME

from .conftest import make_registry
from .faults import wait_started
from .test_audit import Flower, TaskEvents

WAIT_S = 60
FINAL = {"task-succeeded", "task-failed"}
FLUSH_WAIT_S = 1.0


def call(call_id: str, name: str, **arguments) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def final_states(app, events: list[dict], task_ids: set[str]) -> dict[str, str]:
    """Feed the captured events into Celery's event state (what Flower keeps): task id -> state."""
    state = app.events.State()
    for event in events:
        state.event(dict(event))
    return {tid: state.tasks[tid].state for tid in task_ids if tid in state.tasks}


def flower_states(flower: Flower, wanted: dict[str, str]) -> dict[str, dict]:
    """Flower learns from events, asynchronously, and offers nothing to join on: look until each
    task shows the wanted state (bounded)."""
    deadline = time.monotonic() + 30
    while True:
        tasks = flower.tasks()
        if all(tasks.get(t, {}).get("state") == s for t, s in wanted.items()) or time.monotonic() > deadline:
            return tasks
        time.sleep(0.2)


def test_error_results_are_failed_tasks_and_queued_calls_are_seen(settings, start_worker, tmp_path, capfd):
    flower = Flower(settings, tmp_path)
    try:
        start_worker(concurrency=2, args=["--loglevel", "INFO"])
        # the dispatcher's spec of `structured` is looser than the worker's: the worker refuses the call
        registry = Registry(make_registry())
        registry.add(tool_from_schema("structured", {"type": "object"}, access="read"), replace=True)
        calls = [
            call("ok", "quick_read", label="fine", seconds=0.3),
            call("boom", "boom", message="it broke"),
            call("slow", "quick_read", label="late", seconds=5),             # TIMEOUT (1 s limit)
            call("bad", "structured", n="not a number"),                    # INVALID_ARGUMENT on the worker
            call("hard", "swallowing_sleep", seconds=20),                   # killed at its hard limit: TIMEOUT
            call("ok2", "quick_read", label="fine again", seconds=0.3),
            call("ok3", "quick_read", label="and again", seconds=0.3),
        ]
        with Dispatcher(settings, registry) as d, TaskEvents(d.app) as events:
            warm = d.submit([call("warm", "quick_read", label="w")])
            assert warm.results(WAIT_S)[0].ok  # Flower is listening once it shows this task
            assert flower_states(flower, {f"{warm.turn_id}:warm": "SUCCESS"}).get(f"{warm.turn_id}:warm")
            turn = d.submit(calls)
            results = {r.call_id: r for r in turn.results(WAIT_S)}
            ids = {f"{turn.turn_id}:{c.id}": c for c in calls}
            assert events.wait_for(lambda seen: {e.get("uuid") for e in seen if e.get("type") in FINAL} >= set(ids),
                                   WAIT_S), "the worker's final task events did not arrive"
            seen = list(events.events)
            states = final_states(d.app, seen, set(ids))

        codes = {cid: (r.error.code if r.error else None) for cid, r in results.items()}
        assert codes == {"ok": None, "boom": ErrorCode.EXECUTION_ERROR, "slow": ErrorCode.TIMEOUT,
                         "bad": ErrorCode.INVALID_ARGUMENT, "hard": ErrorCode.TIMEOUT, "ok2": None, "ok3": None}, codes
        wanted = {tid: ("SUCCESS" if results[c.id].ok else "FAILURE") for tid, c in ids.items()}
        assert states == wanted, states
        for tid in ids:
            mine = [e for e in seen if e.get("uuid") == tid]
            kinds = [e["type"] for e in mine]
            # sent first (the call is listed while it waits), named by its tool, args reduced
            assert kinds[0] == "task-sent", kinds
            assert mine[0]["name"] == f"tool.{ids[tid].name}" and mine[0]["args"] == "()", mine[0]
            assert turn.turn_id in mine[0]["kwargs"]
            if not results[ids[tid].id].ok:
                failed = next(e for e in mine if e["type"] == "task-failed")
                assert results[ids[tid].id].error.code.value in failed["exception"], failed
                # an error result is no crash: Flower showed a Python traceback for each (a newcomer's note)
                assert not failed.get("traceback"), failed
        # queued while the two processes were busy: PENDING in the event state before it started
        queued = [tid for tid in ids if _pending_before_start(d.app, seen, tid)]
        assert len(queued) >= len(ids) - 2, queued

        in_flower = flower_states(flower, wanted)
        assert {tid: in_flower.get(tid, {}).get("state") for tid in ids} == wanted
        assert all(in_flower[tid]["name"] == f"tool.{c.name}" for tid, c in ids.items())
        with urllib.request.urlopen(f"{flower.url}/api/tasks?state=FAILURE", timeout=5) as reply:
            failed_in_flower = set(json.load(reply))
        assert {tid for tid, s in wanted.items() if s == "FAILURE"} <= failed_in_flower
    finally:
        flower.stop()
    log = capfd.readouterr()
    text = log.out + log.err
    assert "raised expected: CallFailed" in text  # one INFO line per error result...
    assert "Traceback" not in text, text[-3000:]  # ...and no traceback in the worker's log


def _pending_before_start(app, events: list[dict], tid: str) -> bool:
    state = app.events.State()
    for event in events:
        if event.get("uuid") == tid and event["type"] in ("task-started", *FINAL):
            break
        state.event(dict(event))
    return tid in state.tasks and state.tasks[tid].state in ("PENDING", "RECEIVED")


def test_cancelled_and_killed_calls_are_failed_tasks(settings, start_worker, capfd):
    start_worker(concurrency=3, args=["--loglevel", "INFO"])
    calls = [call("coop", "count_until_cancelled", seconds=20),   # stops itself: CANCELLED
             call("stub", "stubborn_sleep", seconds=20),          # interrupted after the grace: CANCELLED
             call("kill", "unstoppable_sleep", seconds=20)]       # swallows the interrupt: killed
    with Dispatcher(settings, make_registry()) as d, TaskEvents(d.app) as events:
        turn = d.submit(calls)
        for c in calls:
            wait_started(d, turn.turn_id, c.id)
        turn.cancel()
        results = {r.call_id: r for r in turn.results(WAIT_S)}
        ids = {f"{turn.turn_id}:{c.id}" for c in calls}
        killed = f"{turn.turn_id}:kill"

        def all_in(seen) -> bool:  # the killed one: the dispatcher's and the worker's reports both
            failed = [e.get("uuid") for e in seen if e.get("type") == "task-failed"]
            revoked = {e.get("uuid") for e in seen if e.get("type") == "task-revoked"}
            return set(failed) >= ids and killed in revoked and failed.count(killed) >= 2

        assert events.wait_for(all_in, WAIT_S), "no task-failed event for a cancelled call"
        seen = list(events.events)
        states = final_states(d.app, seen, ids)
    codes = {cid: r.error.code for cid, r in results.items()}
    assert codes["coop"] == codes["stub"] == ErrorCode.CANCELLED, codes
    # killed by the dispatcher's revoke (Terminated: task-revoked, then task-failed)
    assert codes["kill"] in (ErrorCode.CANCELLED, ErrorCode.OUTCOME_UNKNOWN), codes
    assert states == {tid: "FAILURE" for tid in ids}, states
    log = capfd.readouterr()
    assert "Traceback" not in log.out + log.err, (log.out + log.err)[-3000:]


def test_calls_the_dispatcher_ends_are_failed_tasks(settings, start_worker):
    """The worker running a call and holding the next in its queue dies: the dispatcher gives the
    running call WORKER_LOST and the queued one TOOL_UNAVAILABLE, and tells Flower both failed."""
    fast = settings.model_copy(update={"heartbeat_s": 0.5})
    worker = start_worker(concurrency=1, settings=fast)
    calls = [call("run", "add_note", text="a", seconds=30), call("queued", "add_note", text="b", seconds=30)]
    with Dispatcher(fast, make_registry()) as d, TaskEvents(d.app) as events:
        turn = d.submit(calls)
        wait_started(d, turn.turn_id, "run")
        worker.kill()
        results = {r.call_id: r for r in turn.results(WAIT_S)}
        ids = {f"{turn.turn_id}:{c.id}" for c in calls}
        assert events.wait_for(lambda seen: {e.get("uuid") for e in seen if e.get("type") == "task-failed"} >= ids,
                               WAIT_S), "no task-failed event for a call the dispatcher ended"
        seen = list(events.events)
        states = final_states(d.app, seen, ids)
    assert results["run"].code == ErrorCode.WORKER_LOST and results["queued"].code == ErrorCode.TOOL_UNAVAILABLE
    assert states == {tid: "FAILURE" for tid in ids}, states
    failed = {e["uuid"]: e for e in seen if e.get("type") == "task-failed"}
    assert "WORKER_LOST" in failed[f"{turn.turn_id}:run"]["exception"]
    assert failed[f"{turn.turn_id}:run"]["hostname"] == worker.name  # shown on the worker that ran it


def test_a_copy_of_a_running_calls_message_does_not_make_its_failed_task_a_success(settings, start_worker,
                                                                                   dispatcher, workspace):
    """Every message of a call has the call's task id (``turn:call``): a copy that ran nothing (it
    arrived while the call ran: ``running``; or a send the dispatcher superseded) must not end
    that task. It sent ``task-succeeded``, and SUCCESS outranks FAILURE in Celery's event state
    (Flower's), whatever order they come in: the call, cancelled, showed SUCCESS."""
    from .test_signing import Recorder, attacker

    start_worker(concurrency=2)
    recorder = Recorder(dispatcher)
    with TaskEvents(dispatcher.app) as events:
        turn = dispatcher.open_turn(workspace=str(workspace))
        turn.add_calls([call("a", "wait_read", label="long", seconds=20)])
        turn.close()
        tid = f"{turn.turn_id}:a"
        wait_started(dispatcher, turn.turn_id, "a")
        attacker(settings).send_task(TASK_NAME, **recorder.sent["a"])  # a second copy, a free process takes it

        def started(seen) -> int:
            return sum(1 for e in seen if e.get("uuid") == tid and e.get("type") == "task-started")

        assert events.wait_for(lambda seen: started(seen) >= 2, WAIT_S), "the copy did not start"
        time.sleep(FLUSH_WAIT_S)  # its claim answers ``running`` (a warning in the worker's log) well within this
        turn.cancel("the user pressed stop")
        (result,) = turn.results(WAIT_S)
        assert result.code is ErrorCode.CANCELLED, result.content
        assert events.wait_for(lambda seen: any(e.get("uuid") == tid and e.get("type") == "task-failed"
                                                for e in seen), WAIT_S), "no task-failed for the cancelled call"
        time.sleep(FLUSH_WAIT_S)  # anything the copy still sends comes within the workers' event batching
        seen = list(events.events)
    assert final_states(dispatcher.app, seen, {tid}) == {tid: "FAILURE"}, [
        (e["type"], e.get("result") or e.get("exception")) for e in seen if e.get("uuid") == tid]
