"""Task events for Flower, published in batches.

Celery buffers a worker's task events (received, started, succeeded, ...) and publishes them at
the next turn of the worker's event loop: with short calls that is one Redis publish per event,
about three round trips per call from the worker's main process, which the benchmark's profile
showed to be a third of that process's time (``bench/fixes.md``). This consumer bootstep lets the
buffer fill for up to ``FLUSH_INTERVAL_S`` before it is published (Celery still publishes at once
when 24 events are buffered): one publish carries many events, and Flower sees each event at
most that much later.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps
from celery.worker.consumer.events import Events
from kombu.common import ignore_errors

FLUSH_INTERVAL_S = 0.1


class BatchedTaskEvents(bootsteps.StartStopStep):
    """Consumer bootstep: publish buffered task events at most every ``FLUSH_INTERVAL_S``."""

    requires = (Events,)

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None or c.hub is None or dispatcher.on_send_buffered is None:
            return  # events off, or no event loop (then Celery does not buffer)
        hub = c.hub
        scheduled = [False]

        def flush() -> None:
            scheduled[0] = False
            dispatcher.flush()

        def on_buffered() -> None:
            if not scheduled[0]:
                scheduled[0] = True
                hub.call_later(FLUSH_INTERVAL_S, flush)

        dispatcher.on_send_buffered = on_buffered

    def stop(self, c: Any) -> None:
        if c.event_dispatcher is not None:
            ignore_errors(c, c.event_dispatcher.flush)

    shutdown = stop
