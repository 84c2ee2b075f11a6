"""The configuration the fault promises rest on: late acknowledgement with redelivery on worker
loss, a visibility timeout longer than any call, and settings that cannot be nonsense."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from toolfleet import ConfigurationError, Settings, create_app
from toolfleet.worker.app import TASK_NAME, longest_hard_limit_s, visibility_timeout_s

from .conftest import make_registry


def test_calls_are_acknowledged_late_and_redelivered_when_their_worker_dies():
    app = create_app(Settings(namespace="cfg"), make_registry())
    task = app.tasks[TASK_NAME]
    assert task.acks_late and task.reject_on_worker_lost and task.ignore_result
    assert app.conf.worker_prefetch_multiplier == 1


def test_visibility_timeout_exceeds_longest_hard_limit_plus_queue_wait():
    settings = Settings(namespace="cfg", max_queue_wait_s=300)
    registry = make_registry()
    longest = longest_hard_limit_s(settings, registry)
    assert longest >= 3600  # run_command may ask for an hour
    assert visibility_timeout_s(settings, registry) > longest + settings.max_queue_wait_s
    app = create_app(settings, registry)
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == visibility_timeout_s(settings, registry)
    assert options["unacked_key"] == "cfg.unacked"  # not shared with other apps on the database


def test_each_app_runs_its_own_calls():
    first = create_app(Settings(namespace="one"), make_registry())
    second = create_app(Settings(namespace="two"), make_registry())
    assert first.tasks[TASK_NAME] is not second.tasks[TASK_NAME]
    assert first.toolfleet.settings.namespace == "one" and second.toolfleet.settings.namespace == "two"


def test_too_short_visibility_timeout_is_refused():
    with pytest.raises(ConfigurationError, match="visibility_timeout_s"):
        create_app(Settings(namespace="cfg", visibility_timeout_s=600), make_registry())


def test_rabbitmq_broker_gets_no_redis_transport_options():
    app = create_app(Settings(namespace="cfg", broker_url="amqp://guest:guest@127.0.0.1:5672//"), make_registry())
    assert app.conf.broker_transport_options == {}
    assert app.conf.broker_transport is None


@pytest.mark.parametrize("field", ["heartbeat_s", "max_queue_wait_s", "lock_lease_s", "max_attempts"])
def test_settings_refuse_non_positive_values(field):
    with pytest.raises(ValidationError):
        Settings(**{field: 0})
