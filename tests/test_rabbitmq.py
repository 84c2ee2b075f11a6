"""RabbitMQ as the broker, Redis as the result store (ledger, journal, catalog): the fault promises
hold the same. The whole suite can also run this way (TOOLFLEET_TEST_BROKER_URL=amqp://...); these
few run in every build. Skipped when no RabbitMQ answers at $RABBITMQ_URL."""

from __future__ import annotations

import os

import pytest

from toolfleet import ErrorCode

from . import refund_store
from .conftest import delete_amqp_queues
from .faults import call, kill_pid, wait_started, wait_until

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def on_rabbitmq(settings, namespace, **update):
    """The body of a ``settings`` fixture: the test's settings with RabbitMQ as broker (plus
    ``update``), skipping when none answers; the namespace's queues are deleted afterwards."""
    from kombu import Connection

    try:
        with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - any failure means: no RabbitMQ here
        pytest.skip(f"no RabbitMQ at {RABBITMQ_URL} ({exc})")
    yield settings.model_copy(update={"broker_url": RABBITMQ_URL, "heartbeat_s": 0.5, **update})
    delete_amqp_queues(RABBITMQ_URL, namespace)


@pytest.fixture
def settings(settings, namespace):
    yield from on_rabbitmq(settings, namespace)


def test_parallel_reads_and_a_write(dispatcher, worker, workspace):
    results = dispatcher.run([call("r1", "read_file", path="README.md"), call("r2", "list_dir", path="."),
                              call("w1", "write_file", path="notes/x.md", content="hi")],
                             workspace=str(workspace), timeout_s=60)
    assert all(r.ok for r in results), [r.content for r in results]
    assert (workspace / "notes" / "x.md").read_text() == "hi"


def test_refund_killed_after_paying_is_replayed(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("r1", "refund", order_id="Q1", amount_cents=500, post_s=5)],
                             workspace=str(workspace))
    pid = wait_started(dispatcher, turn.turn_id, "r1")["pid"]
    wait_until(lambda: refund_store.counts(workspace)["refunds"], 10, "the payment")
    kill_pid(pid)
    result = turn.results(timeout_s=60)[0]
    assert result.ok and result.attempts == 2, result.content
    assert refund_store.counts(workspace)["refunds"] == {"order-Q1": 1}


def test_whole_worker_lost(dispatcher, start_worker, workspace):
    """RabbitMQ hands a dead consumer's unacknowledged messages out again at once (and the
    dispatcher, seeing the heartbeat stop, sends the read again too: it runs, one result wins)."""
    workers = {w.name: w for w in (start_worker(), start_worker())}
    turn = dispatcher.submit([call("c1", "wait_read", label="a", seconds=3)], workspace=str(workspace))
    workers[wait_started(dispatcher, turn.turn_id, "c1")["worker"]].kill()
    result = turn.results(timeout_s=60)[0]
    assert result.ok and result.attempts >= 2, result.content


def test_cancel(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("c1", "run_command", command="for i in 1 2 3 4 5; do echo l$i; sleep 1; done"),
                              call("c2", "run_command", command="echo never")], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c1")
    assert not turn.wait(1.5)
    turn.cancel()
    first, second = turn.results(timeout_s=10)
    assert first.code is ErrorCode.CANCELLED and "l1" in first.content
    assert second.code is ErrorCode.NOT_EXECUTED
