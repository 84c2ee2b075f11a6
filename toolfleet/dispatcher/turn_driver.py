"""The driver of a :class:`~toolfleet.dispatcher.turn.Turn`: one thread per turn that reads the
turn's event stream in Redis (push: ``XREAD BLOCK``, no polling of Celery's result backend),
records results as they arrive, submits each call once the calls it waits for have results, and
runs the sender's and the watchdog's periodic work.

A mixin, like :mod:`.turn_approvals`: the state it reads and writes (``_lock``, ``_changed``,
``_results``, ``_planner``, ``_sender``, ...) is the turn's own, and turn.py keeps the handle's
public side (taking calls, results, cancel).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ..errors import BrokerUnavailable
from ..models import ToolResult

log = logging.getLogger(__name__)
BLOCK_MS = 100
REDIS_GIVE_UP_FAILURES = 50  # consecutive failed reads (about 45 s) before the turn fails loudly
_WAKE = object()  # put on the completion queue when the turn closes or fails


class TurnDriver:
    """``_drive`` (the driver thread's loop) and what it does per event."""

    def _submit_ranked(self, call_ids: list[str], raise_errors: bool = False) -> None:
        """Submit ``call_ids`` that just became ready, together, the heads of the longest chains
        first (:meth:`Sender.send_group`), their ``submitted`` audit events written first."""
        if not call_ids:
            return
        self._submitter.announce(self.turn_id, [(c, self._runnable[c].spec) for c in call_ids])
        self._sender.send_group(call_ids, raise_errors=raise_errors)

    def _submit(self, call_id: str, raise_errors: bool = False) -> None:
        self._sender.submit(call_id, raise_errors=raise_errors)

    def _drive(self) -> None:
        last = "0-0"
        failures = 0
        try:
            while not self._done.is_set():
                try:
                    for event in self._ledger.events(self.turn_id, after=last, block_ms=BLOCK_MS):
                        last = event.stream_id
                        self._on_event(event)
                    if failures or self._sender.redis_lost_the_turn():
                        self._sender.reconcile()
                        failures = 0
                    self._sender.pump()
                    self._watch.tick()
                except Exception as exc:  # Redis trouble: retry for a while, then give up loudly
                    failures += 1
                    log.warning("turn %s: Redis trouble (%s)", self.turn_id, exc)
                    if failures > REDIS_GIVE_UP_FAILURES:
                        self._error = BrokerUnavailable(self._settings.redis_url, str(exc))
                        self._done.set()
                        self._completed.put(_WAKE)
                        with self._changed:
                            self._changed.notify_all()
                        return
                    time.sleep(min(0.05 * failures, 1.0))
        finally:
            self._sender.release_locks()

    def _on_event(self, event: Any) -> None:
        if event.type == "started":
            worker = _worker(event.data)
            with self._lock:
                self._started[event.call_id] = time.monotonic()
                if worker:
                    self._worker_of[event.call_id] = worker
        elif event.type == "cancel":
            with self._lock:
                if self._cancelled_at is None:
                    self._cancelled_at = time.monotonic()
        elif event.type == "result":
            self._on_result(event.result())
        elif event.type == "approved":
            self._on_approved(event.call_id)

    def _on_result(self, result: ToolResult) -> None:
        with self._lock:
            if result.call_id in self._results or result.call_id not in self._names:
                return
            self._results[result.call_id] = result
            self._finished.add(result.call_id)
            self._held.pop(result.call_id, None)  # denied, or cancelled while held
            ready = [
                d
                for d in self._planner.dependents.get(result.call_id, ())
                if d not in self._scheduled and d not in self._finished and d not in self._held
                and self._planner.deps[d] <= self._finished
            ]
            self._changed.notify_all()
            cancelled = self._cancelled_at is not None
            if not cancelled:
                self._scheduled.update(ready)
            all_in = self._closed and len(self._results) == len(self._calls)
        self._completed.put(result)
        if not cancelled:
            self._submit_ranked(ready)
        if all_in:
            self._sender.release_locks()
            self._done.set()
            with self._changed:
                self._changed.notify_all()


def _worker(data: str) -> str:
    """The worker named in a ``started`` event's data."""
    try:
        return str(json.loads(data).get("worker") or "")
    except (ValueError, AttributeError):
        return ""
