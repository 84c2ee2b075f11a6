"""Resource locks across turns: two turns that write the same path, from different processes, run
one after the other on it; a dead holder's lock lapses after its lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from toolfleet import ErrorCode
from toolfleet.dispatcher.locks import LAPSED, ResourceLocks, lease_s, lock_names
from toolfleet.dispatcher.submit import SOFT_LIMIT_MARGIN_S

from .conftest import ROOT
from .faults import call, wait_started

WRITES_PER_TURN = 50


def spawn_turn(settings, workspace, calls, go_key=None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tests.turn_script", settings.model_dump_json(), str(workspace),
            json.dumps([c.model_dump(mode="json") for c in calls])]
    if go_key:
        argv.append(go_key)
    return subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_writing_the_same_file_do_not_interleave(settings, start_worker, workspace):
    start_worker(concurrency=4)
    go = f"{settings.namespace}:test:go"
    procs = {tag: spawn_turn(settings, workspace, [call(f"{tag}{i}", "append_line", path="history.txt",
                                                        line=f"{tag} {i}") for i in range(WRITES_PER_TURN)], go)
             for tag in ("A", "B")}
    from toolfleet.redis_client import client_for

    client_for(settings.ledger).rpush(go, "go", "go")  # the scripts wait on their ledger client
    runs = {tag: finish(proc) for tag, proc in procs.items()}
    for run in runs.values():
        assert all(r["status"] == "ok" for r in run["results"]), run["results"]
    lines = (workspace / "history.txt").read_text().splitlines()
    first = lines[0].split()[0]
    second = "B" if first == "A" else "A"
    assert lines == [f"{first} {i}" for i in range(WRITES_PER_TURN)] + [f"{second} {i}" for i in range(WRITES_PER_TURN)]
    # The turns were submitted together, and the second wrote only after the first was done.
    assert abs(runs["A"]["submitted_at"] - runs["B"]["submitted_at"]) < 1.0
    assert runs[second]["first_result_at"] >= runs[first]["last_result_at"]
    print(f"\nhistory: {WRITES_PER_TURN} lines of turn {first}, then {WRITES_PER_TURN} of turn {second}")


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"lock_lease_s": 2.0, "turn_lease_s": 3.0})


def append_hard_s(settings) -> float:
    """The hard time limit of an ``append_line`` call (its 10 s limit + margin + kill grace)."""
    return 10 + SOFT_LIMIT_MARGIN_S + settings.kill_grace_s


def test_dead_holder_does_not_block_forever(settings, start_worker, dispatcher, workspace):
    """A dead holder's locks lapse, but not before a write it sent can no longer act: its in-flight
    write lands first (it used to land after the next turn's, the lock gone after lock_lease_s)."""
    start_worker(concurrency=2)
    holder = spawn_turn(settings, workspace, [call("h1", "append_line", path="order.txt", line="old", seconds=4)])
    line = holder.stdout.readline()
    assert line.startswith("started")
    wait_started(dispatcher, line.split()[1], "h1")
    os.killpg(holder.pid, signal.SIGKILL)  # the holding dispatcher dies; its lease is not renewed
    holder.wait()
    began = time.monotonic()
    result = dispatcher.run([call("w1", "append_line", path="order.txt", line="new")], workspace=str(workspace),
                            timeout_s=60)[0]
    assert result.ok, result.content
    assert (workspace / "order.txt").read_text().splitlines() == ["old", "new"]
    assert time.monotonic() - began < lease_s(settings, append_hard_s(settings)) + 5


def test_a_paused_holder_writes_nothing_after_another_turn_took_its_lapsed_locks(settings, start_worker,
                                                                                  dispatcher, workspace):
    """Frozen is not dead: a dispatcher paused (SIGSTOP) past its locks' lease, whose locks another
    turn then took and used, must not go on writing when it resumes; its next write is answered
    NOT_EXECUTED (it used to run: the file read A1, B1, A2, every call ok). A helper's find."""
    start_worker(concurrency=2)
    holder = spawn_turn(settings, workspace, [call("a1", "append_line", path="order.txt", line="A1", seconds=1),
                                              call("a2", "append_line", path="order.txt", line="A2")])
    line = holder.stdout.readline()
    assert line.startswith("started")
    wait_started(dispatcher, line.split()[1], "a1")
    os.killpg(holder.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        [b1] = dispatcher.run([call("b1", "append_line", path="order.txt", line="B1")], workspace=str(workspace),
                              timeout_s=120)
        assert b1.ok, b1.content
        assert time.monotonic() - began >= lease_s(settings, append_hard_s(settings)) - 1
    finally:
        os.killpg(holder.pid, signal.SIGCONT)
    a1, a2 = finish(holder)["results"]
    assert a1["status"] == "ok"
    assert a2["error"]["code"] == "NOT_EXECUTED" and "lost its locks" in a2["content"], a2
    assert (workspace / "order.txt").read_text().splitlines() == ["A1", "B1"]


def test_waiting_too_long_for_a_lock_gives_tool_unavailable(settings, start_worker, dispatcher, workspace):
    start_worker(concurrency=2)
    holding = dispatcher.submit([call("h1", "wait_write", label="x", seconds=5)], workspace=str(workspace))
    impatient = settings.model_copy(update={"lock_wait_s": 0.5})
    from toolfleet import Dispatcher

    from .conftest import make_registry

    with Dispatcher(impatient, make_registry()) as other:
        results = other.run([call("w1", "wait_write", label="x"), call("r1", "wait_read", label="y")],
                            workspace=str(workspace), timeout_s=60)
    assert results[0].code is ErrorCode.TOOL_UNAVAILABLE and holding.turn_id in results[0].content
    assert results[1].ok
    holding.cancel()


def test_lock_conflicts_follow_the_planner_rule(settings):
    from toolfleet.redis_client import connect

    locks = ResourceLocks(settings, connect(settings.ledger))
    assert locks.acquire("A", lock_names("/ws", ["fs:notes"])) is None
    assert locks.acquire("B", lock_names("/ws", ["fs:notes/a.md"])) == "A"  # prefix by whole components
    assert locks.acquire("B", lock_names("/ws", ["fs:notes2"])) is None
    assert locks.acquire("C", lock_names("/ws", ["*"])) == "A"  # everything
    assert locks.acquire("C", lock_names("/other", ["fs:notes"])) is None  # another workspace
    assert locks.acquire("A", lock_names("/ws", ["fs:notes"])) is None  # re-entrant: renews
    assert locks.release("A") == 1
    assert locks.acquire("C", lock_names("/ws", ["*"])) == "B"


def test_a_holder_whose_lapsed_lock_another_turn_removed_is_told_so(settings):
    from toolfleet.redis_client import connect

    client = connect(settings.ledger)
    locks = ResourceLocks(settings, client)
    assert locks.acquire("A", lock_names("/ws", ["fs:a"]), lease_s=0.05) is None
    assert locks.acquire("A", lock_names("/ws", ["fs:a"])) is None  # its own: renewed, lapsed or not
    client.hset(locks.key, "/ws\nfs:a", "A 1")  # lapsed long ago
    assert locks.acquire("B", lock_names("/ws", ["fs:a"])) is None
    assert locks.acquire("A", lock_names("/ws", ["fs:a"])) == LAPSED + "B"  # never again
    assert locks.release("B") == 1
    assert locks.acquire("A", lock_names("/ws", ["fs:zzz"])) == LAPSED + "B"
    locks.release("A")  # its turn ends: the mark goes with it
    assert locks.acquire("A", lock_names("/ws", ["fs:a"])) is None


def _redis_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_an_acquire_refused_by_a_live_lock_writes_nothing(settings):
    """A refused acquire takes nothing, removes nothing and marks no one (it used to delete the
    lapsed locks of others, and mark their owners lapsed, before finding its conflict)."""
    from toolfleet.redis_client import connect

    client = connect(settings.ledger)
    locks = ResourceLocks(settings, client)
    client.hset(locks.key, "/ws\nfs:c", "C 1")  # C's lock, lapsed long ago (seen first by a scan)
    client.hset(locks.key, "/ws\nfs:a", f"A {_redis_ms(client) + 60_000}")  # A's, live
    before = client.hgetall(locks.key)
    assert locks.acquire("B", lock_names("/ws", ["fs:b", "fs:a"])) == "A"
    assert client.hgetall(locks.key) == before and not client.exists(locks.lapsed_key)
    assert locks.acquire("B", lock_names("/ws", ["fs:b"])) is None  # a take: C's lapsed lock goes, C is told
    assert locks.acquire("C", lock_names("/ws", ["fs:zzz"])) == LAPSED + "B"


def test_a_short_lease_never_shortens_the_lock_table_expiry(settings):
    """The table's own expiry covers its longest lease: a turn that takes a short lease after
    another took a long one must not make Redis drop the long one's lock early."""
    from toolfleet.redis_client import connect

    client = connect(settings.ledger)
    locks = ResourceLocks(settings, client)
    assert locks.acquire("A", lock_names("/ws", ["fs:a"]), lease_s=100) is None
    assert locks.acquire("B", lock_names("/ws", ["fs:b"]), lease_s=0.5) is None
    assert client.pttl(locks.key) > 100_000


def test_a_turn_waiting_for_a_new_lock_keeps_the_locks_it_holds(settings, start_worker, dispatcher, workspace):
    """A turn that takes calls as they come holds the lock of its first write; its next write
    needs a lock another turn holds, so it waits, and while it waits its held lock is renewed (it
    used to be renewed only while the turn held all it needed: it lapsed, and another turn could
    write the first path between this turn's two writes)."""
    from toolfleet.redis_client import connect

    start_worker(concurrency=2)
    client = connect(settings.ledger)
    locks = ResourceLocks(settings, client)
    turn = dispatcher.open_turn(workspace=str(workspace))
    turn.add_call(call("a1", "append_line", path="a.txt", line="A1"))
    assert next(turn.as_completed(timeout_s=60)).ok  # done: its lock's lease is lock_lease_s again
    [a_name] = lock_names(str(workspace), ["fs:a.txt"])
    [b_name] = lock_names(str(workspace), ["fs:b.txt"])
    assert locks.acquire("other", [b_name], lease_s=60) is None
    turn.add_call(call("a2", "append_line", path="b.txt", line="A2"))  # waits for "other"
    owner, until_ms = client.hget(locks.key, a_name).decode().split()
    assert owner == turn.turn_id
    deadline = time.monotonic() + 30
    while _redis_ms(client) < int(until_ms) + 1000:  # a whole lease after the one seen has passed
        assert time.monotonic() < deadline
        time.sleep(0.1)
    owner, renewed_until_ms = client.hget(locks.key, a_name).decode().split()
    assert owner == turn.turn_id and int(renewed_until_ms) > _redis_ms(client)
    assert locks.release("other") == 1
    turn.close()
    assert [r.ok for r in turn.results(timeout_s=60)] == [True, True]
    assert client.hget(locks.key, a_name) is None  # released at the end


def test_a_held_execution_keeps_the_renewed_lease_long_enough(settings):
    """Once the watchdog answers a write that may still act (a silent worker), the lease later
    renewals set covers that execution's deadline too, not only ``lock_lease_s`` (the hold itself
    only counts at release: a dispatcher dying after such a renewal would free the lock early)."""
    import threading
    from types import SimpleNamespace

    from toolfleet.dispatcher.turn_locks import TurnLocks

    turn = SimpleNamespace(_lock=threading.Lock(), _finished=set(), _runnable={}, _settings=settings,
                           _workspace="/ws", turn_id="t")
    lock = TurnLocks(turn, locks=None, sent_at={})
    assert lock._lease_needed() == settings.lock_lease_s
    lock.note_hold(100)
    assert 100 < lock._lease_needed() <= 100 + settings.lock_lease_s
