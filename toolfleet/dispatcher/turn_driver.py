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

import redis

from ..errors import BrokerUnavailable, ToolfleetError
from ..ledger import not_executed
from ..models import ErrorCode, ToolResult
from ..redis_client import REDIS_DOWN
from .plan import conflicts

log = logging.getLogger(__name__)
BLOCK_MS = 100
# the watchdog's bounds are seconds long: while events stream in, it looks at most this often (an
# idle driver looks every BLOCK_MS anyway), not once per event read (O(pending calls) each time)
WATCH_EVERY_S = BLOCK_MS / 2000
REDIS_GIVE_UP_S = 60.0  # Redis failing this long without a good tick ends the turn (BrokerUnavailable)
BUG_GIVE_UP_TICKS = 5  # a non-Redis exception this many ticks in a row ends the turn the same way
TROUBLE_LOG_EVERY_S = 5.0  # while failing, one warning this often (not one per retry)
_WAKE = object()  # put on the completion queue when the turn closes or fails


def after_trouble_quiet_s(settings: Any) -> float:
    """After Redis answers again: how long the watchdog waits before judging calls lost. Three
    heartbeats (a worker's catalog comes back within one) + 2 s (a worker retries a result with
    a backoff of at most 1 s)."""
    return 3 * settings.heartbeat_s + 2.0


