"""The time-based promises of a turn, checked every tick of its driver (docs/design.md, "Cancellation
and time"; issue "Faults"). The dispatcher's own clock guarantees every call a result, whatever
happens to workers, messages or Redis:

- **Cancelled**: ``cancel_grace_s`` (+ slack) after the cancel, a call still running that has not
  confirmed its stop (a worker reports ``CANCELLED`` only once the handler stopped or its process
  was killed) is reported ``OUTCOME_UNKNOWN`` and its process killed; one never started is
  ``NOT_EXECUTED``. A frozen worker may only get the kill when it resumes, so the dispatcher never
  says ``CANCELLED`` itself.
- **Worker gone**: the worker that started a call stopped sending heartbeats (its catalog expired,
  :meth:`Availability.worker_dead`). It may be dead, or only frozen (a pause, a partition). When no
  live worker serves the tool, the call ends at once (``WORKER_LOST``; ``OUTCOME_UNKNOWN`` for a
  journaled write). Otherwise an idempotent call is sent again at once; a journaled one is sent
  again only once the first execution's deadline (hard limit) plus ``clock_skew_margin_s`` has
  passed, so the two can never act at the same time; any other call gets ``WORKER_LOST``. Every
  send again supersedes the earlier messages of the call (:meth:`Ledger.supersede`).
- **Hard limit passed**: a started call silent past its hard time limit + ``WATCHDOG_SLACK_S`` gets
  ``WORKER_LOST``.
- **No live worker serves the tool** (:func:`~.availability.liveness_bound_s`): a call sent and not
  started ends once its tool has been unserved for a heartbeat: ``TOOL_UNAVAILABLE`` (recorded
  "unless started"), or ``WORKER_LOST`` if it had started before (a call sent again).
- **A message nobody claims**: a call sent ``liveness_bound_s`` ago, not started and no longer in
  its queue is held by a worker that does not claim it (frozen with the message in its socket or
  its prefetch, or killed): it is sent again (superseding the held message).
- **Never started**: a call sent ``max_queue_wait_s`` ago that no worker started gets
  ``TOOL_UNAVAILABLE`` (recorded "unless started": the ledger then keeps it from ever running).

Whenever the dispatcher answers a call whose execution may still act, the turn's resource locks
are held until that execution's deadline plus the margin (:meth:`ResourceLocks.hold`), and the
execution itself is fenced: the call has a result, so its ``check_fence`` and its record refuse.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..ledger import not_executed
from ..models import ErrorCode, ToolResult
from .availability import liveness_bound_s
from .submit import hard_limit_s

if TYPE_CHECKING:
    from .turn import Turn

log = logging.getLogger(__name__)
WATCHDOG_SLACK_S = 3.0  # beyond a call's hard limit before the dispatcher calls its worker lost
CANCEL_SLACK_S = 0.25  # beyond cancel_grace_s before the dispatcher reports running calls itself


class Watchdog:
    def __init__(self, turn: Turn, availability: Any) -> None:
        self.turn = turn
        self.availability = availability
        self._held_checked: dict[str, float] = {}  # call id -> when its queue was last searched
        self._waiting_deadline: set[str] = set()  # journaled calls waiting out a silent holder

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
            self._check_uncancellable(pending, started, workers, now)
            return
        sent_at = turn._sender.sent_at
        bound_s = liveness_bound_s(turn._settings)
        for call_id in pending:
            run = turn._runnable.get(call_id)
            if run is None:
                continue
            if call_id in started:
                hard_s = self._hard_s(call_id)
                worker = workers.get(call_id, "")
                if worker and self.availability is not None and self.availability.worker_dead(worker):
                    self._worker_gone(call_id, worker, started[call_id], now)
                    continue
                if now >= started[call_id] + hard_s + WATCHDOG_SLACK_S:
                    self._lost(call_id, f"no result {hard_s + WATCHDOG_SLACK_S:g} s after the call started; "
                               "its worker is presumed lost", until_s=turn._settings.clock_skew_margin_s)
            elif call_id in sent_at:
                waited = now - sent_at[call_id]
                if waited > turn._settings.max_queue_wait_s:
                    self._never_started(call_id)
                elif self.availability is not None:
                    self._check_queued(call_id, run.spec, waited, bound_s, now)

    def _hard_s(self, call_id: str) -> float:
        """The call's hard limit (s): how long after its start its execution may still act."""
        turn = self.turn
        run = turn._runnable[call_id]
        return hard_limit_s(turn._settings, run.spec.time_limit_s(run.arguments))

    def _check_queued(self, call_id: str, spec: Any, waited: float, bound_s: float, now: float) -> None:
        """A call sent and not started: end it when no live worker serves its tool; send it again
        when its message left the queue and nobody claimed it within the liveness bound."""
        availability = self.availability
        if not self.turn._settings.require_live_worker:
            pass  # a fleet that scales from zero: calls wait for a worker (max_queue_wait_s)
        elif availability.unserved_for_s(spec.name) >= availability.unserved_confirm_s():
            self._unserved(call_id)
            return
        if waited < bound_s or now - self._held_checked.get(call_id, -1e9) < bound_s:
            return
        self._held_checked[call_id] = now
        turn = self.turn
        try:
            queued = availability.message_queued(availability.keys.queue(spec.queue), turn._submitted.get(call_id, ""))
        except Exception as exc:  # best effort: max_queue_wait_s still bounds the wait
            log.warning("turn %s: could not look for call %s in its queue (%s)", turn.turn_id, call_id, exc)
            return
        if queued is False:
            why = "a frozen or dead worker holds its message"
            dropped = availability.dropped_unsigned()
            if dropped:  # a newcomer's trial: a worker of another fleet key, not a frozen one, took them
                why += (f", or a worker holding another fleet key took it and dropped it unrun ({dropped} call "
                        "message(s) of this namespace failed a worker's fleet signature check so far; its log says "
                        "'dropped a call message that failed the fleet signature check': restart it with this "
                        "fleet's key)")
            log.warning("turn %s: call %s left its queue %.1f s ago and no worker claimed it (%s); sending it again",
                        turn.turn_id, call_id, waited, why)
            self._send_again(call_id)

    def _unserved(self, call_id: str) -> None:
        turn = self.turn
        run = turn._runnable[call_id]
        if turn._sender.resends.get(call_id):
            self._lost(call_id, f"its worker died and no live worker serves {run.spec.name!r} any more",
                       until_s=self._hard_s(call_id) + turn._settings.clock_skew_margin_s)
            return
        if turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, run.spec.name, ErrorCode.TOOL_UNAVAILABLE,
            f"no live worker serves the tool {run.spec.name!r} any more (their heartbeats stopped); it did not run",
            "start a worker that serves it, or ask again later",
        ), unless_started=True):
            self._failed_in_flower(call_id, ErrorCode.TOOL_UNAVAILABLE)

    def _send_again(self, call_id: str) -> None:
        """Send the call again; every earlier message of it can no longer claim it."""
        turn = self.turn
        turn._ledger.supersede(turn.turn_id, call_id)
        with turn._lock:
            turn._started.pop(call_id, None)
            turn._worker_of.pop(call_id, None)
        turn._sender.submit(call_id, resend=True)

    def _settle_cancelled(self, pending: list[str], started: dict[str, float]) -> None:
        """Answer the calls of a cancelled turn still without a result, ``cancel_grace_s`` after the
        cancel. ``NOT_EXECUTED`` only where the ledger confirms, in the same step, that no claim
        began the call (``unless_started``): a call this driver has not seen start may have started
        all the same (its started event not read yet), or have run before its message was sent
        again (its worker went silent); those, like the running ones, get ``OUTCOME_UNKNOWN``."""
        turn = self.turn
        stuck = []
        grace_s = turn._settings.cancel_grace_s
        for call_id in pending:
            run = turn._runnable.get(call_id)
            resent = bool(turn._sender.resends.get(call_id))
            running = call_id in started
            if not running and not resent:
                if turn._ledger.record_result(turn.turn_id, not_executed(call_id, turn._names[call_id]),
                                              unless_started=True):
                    continue  # never started: its message is revoked (Flower: REVOKED, it did not run)
                running = True  # refused: a claim began it (or it has a result: the record below is refused)
            cancellable = run is None or run.spec.cancellable
            if running and not cancellable:
                continue  # declared not cancellable, and an execution holds it: it runs to its end
            if running:
                why = (f"the turn was cancelled while the call ran; its worker did not confirm within {grace_s:g} s "
                       "that it stopped, so it was sent a kill; whether it took effect is unknown (a late step of "
                       "it is refused by its fencing check)")
            else:
                why = ("the turn was cancelled after the call had been sent again (its worker went silent while "
                       "running it); whether that first execution took effect is unknown (a late step of it is "
                       "refused by its fencing check); the message sent again will not run")
            result = ToolResult.failure(call_id, turn._names[call_id], ErrorCode.OUTCOME_UNKNOWN, why,
                                        "check the real state before repeating it")
            if not turn._ledger.record_result(turn.turn_id, result):
                continue  # it has a result already (its worker's, read soon): nothing to hold or kill
            self._hold_locks(self._hard_s(call_id) + turn._settings.clock_skew_margin_s)
            self._failed_in_flower(call_id, ErrorCode.OUTCOME_UNKNOWN)
            if cancellable:
                stuck.append(turn._submitted.get(call_id, ""))
        turn._submitter.revoke([t for t in stuck if t], kill=True)

    def _check_uncancellable(self, pending: list[str], started: dict[str, float], workers: dict[str, str],
                             now: float) -> None:
        """A cancelled turn's running calls declared not cancellable run to their end, so the
        cancel does not answer them; their worker may still die or go silent. Such a call gets
        ``WORKER_LOST`` (``OUTCOME_UNKNOWN`` for a journaled write) once its worker stopped sending
        heartbeats or it is silent past its hard limit + ``WATCHDOG_SLACK_S``; it is never sent
        again (its turn is over)."""
        turn = self.turn
        for call_id in pending:
            run = turn._runnable.get(call_id)
            if run is None or run.spec.cancellable or call_id not in started:
                continue
            hard_s = self._hard_s(call_id)
            until_s = started[call_id] + hard_s + turn._settings.clock_skew_margin_s - now
            code = ErrorCode.OUTCOME_UNKNOWN if run.spec.journal and not run.spec.idempotent else None
            worker = workers.get(call_id, "")
            if worker and self.availability is not None and self.availability.worker_dead(worker):
                self._lost(call_id, f"its worker {worker} stopped sending heartbeats while it ran (the turn was "
                           "cancelled; a call declared not cancellable is not sent again)", until_s=until_s, code=code)
            elif now >= started[call_id] + hard_s + WATCHDOG_SLACK_S:
                self._lost(call_id, f"no result {hard_s + WATCHDOG_SLACK_S:g} s after the call started; its worker "
                           "is presumed lost", until_s=turn._settings.clock_skew_margin_s, code=code)

    def _worker_gone(self, call_id: str, worker: str, started_at: float, now: float) -> None:
        turn = self.turn
        spec = turn._runnable[call_id].spec
        sender = turn._sender
        starts = sender.resends.get(call_id, 0) + 1
        # the silent worker may be frozen, not dead: its execution may act until its deadline
        until_s = started_at + self._hard_s(call_id) + turn._settings.clock_skew_margin_s - now
        why = f"its worker {worker} stopped sending heartbeats while it ran"
        if turn._settings.require_live_worker and self.availability.unserved_for_s(spec.name) > 0:
            self._lost(call_id, f"{why}, and no live worker serves {spec.name!r}", until_s=until_s,
                       code=ErrorCode.OUTCOME_UNKNOWN if spec.journal and not spec.idempotent else None)
            return
        if not (spec.idempotent or spec.journal) or starts >= turn._settings.max_attempts:
            self._lost(call_id, why, until_s=until_s)
            return
        if not spec.idempotent and until_s > 0:
            if call_id not in self._waiting_deadline:
                self._waiting_deadline.add(call_id)
                log.warning("turn %s: worker %s is silent; call %s is sent again once its first execution's "
                            "deadline has passed (%.1f s)", turn.turn_id, worker, call_id, until_s)
            return
        log.warning("turn %s: worker %s is gone; sending call %s again", turn.turn_id, worker, call_id)
        sender.resends[call_id] = starts
        self._send_again(call_id)

    def _lost(self, call_id: str, why: str, *, until_s: float = 0.0, code: ErrorCode | None = None) -> None:
        """Answer a started call whose worker went silent: ``WORKER_LOST`` (or ``code``). Its
        execution may still act for ``until_s``: the turn's locks are held that long."""
        turn = self.turn
        run = turn._runnable[call_id]
        kept = turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, run.spec.name, code or ErrorCode.WORKER_LOST, why,
            "the call may or may not have taken effect; check before repeating it",
        ))
        if kept:
            self._hold_locks(until_s)
            self._failed_in_flower(call_id, code or ErrorCode.WORKER_LOST)
        if kept and self.availability is not None:
            self.availability.report_lost(run.spec.name)

    def _hold_locks(self, seconds: float) -> None:
        locks = self.turn._sender.lock.locks
        if locks is None or seconds <= 0 or not self.turn._sender.lock.names:
            return
        self.turn._sender.lock.note_hold(seconds)  # the renewed lease covers it too
        try:
            locks.hold(self.turn.turn_id, seconds)
        except Exception as exc:  # the lock's own lease still bounds it
            log.warning("turn %s: could not hold its locks for a silent call (%s)", self.turn.turn_id, exc)

    def _never_started(self, call_id: str) -> None:
        turn = self.turn
        run = turn._runnable[call_id]
        wait_s = turn._settings.max_queue_wait_s
        if turn._sender.resends.get(call_id):
            self._lost(call_id, f"its worker died and no other worker took it up within {wait_s:g} s",
                       until_s=self._hard_s(call_id) + turn._settings.clock_skew_margin_s)
            return
        if turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, run.spec.name, ErrorCode.TOOL_UNAVAILABLE,
            f"no worker started the call within {wait_s:g} s (max_queue_wait_s); it did not run",
            "the workers serving this tool are busy or gone; ask again later",
        ), unless_started=True):
            self._failed_in_flower(call_id, ErrorCode.TOOL_UNAVAILABLE)

    def _failed_in_flower(self, call_id: str, code: ErrorCode) -> None:
        """A call this dispatcher ended after sending it: its task is a failed task in Flower too."""
        turn = self.turn
        turn._submitter.report_failed(turn._submitted.get(call_id, ""), code.value, turn._worker_of.get(call_id))
