"""The ``task-sent`` events of a group of calls, published as one message.

With ``Settings.task_sent_events`` Celery publishes a ``task-sent`` event per message it sends
(``task_send_sent_event``), so Flower lists queued calls as ``PENDING``: one more broker publish per
call. A group the dispatcher sends together (:meth:`~toolfleet.dispatcher.submit.Submitter.batch`)
hands Celery a :class:`SentEvents` as its ``event_dispatcher`` instead, which keeps the group's
events and publishes them at the end of the batch as one ``task.multi`` message: Celery's own form
for a run of task events (a worker's buffered events, ``celery.events.dispatcher.EventDispatcher.flush``),
which Celery's event receiver, and so Flower, reads as the events one by one.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.events.event import Event
from celery.utils.time import utcoffset


def event_dispatcher(app: Celery) -> Any:
    """A disabled Celery event dispatcher of ``app`` (its exchange, hostname, clock, serializer),
    built once per app and process: building one opens a broker ``Connection`` object, about
    0.1 ms, which each group sent paid. Kept on the app itself, as Celery keeps its own
    (``AMQP._event_dispatcher``), so it goes with the app; rebuilt in a forked child (its pid and
    hostname). Two threads building it at once both get a working one: no lock to hold over a fork."""
    pid = os.getpid()
    cached = getattr(app, "_toolfleet_sent_events", None)
    if cached is None or cached[0] != pid:
        cached = (pid, app.events.Dispatcher(enabled=False))
        app._toolfleet_sent_events = cached  # type: ignore[attr-defined]
    return cached[1]


class SentEvents:
    """Collects the ``task-sent`` events of one batch's sends (``publish``, the one method Celery
    calls on an ``event_dispatcher``) and publishes them with :meth:`flush`. One per batch, one thread."""

    def __init__(self, app: Celery) -> None:
        self.dispatcher = event_dispatcher(app)  # Celery's defaults: exchange, hostname, clock
        self.events: list[dict[str, Any]] = []

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **_options: Any) -> None:
        """Celery's ``EventDispatcher.publish``, deferred: the event is stamped now (time, clock)."""
        d = self.dispatcher
        self.events.append(Event(type, hostname=d.hostname, utcoffset=utcoffset(), pid=d.pid,
                                 clock=d.clock.forward(), **fields))

    def flush(self, producer: Any) -> None:
        """Publish the events kept so far as one ``task.multi`` message with ``producer`` (inside
        the batch: in its transaction), then forget them."""
        if not self.events:
            return
        d = self.dispatcher
        producer.publish(list(self.events), routing_key="task.multi", exchange=d.exchange.name, declare=[d.exchange],
                         serializer=d.serializer, headers=d.headers, delivery_mode=d.delivery_mode, retry=False)
        self.events.clear()
