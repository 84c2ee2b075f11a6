"""The audit trail (redacted, complete, per turn) and `toolfleet trace`, against real services;
secrets never reach the audit stream, the approval records, or the task arguments Flower shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from celery.events.receiver import EventReceiver

from toolfleet import Dispatcher, Policy, ToolCall
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.trace import build_timeline

from .conftest import ROOT, make_registry

WAIT_S = 60
TOKEN = "hunter2-ultra-private-value"  # no known shape: masked because call_api declares it sensitive
BEARER = "abcdefghijklmnop1234567890"  # masked by shape (Authorization: Bearer ...)
OPENAI = "sk-proj-Zx81Qw55Lk09Rt7yUi3oP2aS"  # masked by shape (sk-...)
SECRETS = (TOKEN, BEARER, OPENAI)


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


class TaskEvents:
    """Celery task events (what Flower reads), captured on a thread until stopped."""

    def __init__(self, app) -> None:
        self.app = app
        self.events: list[dict] = []
        self.ready = threading.Event()
        self.changed = threading.Condition()
        self.receiver: EventReceiver | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        capture = self

        class Receiver(EventReceiver):
            def on_consume_ready(self, *args, **kwargs):
                super().on_consume_ready(*args, **kwargs)
                capture.ready.set()

        def on_event(event: dict) -> None:
            with self.changed:
                self.events.append(event)
                self.changed.notify_all()

        with self.app.connection_for_read() as conn:
            self.receiver = Receiver(conn, handlers={"*": on_event}, app=self.app)
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> TaskEvents:
        self.thread.start()
        assert self.ready.wait(10), "event receiver did not start"
        return self

    def wait_for(self, predicate, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self.events), timeout_s)

    def __exit__(self, *exc) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(timeout=5)


class Flower:
    """A real Flower process on the test's Redis (loopback, API without a password)."""

    def __init__(self, settings, tmp_path) -> None:
        from toolfleet.stack import _free_port

        self.url = f"http://127.0.0.1:{_free_port()}"
        # toolfleet.monitor, as `toolfleet up` and docker-compose.yml run it: the namespace's events only
        argv = [sys.executable, "-m", "celery", "-A", "toolfleet.monitor", "flower",
                f"--port={self.url.rsplit(':', 1)[1]}", "--address=127.0.0.1"]
        self.log = open(tmp_path / "flower.log", "wb")
        env = {k: v for k, v in os.environ.items() if k not in ("TOOLFLEET_BROKER_URL", "TOOLFLEET_LEDGER_URL")}
        env.update(FLOWER_UNAUTHENTICATED_API="true", REDIS_URL=settings.redis_url,
                   TOOLFLEET_NAMESPACE=settings.namespace, PYTHONPATH=str(ROOT))
        if settings.broker != settings.redis_url:
            env["TOOLFLEET_BROKER_URL"] = settings.broker
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env, cwd=ROOT)

    def tasks(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.url}/api/tasks", timeout=5) as reply:
                return json.load(reply)
        except OSError:
            return {}

    def wait_for(self, task_ids: set[str], timeout_s: float = 30) -> dict:
        """Flower learns of tasks from worker events, asynchronously, and offers nothing to join on:
        look until they are all there (as tests/test_stack.py does)."""
        deadline = time.monotonic() + timeout_s
        while True:
            tasks = self.tasks()
            if all(tasks.get(t, {}).get("state") == "SUCCESS" for t in task_ids) or time.monotonic() > deadline:
                return tasks
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


@pytest.fixture
def flower(settings, tmp_path):
    running = Flower(settings, tmp_path)
    yield running
    running.stop()


def test_secrets_never_reach_the_audit_trail_or_flower(settings, start_worker, tmp_path, workspace, flower):
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"tools": {"call_api": "ask"}}))
    start_worker(args=["--policy", str(policy_file)])
    calls = [
        call("api", "call_api", 0, endpoint="/deploy", api_token=TOKEN, payload=f"Authorization: Bearer {BEARER}"),
        call("cmd", "run_command", 1, command=f"echo {OPENAI} > /dev/null && echo sent"),
    ]
    with Dispatcher(settings, make_registry(), Policy.load(policy_file)) as d, TaskEvents(d.app) as events:
        warm = d.submit([call("warm", "read_file", 0, path="README.md")], workspace=str(workspace))
        warm.results(WAIT_S)  # Flower is listening once it shows this task
        assert "warm" in json.dumps(flower.wait_for({f"{warm.turn_id}:warm"})), "flower saw no task"
        turn = d.submit(calls, workspace=str(workspace))
        [held] = turn.wait_settled(WAIT_S)
        assert held.arguments["api_token"] == "***" and BEARER not in json.dumps(held.arguments)
        turn.approve("api")
        results = {r.call_id: r for r in turn.results(WAIT_S)}

        wanted = {(kind, f"{turn.turn_id}:{c}") for kind in ("task-received", "task-succeeded") for c in ("api", "cmd")}

        def all_in(events) -> bool:
            return wanted <= {(e.get("type"), e.get("uuid")) for e in events}

        assert events.wait_for(all_in, WAIT_S), "the workers' task events did not arrive"
        mine = [e for e in events.events if str(e.get("uuid", "")).startswith(turn.turn_id)]
    task_ids = {f"{turn.turn_id}:api", f"{turn.turn_id}:cmd"}
    in_flower = flower.wait_for(task_ids)
    for tid in task_ids:
        assert tid in in_flower, f"flower never showed {tid}"
        task = json.dumps(in_flower[tid])
        assert not any(secret in task for secret in SECRETS), task
        assert "***" in in_flower[tid]["kwargs"] and turn.turn_id in in_flower[tid]["kwargs"]

    # the handler got the real values; only what people see is masked
    assert results["api"].ok and f"{len(TOKEN)} characters" in results["api"].content
    assert results["cmd"].ok and "sent" in results["cmd"].content

    for event in mine:  # task-received carries the arguments Flower shows; none may hold a secret
        assert not any(secret in json.dumps(event) for secret in SECRETS), event
        if event["type"] == "task-received":
            assert "***" in event["kwargs"] and turn.turn_id in event["kwargs"]

    client = client_for(settings.ledger)
    keys = Keys(settings.namespace)
    raw = json.dumps([[k.decode(), v.decode()] for _id, fields in client.xrange(keys.turn_audit(turn.turn_id))
                      for k, v in fields.items()])
    raw += json.dumps({k.decode(): v.decode() for k, v in client.hgetall(keys.turn_pending(turn.turn_id)).items()})
    raw += json.dumps({k.decode(): v.decode() for k, v in client.hgetall(keys.turn_decisions(turn.turn_id)).items()})
    assert not any(secret in raw for secret in SECRETS)
    assert "***" in raw


