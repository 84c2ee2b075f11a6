"""Approvals against a real Redis and real prefork workers: calls under `ask` are held in their
place in the plan until approved or denied, by id, from this process or another one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from toolfleet import Dispatcher, NotPending, Policy, ToolCall
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for

from .conftest import ROOT, make_registry

WAIT_S = 60

POLICY = Policy.from_dict(
    {
        "tools": {"append_line": "ask"},
        "risk": {"high": "ask"},
        "commands": {"allow": ["echo *", "cat *", "ls *"], "deny": ["rm -rf *"], "unmatched": "ask"},
    }
)
POLICY_TOML = """
[tools]
append_line = "ask"

[risk]
high = "ask"

[commands]
allow = ["echo *", "cat *", "ls *"]
deny = ["rm -rf *"]
unmatched = "ask"
"""


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML)
    return path


@pytest.fixture
def guarded(settings, start_worker, policy_file):
    """A worker and a dispatcher that both run under POLICY."""
    start_worker(args=["--policy", str(policy_file)])
    with Dispatcher(settings, make_registry(), Policy.load(policy_file)) as d:
        yield d


def started_counts(settings, turn_id: str) -> dict[str, int]:
    """How many times each call of the turn started, from its audit trail."""
    log = AuditLog(client_for(settings.ledger), Keys(settings.namespace), 60)
    counts: dict[str, int] = {}
    for event in log.read(turn_id):
        if event.type == "started":
            counts[event.call_id] = counts.get(event.call_id, 0) + 1
    return counts


def test_two_asks_among_three_allowed_each_answered_by_its_own_id(guarded, settings, workspace):
    calls = [
        call("c1", "write_file", 0, path="notes/a.md", content="A"),
        call("c2", "append_line", 1, path="effects/first.txt", line="ask-1"),
        call("c3", "write_file", 2, path="notes/b.md", content="B"),
        call("c4", "append_line", 3, path="effects/second.txt", line="ask-2"),
        call("c5", "read_file", 4, path="README.md"),
    ]
    (workspace / "effects").mkdir()
    turn = guarded.submit(calls, workspace=str(workspace))

    pending = turn.wait_settled(WAIT_S)
    assert [p.call_id for p in pending] == ["c2", "c4"]
    assert all(turn.result(c) is not None and turn.result(c).ok for c in ("c1", "c3", "c5"))
    assert turn.result("c2") is None and turn.result("c4") is None and not turn.done
    assert "append_line" in pending[0].reason and pending[0].arguments["line"] == "ask-1"

    turn.approve("c4")  # answered out of order, by id
    turn.deny("c2", "not today")
    results = turn.results(WAIT_S)

    by_id = {r.call_id: r for r in results}
    assert [r.call_id for r in results] == ["c1", "c2", "c3", "c4", "c5"]
    assert by_id["c4"].ok and by_id["c4"].content == "appended ask-2"
    assert by_id["c2"].code.value == "PERMISSION_DENIED" and "not today" in by_id["c2"].content
    assert (workspace / "effects/second.txt").read_text() == "ask-2\n"  # ran once
    assert not (workspace / "effects/first.txt").exists()  # never ran
    assert (workspace / "notes/a.md").read_text() == "A" and (workspace / "notes/b.md").read_text() == "B"
    assert started_counts(settings, turn.turn_id) == {"c1": 1, "c3": 1, "c4": 1, "c5": 1}  # nothing re-run
    assert turn.pending == []


def test_a_call_that_waits_on_a_held_call_waits_for_the_answer(guarded, workspace):
    calls = [
        call("w", "append_line", 0, path="chain.txt", line="first"),
        call("r", "read_file", 1, path="chain.txt"),  # reads what `w` writes: planned after it
        call("x", "read_file", 2, path="README.md"),
    ]
    turn = guarded.submit(calls, workspace=str(workspace))
    assert [p.call_id for p in turn.wait_settled(WAIT_S)] == ["w"]
    assert turn.result("x").ok and turn.result("r") is None
    turn.approve("w")
    results = {r.call_id: r for r in turn.results(WAIT_S)}
    assert results["r"].ok and "first" in results["r"].content


def test_denied_call_lets_its_dependents_run(guarded, workspace):
    calls = [call("w", "append_line", 0, path="chain.txt", line="first"), call("r", "list_dir", 1, path=".")]
    turn = guarded.submit(calls, workspace=str(workspace))
    turn.wait_settled(WAIT_S)
    turn.deny("w", "no")
    results = {r.call_id: r for r in turn.results(WAIT_S)}
    assert results["w"].code.value == "PERMISSION_DENIED" and results["r"].ok
    assert "chain.txt" not in results["r"].content


def test_answers_are_refused_for_calls_not_waiting(guarded, workspace):
    turn = guarded.submit([call("w", "append_line", 0, path="f.txt", line="x"),
                           call("r", "read_file", 1, path="README.md")], workspace=str(workspace))
    turn.wait_settled(WAIT_S)
    with pytest.raises(NotPending) as unknown:
        turn.approve("r")
    assert unknown.value.reason in ("unknown", "finished")
    turn.approve("w")
    with pytest.raises(NotPending) as twice:
        turn.deny("w", "too late")
    assert twice.value.reason in ("decided", "finished")
    assert all(r.ok for r in turn.results(WAIT_S))


def test_cancel_while_held_gives_not_executed(guarded, workspace):
    turn = guarded.submit([call("w", "append_line", 0, path="f.txt", line="x")], workspace=str(workspace))
    assert len(turn.wait_settled(WAIT_S)) == 1
    turn.cancel("user left")
    [result] = turn.results(WAIT_S)
    assert result.code.value == "NOT_EXECUTED" and not (workspace / "f.txt").exists()


def toolfleet(settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "toolfleet", *args, "--redis-url", settings.redis_url,
            "--namespace", settings.namespace]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_cli_lists_and_approves_from_another_process_and_remembers(guarded, settings, workspace):
    turn = guarded.submit([call("t", "run_command", 0, command="touch made.txt && echo made")],
                          workspace=str(workspace))
    turn.wait_settled(WAIT_S)

    listed = toolfleet(settings, "pending", turn.turn_id, "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["call_id"] == "t" and "touch made.txt" in entry["reason"]

    answered = toolfleet(settings, "approve", turn.turn_id, "t", "--remember", "touch *")
    assert answered.returncode == 0, answered.stderr
    [result] = turn.results(WAIT_S)
    assert result.ok and "made" in result.content and (workspace / "made.txt").exists()

    # the remembered rule answers the next matching call without asking, here and on the worker
    later = guarded.submit([call("t2", "run_command", 0, command="touch other.txt")], workspace=str(workspace))
    assert later.wait_settled(WAIT_S) == []
    assert later.results(WAIT_S)[0].ok and (workspace / "other.txt").exists()
    # ...only in that workspace
    elsewhere = guarded.submit([call("t3", "run_command", 0, command="touch other.txt")],
                               workspace=str(workspace / "src"))
    assert [p.call_id for p in elsewhere.wait_settled(WAIT_S)] == ["t3"]
    elsewhere.cancel()

    rules = toolfleet(settings, "rules")
    assert "touch *" in rules.stdout

    again = toolfleet(settings, "approve", turn.turn_id, "t")
    assert again.returncode == 1 and "already" in again.stderr


def test_cli_answers_calls_whose_ids_hold_brackets(guarded, settings, workspace):
    """A call id is the model's text: ``[/x]`` in it is printed as is (before: the approval was
    recorded, then rich's MarkupError ended the command with a traceback)."""
    turn = guarded.submit([call("t[/x]", "run_command", 0, command="touch a.txt"),
                           call("d[bold]", "run_command", 1, command="touch b.txt")], workspace=str(workspace))
    assert sorted(p.call_id for p in turn.wait_settled(WAIT_S)) == ["d[bold]", "t[/x]"]
    approved = toolfleet(settings, "approve", turn.turn_id, "t[/x]")
    assert approved.returncode == 0 and f"approved t[/x] of turn {turn.turn_id}" in approved.stdout, approved.stderr
    denied = toolfleet(settings, "deny", turn.turn_id, "d[bold]")
    assert denied.returncode == 0 and f"denied d[bold] of turn {turn.turn_id}" in denied.stdout, denied.stderr
    assert [r.code.value if r.code else "ok" for r in turn.results(WAIT_S)] == ["ok", "PERMISSION_DENIED"]
    forgot = toolfleet(settings, "rules", "--forget", "[/r]")
    assert forgot.returncode == 1 and "MarkupError" not in forgot.stderr


