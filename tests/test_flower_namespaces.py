"""Two fleets (namespaces) on one Redis database: the Flower of each (``toolfleet.monitor``) sees its
own workers' task events only. Found by a helper: the task events went to Celery's default exchange
``celeryev``, shared by every app on the database, so one stack's Flower listed another's workers
and tasks, with their (redacted) arguments."""

from __future__ import annotations

from toolfleet import Dispatcher
from toolfleet.monitor import monitor_app

from .conftest import make_registry
from .faults import call
from .test_audit import TaskEvents


def test_each_namespace_sees_its_own_task_events_only(settings, start_worker, workspace):
    other = settings.model_copy(update={"namespace": f"{settings.namespace}-other"})
    start_worker(settings=settings, concurrency=1)
    start_worker(settings=other, concurrency=1)
    with TaskEvents(monitor_app(settings)) as ours, Dispatcher(settings, make_registry()) as mine, \
            Dispatcher(other, make_registry()) as theirs:
        theirs_turn = theirs.submit([call("t", "list_dir", path=".")], workspace=str(workspace))
        mine_turn = mine.submit([call("m", "list_dir", path=".")], workspace=str(workspace))
        assert theirs_turn.results(timeout_s=60)[0].ok and mine_turn.results(timeout_s=60)[0].ok
        mine_id = f"{mine_turn.turn_id}:m"
        assert ours.wait_for(lambda events: any(e.get("uuid") == mine_id and e["type"] == "task-succeeded"
                                                for e in events), 30)
        theirs_id = f"{theirs_turn.turn_id}:t"
        # their task ended before ours was sent; its events would have come before ours
        assert not [e for e in ours.events if e.get("uuid") == theirs_id]
        assert not [e for e in ours.events if str(e.get("hostname", "")).endswith(other.namespace)]


def test_each_namespace_reaches_its_own_workers_only(settings, start_worker):
    """Control messages (a cancel's revoke, Flower's inspect) go to the namespace's own mailbox:
    an inspect from one fleet's monitor is answered by its workers only."""
    other = settings.model_copy(update={"namespace": f"{settings.namespace}-other"})
    start_worker(settings=settings, concurrency=1)
    start_worker(settings=other, concurrency=1)
    app = monitor_app(settings)
    try:
        replies = app.control.inspect(timeout=3.0).ping() or {}
    finally:
        app.close()
    assert any(settings.namespace in host and other.namespace not in host for host in replies), replies
    assert not [host for host in replies if other.namespace in host], replies