def test_trail_records_every_step_with_timings_and_workers(dispatcher, worker, settings, workspace):
    calls = [
        call("w", "wait_write", 0, label="k", seconds=0.3),
        call("r", "wait_read", 1, label="k"),  # waits for w (same resource, w writes)
        call("p", "wait_read", 2, label="j", seconds=0.3),  # parallel with w
        call("bad", "read_file", 3, path="../../etc/passwd"),
    ]
    turn = dispatcher.submit(calls, workspace=str(workspace))
    turn.results(WAIT_S)
    events = AuditLog(client_for(settings.ledger), Keys(settings.namespace), 60).read(turn.turn_id)
    types = [e.type for e in events]
    assert types[0] == "planned"
    for call_id in ("w", "r", "p", "bad"):
        mine = [e.type for e in events if e.call_id == call_id]
        assert mine == ["submitted", "started", "finished"] or mine == ["submitted", "finished"], (call_id, mine)
    finished = {e.call_id: e.data for e in events if e.type == "finished"}
    assert finished["w"]["worker"] == worker.name and finished["w"]["run_ms"] >= 300
    assert finished["bad"]["code"] == "PERMISSION_DENIED"
    planned = events[0].data
    assert planned["deps"]["r"] == ["w"] and planned["deps"]["p"] == []

    timeline = build_timeline(turn.turn_id, events)
    rows = {row.call_id: row for row in timeline.rows}
    assert rows["r"].submitted_ms >= rows["w"].finished_ms  # the chain
    assert rows["p"].started_ms < rows["w"].finished_ms  # the parallel group

    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    argv = [sys.executable, "-m", "toolfleet", "trace", turn.turn_id, "--redis-url", settings.redis_url,
            "--namespace", settings.namespace]
    shown = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = {cid: next(line for line in shown.stdout.splitlines() if f" {cid} " in line and "█" in line)
             for cid in ("w", "r", "p")}  # the chart's rows (the table of calls comes first)
    assert lines["r"].index("█") > lines["w"].index("█")  # r's run starts where w's ends
    assert lines["p"].index("█") < lines["w"].rindex("█")  # p runs while w runs (the parallel group)
    assert "legend" in shown.stdout and "PERMISSION_DENIED" in shown.stdout

    as_json = subprocess.run(argv + ["--json"], env=env, capture_output=True, text=True, timeout=60)
    assert {e["type"] for e in json.loads(as_json.stdout)} >= {"planned", "submitted", "started", "finished"}


def test_trail_records_approvals_denials_and_cancel(settings, start_worker, tmp_path, workspace):
    policy = Policy.from_dict({"tools": {"append_line": "ask"}})
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(policy.model_dump_json())
    start_worker(args=["--policy", str(policy_file)])
    with Dispatcher(settings, make_registry(), policy) as d:
        turn = d.submit([call("a", "append_line", 0, path="a.txt", line="x"),
                         call("b", "append_line", 1, path="b.txt", line="y"),
                         call("c", "append_line", 2, path="c.txt", line="z")], workspace=str(workspace))
        assert len(turn.wait_settled(WAIT_S)) == 3
        turn.approve("a", by="alice")
        turn.deny("b", "not that file", by="bob")
        assert [p.call_id for p in turn.wait_settled(WAIT_S)] == ["c"]
        assert turn.result("a").ok and turn.result("b").code.value == "PERMISSION_DENIED"
        turn.cancel("user closed the tab")
        turn.results(WAIT_S)
    events = AuditLog(client_for(settings.ledger), Keys(settings.namespace), 60).read(turn.turn_id)
    by_type = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)
    assert [e.call_id for e in by_type["pending"]] == ["a", "b", "c"]
    assert by_type["approved"][0].call_id == "a" and by_type["approved"][0].data["by"] == "alice"
    denied = by_type["denied"][0]
    assert denied.call_id == "b" and denied.data["by"] == "bob" and denied.data["reason"] == "not that file"
    [cancelled] = by_type["cancelled"]
    assert cancelled.data["reason"] == "user closed the tab" and cancelled.data["not_executed"] == ["c"]
    codes = {e.call_id: e.data["code"] for e in by_type["finished"]}
    assert codes == {"a": None, "b": "PERMISSION_DENIED", "c": "NOT_EXECUTED"}