def test_denied_command_never_reaches_a_worker(guarded, workspace):
    turn = guarded.submit([call("d", "run_command", 0, command="ls && rm -rf src")], workspace=str(workspace))
    [result] = turn.results(WAIT_S)
    assert result.code.value == "PERMISSION_DENIED" and "rm -rf *" in result.content
    assert result.worker is None and (workspace / "src").exists()


def test_worker_applies_its_own_policy_to_a_permissive_dispatcher(settings, start_worker, policy_file, workspace):
    start_worker(args=["--policy", str(policy_file)])
    with Dispatcher(settings, make_registry()) as lax:  # no policy: sends everything
        results = lax.run(
            [call("d", "run_command", 0, command="rm -rf src"),
             call("a", "append_line", 1, path="f.txt", line="x"),
             call("ok", "run_command", 2, command="echo fine")],
            workspace=str(workspace), timeout_s=WAIT_S,
        )
    by_id = {r.call_id: r for r in results}
    assert by_id["d"].code.value == "PERMISSION_DENIED" and "worker" in by_id["d"].content
    assert by_id["a"].code.value == "PERMISSION_DENIED" and "approval" in by_id["a"].content
    assert by_id["ok"].ok
    assert (workspace / "src").exists() and not (workspace / "f.txt").exists()