class TurnDriver:
    """``_drive`` (the driver thread's loop) and what it does per event."""

    def _submit_ranked(self, call_ids: list[str], raise_errors: bool = False) -> None:
        """Submit ``call_ids`` that just became ready, together, the heads of the longest chains
        first (:meth:`Sender.send_group`), their ``submitted`` audit events written first."""
        if not call_ids:
            return
        self._sender.send_group(call_ids, raise_errors=raise_errors, announce=True)

    def _submit(self, call_id: str, raise_errors: bool = False) -> None:
        self._sender.submit(call_id, raise_errors=raise_errors)

    def _drive(self) -> None:
        """The driver thread's loop, bounded: it ends when the turn is done, or when its ticks
        have failed for ``REDIS_GIVE_UP_S`` in a row (Redis errors: the turn ends with
        :class:`BrokerUnavailable` for the caller) or ``BUG_GIVE_UP_TICKS`` times in a row (any
        other exception: a fault of ours, reported the same way rather than retried forever).
        Only a tick that did all its work resets the count."""
        last = self._events_after  # the turn's own open event: nothing to read in it (one wake fewer)
        failures = 0
        trouble_since: float | None = None
        logged_at = 0.0
        lease_renewed_at = time.monotonic()  # open_turn set it
        quiet_until = 0.0  # the watchdog waits until then after Redis trouble
        watched_at = 0.0
        try:
            while not self._done.is_set():
                try:
                    self.send_pending_cancel(retry=True)  # a cancel Redis did not take (turn.py): again
                    for event in self._ledger.events(self.turn_id, after=last, block_ms=BLOCK_MS):
                        last = event.stream_id
                        self._on_event(event)
                    if trouble_since is not None or self._sender.redis_lost_the_turn():
                        self._sender.reconcile()
                    self._record_unrecorded()  # after reconcile: its writes would hide a loss of Redis's data
                    if time.monotonic() - lease_renewed_at >= self._settings.turn_lease_s / 6:
                        # locks first: a turn that lost them (paused past their lease) answers its
                        # writes not started before its renewed lease lets a worker claim one
                        self._sender.lock.renew()
                        self._ledger.renew_lease(self.turn_id)
                        lease_renewed_at = self._ttl_set_at = time.monotonic()
                    self._sender.pump()
                    now = time.monotonic()
                    if now >= quiet_until and now - watched_at >= WATCH_EVERY_S:
                        self._watch.tick()
                        watched_at = now
                    if trouble_since is not None:
                        log.warning("turn %s: Redis answers again after %.1f s", self.turn_id,
                                    time.monotonic() - trouble_since)
                        # workers retry their results and heartbeats with backoff: give them time
                        # to land before the watchdog judges a call lost (a finished call keeps its result)
                        quiet_until = time.monotonic() + after_trouble_quiet_s(self._settings)
                    failures, trouble_since = 0, None
                except Exception as exc:  # Redis trouble: retry for a while, then give up loudly
                    now = time.monotonic()
                    failures += 1
                    trouble_since = now if trouble_since is None else trouble_since
                    redis_trouble = isinstance(exc, (*REDIS_DOWN, redis.RedisError, BrokerUnavailable))
                    if failures == 1 or now - logged_at >= TROUBLE_LOG_EVERY_S:
                        logged_at = now
                        log.warning("turn %s: %s (%s: %s); failing for %.1f s", self.turn_id,
                                    "Redis trouble" if redis_trouble else "driver fault", type(exc).__name__,
                                    exc, now - trouble_since)
                    if (now - trouble_since >= REDIS_GIVE_UP_S if redis_trouble
                            else failures >= BUG_GIVE_UP_TICKS):
                        self._fail(exc, now - trouble_since, redis_trouble)
                        return
                    time.sleep(min(0.05 * 2 ** min(failures, 5), 1.0))
        finally:
            self._sender.lock.release()
            self._end()

    def _record_unrecorded(self) -> None:
        """Register the calls the turn took after its local cancel (:meth:`TurnIntake._take`) in the
        ledger with the result ``NOT_EXECUTED``; the result events bring them to this turn as any
        result. Raises what Redis raises (they stay to write; :meth:`_fail` answers them
        ``NOT_EXECUTED`` if Redis never comes back)."""
        with self._lock:
            names = dict(self._unrecorded)
        if not names:
            return
        refused = self._ledger.add_calls(self.turn_id, names)  # cancelled there too: recorded NOT_EXECUTED
        for call_id, name in names.items():  # the cancel not there yet: recorded here (the first result stands)
            if call_id not in refused:
                self._ledger.record_result(self.turn_id, not_executed(call_id, name))
        with self._lock:
            for call_id in names:
                self._unrecorded.pop(call_id, None)

    def _end(self) -> None:
        """The turn is over: mark it ended in the ledger (a worker's claim then refuses its calls,
        so nothing of it runs later). Best effort: if Redis does not answer, the turn's lease
        lapses within ``turn_lease_s`` with the same effect."""
        if self.cancelled:
            why = "cancelled"
        elif self._error is not None:
            why = f"ended by an error: {self._error}"
        else:
            why = "every call has its result"
        if self._obs is not None:
            self._obs.end("cancelled" if self.cancelled else "error" if self._error is not None else "ok")
        try:
            self._ledger.end_turn(self.turn_id, why, ttl_set_s_ago=time.monotonic() - self._ttl_set_at)
        except Exception as exc:  # noqa: BLE001 - the lease covers it
            log.warning("turn %s: could not mark the turn ended (%s); its lease lapses within %g s",
                        self.turn_id, exc, self._settings.turn_lease_s)

    def _fail(self, exc: Exception, for_s: float, redis_trouble: bool = True) -> None:
        """End the turn after persistent trouble: the caller's ``results()`` raises :class:`BrokerUnavailable`
        (:class:`ToolfleetError` for a fault of ours); every call without a result gets a final one here
        (local: Redis may not be answering) so ``as_completed`` and ``result()`` account for every call. A
        call never sent: ``TOOL_UNAVAILABLE`` (it cannot run later: its turn's lease in Redis lapses,
        :meth:`~toolfleet.ledger.Ledger.claim_start` refuses it); one sent: ``OUTCOME_UNKNOWN``."""
        detail = f"{type(exc).__name__}: {exc} (for {for_s:.1f} s)"
        self._error = (BrokerUnavailable(self._settings.redis_url, detail) if redis_trouble
                       else ToolfleetError(f"turn {self.turn_id}: its driver failed: {detail}"))
        with self._lock:
            missing = [c for c in self._names if c not in self._results]
            sent = set(self._submitted)
        results = []
        for call_id in missing:
            name = self._names[call_id]
            if call_id in sent:
                result = ToolResult.failure(
                    call_id, name, ErrorCode.OUTCOME_UNKNOWN,
                    f"the turn's driver failed ({detail}) after the call was sent; whether it ran is unknown",
                    "check the call's effect before repeating it")
            else:
                result = self._never_sent(call_id, name, f"the turn's driver failed ({detail}) before the call "
                                          "was sent; it did not run", "retry when Redis is back")
            results.append(result)
        self._settle_locally(results)

    def _never_sent(self, call_id: str, name: str, why: str, hint: str) -> ToolResult:
        """The local answer for a call this process never sent and will not: ``NOT_EXECUTED`` once the
        turn is cancelled (the cancel's answer, whatever else failed), else ``TOOL_UNAVAILABLE`` saying ``why``."""
        if self.cancelled:
            return not_executed(call_id, name)
        return ToolResult.failure(call_id, name, ErrorCode.TOOL_UNAVAILABLE, why, hint)
        self._done.set()
        self._completed.put(_WAKE)
        with self._changed:
            self._changed.notify_all()

    def _settle_locally(self, results: list[ToolResult]) -> None:
        """Final results decided by this process alone (Redis may be what failed): kept in the
        handle, nothing scheduled from them; a call that already has a result keeps it."""
        for result in results:
            with self._lock:
                if result.call_id in self._results:
                    continue
                self._results[result.call_id] = result
                self._mark_finished(result.call_id)
                all_in = self._closed and len(self._results) == len(self._calls)
                self._changed.notify_all()
            if self._obs is not None:
                self._obs.finished(result)
            self._completed.put(result)
            if all_in:
                self._done.set()

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
            self._held.pop(result.call_id, None)  # denied, or cancelled while held
            ready = self._now_ready(result.call_id)
            self._changed.notify_all()
            cancelled = self._cancelled_at is not None
            if not cancelled:
                self._scheduled.update(ready)
            all_in = self._closed and len(self._results) == len(self._calls)
        if self._obs is not None:
            self._obs.finished(result)
        self._completed.put(result)
        if not cancelled:
            self._submit_ranked(ready)
        if all_in:
            self._sender.lock.release()
            self._done.set()
            with self._changed:
                self._changed.notify_all()

    # ---- finished calls (under self._lock) ----
    # A call waits for its immediate predecessors in the plan only (plan.py), so "finished" must
    # mean "has its result and so has every call it waits for": a call that has its result before
    # the calls it waits for (denied while they ran) counts as finished only once they are, or the
    # call after it would start beside them. Each result costs its dependents, not the plan (a
    # count of unfinished dependencies per call, kept from its first use).

    def _now_ready(self, call_id: str) -> list[str]:
        """``call_id`` has just got its result: the calls that may start now, in model order. Those
        whose deps are all finished, and, while some call had its result early (:meth:`_ready`),
        the calls after one of those that the rule lets start: a read after a write denied while
        an earlier read runs starts beside that read, as with every conflicting call a dependency.
        Without early results the counts alone decide (each result costs its dependents)."""
        candidates = set(self._finish(call_id))
        early = self._early_results()
        if call_id not in self._finished:
            early.add(call_id)
        early -= self._finished
        for e in early:  # a call ready by the rule and not by the counts waits for one of these directly
            candidates.update(d for d in self._planner.dependents.get(e, ()) if self._ready(d))
        return sorted((d for d in candidates
                       if d not in self._scheduled and d not in self._results and d not in self._held),
                      key=self._planner.position)

    def _ready(self, call_id: str) -> bool:
        """The plan rule, from the immediate deps: every earlier call ``call_id`` conflicts with has
        its result. A finished dep covers the calls it waits for; one that had its result early (denied
        or cancelled while held, before the calls it waits for ended) does not, so the search goes on
        through it, and only the calls without a result that conflict with ``call_id`` hold it back.
        Linear in the unfinished calls before it (none in a batch without early results)."""
        item = self._planner.item(call_id)
        seen: set[str] = set()
        stack = list(self._planner.deps.get(call_id, ()))
        while stack:
            d = stack.pop()
            if d in seen or d in self._finished:
                continue
            seen.add(d)
            if d not in self._results and conflicts(self._planner.item(d), item):
                return False
            stack.extend(self._planner.deps.get(d, ()))
        return True

    def _early_results(self) -> set[str]:
        """Calls with a result and not finished yet (kept from one result to the next)."""
        early: set[str] | None = getattr(self, "_early", None)
        if early is None:
            early = self._early = set()
        return early

    def _finish(self, call_id: str) -> list[str]:
        """``call_id`` has its result: count it finished (when the calls it waits for are), and with
        it each call that had its result early and waited for it; return the calls now ready."""
        ready: list[str] = []
        todo = [call_id]
        while todo:
            c = todo.pop()
            if c in self._finished or self._unfinished_deps(c):
                continue
            for d in self._mark_finished(c):
                (todo if d in self._results else ready).append(d)
        return ready

    def _mark_finished(self, call_id: str) -> list[str]:
        """Add ``call_id`` to ``_finished``; return its dependents whose dependencies are now all finished."""
        self._finished.add(call_id)
        counts = self._deps_left()
        out = []
        for d in self._planner.dependents.get(call_id, ()):
            left = counts.get(d)
            left = counts[d] = self._count_unfinished(d) if left is None else left - 1
            if left == 0:
                out.append(d)
        return out

    def _unfinished_deps(self, call_id: str) -> int:
        counts = self._deps_left()
        left = counts.get(call_id)
        if left is None:
            left = counts[call_id] = self._count_unfinished(call_id)
        return left

    def _count_unfinished(self, call_id: str) -> int:
        return sum(1 for d in self._planner.deps.get(call_id, ()) if d not in self._finished)

    def _deps_left(self) -> dict[str, int]:
        """Per call (once counted): how many of the calls it waits for are not finished."""
        counts: dict[str, int] | None = getattr(self, "_deps_left_counts", None)
        if counts is None:
            counts = self._deps_left_counts = {}
        return counts


def _worker(data: str) -> str:
    """The worker named in a ``started`` event's data."""
    try:
        return str(json.loads(data).get("worker") or "")
    except (ValueError, AttributeError):
        return ""
