"""The time-based promises of a turn, checked every tick of its driver (DESIGN.md, "Cancellation
and time"; issue "Faults"). The dispatcher's own clock guarantees every call a result, whatever
happens to workers, messages or Redis:

- **Cancelled**: ``cancel_grace_s`` (+ slack) after the cancel, a call still running is reported
  ``CANCELLED`` and its process killed; one never started is ``NOT_EXECUTED``.
- **Worker gone**: the worker that started a call stopped sending heartbeats (its catalog expired,
  :meth:`Availability.worker_dead`). An idempotent or journaled call is sent again (up to
  ``max_attempts`` starts; the journal keeps a write from happening twice); any other call gets
  ``WORKER_LOST``. This is what saves a turn when a whole worker host vanishes: with a Redis broker
  its unacknowledged messages only come back after the visibility timeout.
- **Hard limit passed**: a started call silent past its hard time limit + ``WATCHDOG_SLACK_S`` gets
  ``WORKER_LOST``.
- **Never started**: a call sent ``max_queue_wait_s`` ago that no worker started gets
  ``TOOL_UNAVAILABLE`` (recorded "unless started": the ledger then keeps it from ever running).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..ledger import not_executed
from ..models import ErrorCode, ToolResult
from .submit import SOFT_LIMIT_MARGIN_S

if TYPE_CHECKING:
    from .turn import Turn

log = logging.getLogger(__name__)
WATCHDOG_SLACK_S = 3.0  # beyond a call's hard limit before the dispatcher calls its worker lost
CANCEL_SLACK_S = 0.25  # beyond cancel_grace_s before the dispatcher reports running calls itself


class Watchdog:
    def __init__(self, turn: Turn, availability: Any) -> None:
        self.turn = turn
        self.availability = availability

    def tick(self) -> None:
        turn = self.turn
        now = time.monotonic()
        with turn._lock:
            cancelled_at = turn._cancelled_at
            pending = [c for c in turn._names if c not in turn._results]
            started = dict(turn._started)
            workers = dict(turn._worker_of)
        if cancelled_at is not None:
            if now >= cancelled_at + turn._settings.cancel_grace_s + CANCEL_SLACK_S:
                self._settle_cancelled(pending, started)
            return
        sent_at = turn._sender.sent_at
        for call_id in pending:
            run = turn._runnable.get(call_id)
            if run is None:
                continue
            if call_id in started:
                worker = workers.get(call_id, "")
                if worker and self.availability is not None and self.availability.worker_dead(worker):
                    self._worker_gone(call_id, worker)
                    continue
                hard_s = run.spec.time_limit_s(run.arguments) + SOFT_LIMIT_MARGIN_S + turn._settings.kill_grace_s
                if now >= started[call_id] + hard_s + WATCHDOG_SLACK_S:
                    self._lost(call_id, f"no result {hard_s + WATCHDOG_SLACK_S:g} s after the call started; "
                               "its worker is presumed lost")
            elif call_id in sent_at and now - sent_at[call_id] > turn._settings.max_queue_wait_s:
                self._never_started(call_id)

    def _settle_cancelled(self, pending: list[str], started: dict[str, float]) -> None:
        turn = self.turn
        stuck = []
        for call_id in pending:
            run = turn._runnable.get(call_id)
            if call_id in started and run is not None and not run.spec.cancellable:
                continue  # declared not cancellable: it runs to its end
            if call_id in started:
                stuck.append(turn._submitted.get(call_id, ""))
                result = ToolResult.failure(
                    call_id, turn._names[call_id], ErrorCode.CANCELLED,
                    "the turn was cancelled while the call ran; it did not stop in time and was killed",
                    "the call may have done part of its work; check before repeating it",
                )
            else:
                result = not_executed(call_id, turn._names[call_id])
            turn._ledger.record_result(turn.turn_id, result)
        turn._submitter.revoke([t for t in stuck if t], kill=True)

    def _worker_gone(self, call_id: str, worker: str) -> None:
        turn = self.turn
        run = turn._runnable[call_id]
        sender = turn._sender
        starts = sender.resends.get(call_id, 0) + 1
        if (run.spec.idempotent or run.spec.journal) and starts < turn._settings.max_attempts:
            log.warning("turn %s: worker %s is gone; sending call %s again", turn.turn_id, worker, call_id)
            with turn._lock:
                turn._started.pop(call_id, None)
                turn._worker_of.pop(call_id, None)
            sender.resends[call_id] = starts
            sender.submit(call_id, resend=True)
            return
        self._lost(call_id, f"its worker {worker} stopped sending heartbeats while it ran")

    def _lost(self, call_id: str, why: str) -> None:
        turn = self.turn
        run = turn._runnable[call_id]
        kept = turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, run.spec.name, ErrorCode.WORKER_LOST, why,
            "the call may or may not have taken effect; check before repeating it",
        ))
        if kept and self.availability is not None:
            self.availability.report_lost(run.spec.name)

    def _never_started(self, call_id: str) -> None:
        turn = self.turn
        run = turn._runnable[call_id]
        wait_s = turn._settings.max_queue_wait_s
        if turn._sender.resends.get(call_id):
            self._lost(call_id, f"its worker died and no other worker took it up within {wait_s:g} s")
            return
        turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, run.spec.name, ErrorCode.TOOL_UNAVAILABLE,
            f"no worker started the call within {wait_s:g} s (max_queue_wait_s); it did not run",
            "the workers serving this tool are busy or gone; ask again later",
        ), unless_started=True)