def test_a_streamed_turn_holds_its_asks_and_dispatches_the_rest_early(settings, start_worker, tmp_path, workspace):
    from .conftest import CASES

    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"tools": {"grep": "ask"}}))
    start_worker(args=["--policy", str(policy_file)])
    events = [json.loads(line) for line in (CASES / "openai_chat_stream" / "08_parallel_reads.jsonl").open()]
    with Dispatcher(settings, make_registry(), Policy.load(policy_file)) as d:
        with d.open_stream(workspace=str(workspace)) as stream:
            for event in events:
                stream.feed(event)
        turn = stream.turn
        assert [p.call_id for p in turn.wait_settled(WAIT_S)] == ["call_st2"]
        assert turn.result("call_st1").ok
        turn.approve("call_st2")
        results = {r.call_id: r for r in turn.results(WAIT_S)}
    assert results["call_st2"].ok and "WARN slow" in results["call_st2"].content
    trail = AuditLog(client_for(settings.ledger), Keys(settings.namespace), 60).read(turn.turn_id)
    planned = [e for e in trail if e.type == "planned"]
    assert [c["id"] for e in planned for c in e.data["calls"]] == ["call_st1", "call_st2"]
    assert [c["verdict"] for e in planned for c in e.data["calls"]] == ["allow", "ask"]


def test_approvals_with_redis_gone_raise_broker_unavailable(private_redis, namespace, start_worker, workspace,
                                                            policy_file):
    """Dispatcher.pending / approve / deny and Turn.approve / deny with Redis gone raise
    BrokerUnavailable naming the URL, as every other call of the API does: pending() and the
    first read of approve() and deny() let redis-py's ConnectionError out."""
    from toolfleet import BrokerUnavailable, Settings

    from .conftest import FLEET_KEY

    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, fleet_key=FLEET_KEY)
    start_worker(settings=settings, args=["--policy", str(policy_file)])
    with Dispatcher(settings, make_registry(), Policy.load(policy_file)) as d:
        turn = d.submit([call("c1", "append_line", 0, path="effects/held.txt", line="x")], workspace=str(workspace))
        assert [p.call_id for p in turn.wait_settled(WAIT_S)] == ["c1"]
        server.kill()
        for step in [lambda: d.pending(turn.turn_id), lambda: d.approve(turn.turn_id, "c1"),
                     lambda: d.deny(turn.turn_id, "c1"), lambda: turn.approve("c1"), lambda: turn.deny("c1")]:
            with pytest.raises(BrokerUnavailable, match=str(server.port)):
                step()
        server.start()
        turn.cancel()
