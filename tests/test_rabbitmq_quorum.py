"""RabbitMQ quorum queues (``broker_queue_type="quorum"``; docs/scaling.md): the tool queues are
declared as quorum queues by workers and dispatchers alike, and the core path runs on them. Skipped
when no RabbitMQ answers at $RABBITMQ_URL."""

from __future__ import annotations

import pytest

from toolfleet import ErrorCode, Settings

from .faults import call, kill_pid, wait_started
from .test_rabbitmq import RABBITMQ_URL, on_rabbitmq


@pytest.fixture
def settings(settings, namespace):
    yield from on_rabbitmq(settings, namespace, broker_queue_type="quorum")


def _declared_type_is_quorum(queue: str) -> bool:
    """RabbitMQ refuses to declare an existing queue with another ``x-queue-type``."""
    from amqp.exceptions import PreconditionFailed
    from kombu import Connection

    with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
        try:
            conn.channel().queue_declare(queue, durable=True, auto_delete=False,
                                         arguments={"x-queue-type": "classic"})
        except PreconditionFailed as exc:
            return "x-queue-type" in str(exc)
    return False


def test_tool_queues_are_quorum_queues_and_the_batch_runs(settings, dispatcher, worker, workspace):
    results = dispatcher.run([call("r1", "read_file", path="README.md"), call("r2", "wait_read", label="x"),
                              call("w1", "write_file", path="notes/x.md", content="hi")],
                             workspace=str(workspace), timeout_s=60)
    assert all(r.ok for r in results), [r.content for r in results]
    assert _declared_type_is_quorum(f"{settings.namespace}.wait_read")
    assert _declared_type_is_quorum(f"{settings.namespace}.write_file")


def test_killed_read_runs_again_on_a_quorum_queue(dispatcher, worker, workspace):
    turn = dispatcher.submit([call("c1", "wait_read", label="a", seconds=3)], workspace=str(workspace))
    kill_pid(wait_started(dispatcher, turn.turn_id, "c1")["pid"])
    result = turn.results(60)[0]
    assert result.ok and result.attempts == 2, result.content


def test_cancel_on_a_quorum_queue(dispatcher, worker):
    turn = dispatcher.submit([call("c", "wait_read", label="x", seconds=60), call("d", "wait_write", label="x")])
    wait_started(dispatcher, turn.turn_id, "c")
    turn.cancel()
    assert [r.code for r in turn.results(timeout_s=10)] == [ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED]


def test_quorum_with_a_redis_broker_is_refused_naming_it():
    with pytest.raises(ValueError, match="needs a RabbitMQ broker"):
        Settings(broker_queue_type="quorum")
    with pytest.raises(ValueError, match="broker_queue_type"):
        Settings(broker_url="amqp://guest@127.0.0.1//", broker_queue_type="stream")
