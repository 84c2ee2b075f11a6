"""Issue 11, case 2: a turn that is over leaves nothing that can run later, whether it ended by
the caller giving up (`toolfleet run --timeout`), a SIGTERM of the dispatcher (its exit hook
cancels) or a dispatcher killed outright (its lease in Redis lapses, the claim refuses).

Each test kills the tool's only worker while a call runs and others wait in the queue, ends the
turn, then starts a new worker at once: it takes the queued messages and runs none of them,
counted by the side-effect file tally.txt (one line per execution)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from toolfleet.keys import Keys
from toolfleet.redis_client import client_for

from .conftest import ROOT, TEST_TOOLS
from .faults import call, wait_started, wait_until

GIVE_UP_S = 8.0
LEASE_S = 3.0


def response_file(tmp_path: Path) -> Path:
    calls = [("t0", "a", 0), ("t1", "b", 30), ("t2", "c", 0), ("t3", "d", 0), ("t4", "e", 0)]
    doc = {"id": "r", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason":
           "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
               {"id": cid, "type": "function", "function": {
                   "name": "tally", "arguments": json.dumps({"text": text, "seconds": seconds})}}
               for cid, text, seconds in calls]}}]}
    path = tmp_path / "tally.json"
    path.write_text(json.dumps(doc))
    return path


def start_cli(settings, tmp_path, workspace, *extra: str, lease_s: float | None = None,
              heartbeat_s: float | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if lease_s is not None:
        env["TOOLFLEET_TURN_LEASE_S"] = str(lease_s)
    if heartbeat_s is not None:  # the dispatcher's idea of the beat: its watchdog acts later
        env["TOOLFLEET_HEARTBEAT_S"] = str(heartbeat_s)
    argv = [sys.executable, "-m", "toolfleet", "run", str(response_file(tmp_path)), "--workspace", str(workspace),
            "--json", "--redis-url", settings.redis_url, "--namespace", settings.namespace, "--tools", TEST_TOOLS,
            *extra]
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def the_turn(settings) -> str:
    client = client_for(settings.ledger)
    found: list[str] = []

    def opened() -> bool:
        pattern = f"{settings.namespace}:turn:*:events"
        found[:] = [k.decode().split(":")[2].strip("{}") for k in client.scan_iter(match=pattern)]
        return bool(found)

    wait_until(opened, 30, "the CLI's turn opening")
    return found[0]


def tallied(workspace: Path) -> list[str]:
    path = workspace / "tally.txt"
    return path.read_text().split() if path.exists() else []


def kill_worker_mid_turn(settings, dispatcher, start_worker, tmp_path, workspace, *extra, lease_s=None,
                         heartbeat_s=None):
    """The only worker runs t1 (30 s) with t2..t4 queued behind it, and is SIGKILLed."""
    worker = start_worker(concurrency=1)
    from toolfleet.worker.catalog import live_catalog

    wait_until(lambda: any(t["name"] == "tally" for e in live_catalog(settings) for t in e.get("tools", ())), 30,
               "the worker's catalog listing tally")
    cli = start_cli(settings, tmp_path, workspace, *extra, lease_s=lease_s, heartbeat_s=heartbeat_s)
    turn_id = the_turn(settings)
    wait_started(dispatcher, turn_id, "t1")
    wait_until(lambda: "b" in tallied(workspace), 30, "t1's handler writing its line")
    worker.kill()
    return cli, turn_id


def zero_executions_after(dispatcher, start_worker, workspace, turn_id) -> None:
    """Start a worker now; it takes t2..t4 from the queue before the probe behind them (one
    process, first in first out): once the probe ran, nothing of the ended turn ran."""
    start_worker(concurrency=1, name="later")
    probe = dispatcher.run([call("probe", "tally", text="probe")], workspace=str(workspace), timeout_s=60)
    assert probe[0].ok, probe[0].content
    lines = tallied(workspace)
    ran_later = [t for t in lines if t in ("c", "d", "e")]
    print(f"\nturn {turn_id}: executions {lines}; calls of the ended turn run later: {len(ran_later)}")
    assert lines == ["a", "b", "probe"], lines


def test_giving_up_cancels_prints_results_and_nothing_runs_later(settings, dispatcher, start_worker, tmp_path,
                                                                workspace):
    began = time.monotonic()
    # The give-up must come before the watchdog ends the calls itself (a dead worker's call after
    # 4 beats + 1 s, a tool nobody serves after 3 beats + 1 s: with 2 s beats that raced the 8 s
    # give-up on a loaded machine, and the CLI then rightly exited 0): the CLI's dispatcher counts
    # 6 s beats, so its watchdog acts after 19 s at the earliest
    cli, turn_id = kill_worker_mid_turn(settings, dispatcher, start_worker, tmp_path, workspace,
                                        "--timeout", str(GIVE_UP_S), heartbeat_s=6.0)
    out, err = cli.communicate(timeout=GIVE_UP_S + 30)
    elapsed = time.monotonic() - began
    assert cli.returncode == 1, err
    assert "not finished after" in err and "cancelled" in err
    doc = json.loads(out)
    by_id = {r["call_id"]: r for r in doc["results"]}
    assert by_id["t0"]["status"] == "ok"  # the call that had succeeded is printed
    assert {by_id[c]["error"]["code"] for c in ("t2", "t3", "t4")} == {"NOT_EXECUTED"}
    # its worker is dead: the cancel cannot be confirmed, so the truthful answer is OUTCOME_UNKNOWN (or
    # WORKER_LOST when the watchdog answered first); CANCELLED only if the stop was confirmed
    assert by_id["t1"]["error"]["code"] in ("CANCELLED", "WORKER_LOST", "OUTCOME_UNKNOWN")
    assert doc["error"]["reason"] == "gave_up"
    assert elapsed < GIVE_UP_S + 20
    # the run's own elapsed time, not the monotonic clock less the count of calls that started
    assert GIVE_UP_S <= doc["elapsed_s"] <= elapsed, doc["elapsed_s"]
    # giving up cancelled the turn: how long its results took after that cancel is said (it was null),
    # and the give-up came GIVE_UP_S after the submit (the budget once began after it)
    after = doc["final_after_cancel_s"]
    assert after is not None and 0 <= after <= doc["elapsed_s"] - GIVE_UP_S + 0.05, (after, doc["elapsed_s"])
    zero_executions_after(dispatcher, start_worker, workspace, turn_id)


def test_sigterm_of_the_dispatcher_cancels_its_turn(settings, dispatcher, start_worker, tmp_path, workspace):
    cli, turn_id = kill_worker_mid_turn(settings, dispatcher, start_worker, tmp_path, workspace)
    cli.send_signal(signal.SIGTERM)
    cli.communicate(timeout=30)
    assert dispatcher.ledger.is_cancelled(turn_id)
    zero_executions_after(dispatcher, start_worker, workspace, turn_id)


def test_dispatcher_killed_outright_its_lease_lapses(settings, dispatcher, start_worker, tmp_path, workspace):
    cli, turn_id = kill_worker_mid_turn(settings, dispatcher, start_worker, tmp_path, workspace, lease_s=LEASE_S)
    cli.kill()
    cli.communicate(timeout=30)
    client = dispatcher.ledger.redis
    lease = Keys(settings.namespace).turn_lease(turn_id)
    assert client.exists(lease)
    wait_until(lambda: not client.exists(lease), LEASE_S + 2, "the turn's lease lapsing")
    zero_executions_after(dispatcher, start_worker, workspace, turn_id)
    results = dispatcher.ledger.results(turn_id)
    assert {results[c].code.value for c in ("t2", "t3", "t4")} == {"NOT_EXECUTED"}, results


def test_messages_carry_an_expiry(settings, workspace):
    """Each call's message expires max_queue_wait_s + its hard limit after it was sent: a worker
    that gets it later discards it unrun (Celery: REVOKED, "expired")."""
    from datetime import datetime

    from toolfleet import Dispatcher
    from toolfleet.dispatcher.submit import message_expiry_s

    from .conftest import make_registry

    settings = settings.model_copy(update={"require_live_worker": False, "max_queue_wait_s": 30.0})
    with Dispatcher(settings, make_registry()) as dispatcher:
        sent_at = time.time()
        turn = dispatcher.submit([call("q", "tally", text="x")], workspace=str(workspace))
        client = redis.Redis.from_url(settings.broker)
        queued = [k for k in client.scan_iter(match=f"{settings.namespace}.tally*") if client.type(k) == b"list"]
        messages = [json.loads(m) for k in queued for m in client.lrange(k, 0, -1)]
        assert len(messages) == 1
        expires = datetime.fromisoformat(messages[0]["headers"]["expires"]).timestamp()
        spec = dispatcher.registry.get("tally")
        assert abs(expires - (sent_at + message_expiry_s(settings, spec.timeout_s))) < 5
        turn.cancel()


def test_results_timeout_cancels_the_turn(dispatcher, worker, workspace):
    """Turn.results(timeout_s) that times out is the caller giving up: the turn is cancelled (the
    running call stopped, the one waiting for it never started) and final soon after; with
    cancel_on_timeout=False the turn runs on."""
    turn = dispatcher.submit([call("slow", "wait_write", label="k", seconds=20),
                              call("next", "wait_write", label="k")], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "slow")
    with pytest.raises(TimeoutError, match="cancelled"):
        turn.results(timeout_s=0.5)
    assert dispatcher.ledger.is_cancelled(turn.turn_id)
    final = {r.call_id: r for r in turn.results(timeout_s=dispatcher.settings.cancel_grace_s + 3)}
    assert final["slow"].code.value == "CANCELLED"
    assert final["next"].code.value == "NOT_EXECUTED"  # it waited for "slow" (same resource)
    kept = dispatcher.submit([call("w", "wait_read", label="w", seconds=1.0)], workspace=str(workspace))
    with pytest.raises(TimeoutError):
        kept.results(timeout_s=0.1, cancel_on_timeout=False)
    assert kept.results(timeout_s=30)[0].ok
