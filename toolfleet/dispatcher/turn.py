"""The handle of a running turn: results as they finish and in model order, and ``cancel()``.

A turn takes its calls all at once (a whole response: :meth:`Dispatcher.submit`) or a few at a
time while a stream is read (:meth:`Turn.add_calls`, then :meth:`Turn.close`). Each call is
validated, planned against the calls taken before it (the plan rule only looks backwards, so this
is the plan of the whole batch), registered in the ledger, and submitted as soon as the calls it
waits for have results (:mod:`.turn_intake`).

A driver thread per turn (:mod:`.turn_driver`) reads the turn's event stream in Redis (push: ``XREAD
BLOCK``, no polling of Celery's result backend) and submits each call as soon as the calls it waits
for have results.
Sending goes through :class:`~toolfleet.dispatcher.sending.Sender` (resource locks across turns,
availability, broker trouble); the time-based promises are :mod:`~toolfleet.dispatcher.watchdog`'s:
after a cancel, calls still running past the grace period are reported ``CANCELLED`` and killed;
a call whose worker died is sent again or reported ``WORKER_LOST``; a call no worker takes gets
``TOOL_UNAVAILABLE``; so a lost worker or a lost message cannot hang the turn. When Redis comes
back after trouble, the driver restores the turn in the ledger (:meth:`Sender.reconcile`).

With a guard (:mod:`.guard`), each call taken is also screened by the policy: a refused call gets
its ``PERMISSION_DENIED`` or ``LOOP_DETECTED`` result and is not planned; a call the policy asks
about is *held*: planned but not submitted and without a result, so the turn stays open and the
calls that wait for it in the plan keep waiting. An ``approved`` event (from :meth:`Turn.approve`
or any other process) releases it; a denial arrives as its ``PERMISSION_DENIED`` result.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ToolfleetError, TurnNotFound
from ..ledger import Ledger
from ..models import ErrorCode, ToolCall, ToolResult
from ..observe.turns import observe_turn
from ..settings import Settings
from ..tools.registry import Registry
from .adapters.base import results_for
from .plan import Plan, Planner
from .sending import Sender
from .submit import Submitter
from .turn_approvals import TurnApprovals
from .turn_driver import _WAKE, TurnDriver
from .turn_intake import Runnable, TurnIntake
from .turn_intake import check_ids as check_ids  # re-exported: client.py
from .watchdog import Watchdog

if TYPE_CHECKING:
    from .approvals import PendingCall
    from .guard import Guard

log = logging.getLogger(__name__)
GIVE_UP_CANCEL_WAIT_S = 0.5
"""How long a give-up (``results(timeout_s)`` past its bound) waits for its cancel to reach Redis
before it raises; a cancel not confirmed by then is sent on by the turn's driver (s)."""


class Turn(TurnIntake, TurnApprovals, TurnDriver):
    """One batch in flight. Create through :meth:`toolfleet.Dispatcher.submit` (a whole batch),
    :meth:`~toolfleet.Dispatcher.submit_response`, :meth:`~toolfleet.Dispatcher.submit_stream` or
    :meth:`~toolfleet.Dispatcher.open_turn` (calls added as they come, then :meth:`close`)."""

    def __init__(
        self,
        *,
        turn_id: str,
        registry: Registry,
        ledger: Ledger,
        submitter: Submitter,
        settings: Settings,
        workspace: str | None,
        session_id: str | None,
        adapter: Any = None,
        response: Any = None,
        guard: Guard | None = None,
        availability: Any = None,
        locks: Any = None,
        armed: bool = True,
        events_after: str = "0-0",
        registered: Mapping[str, str] | None = None,
    ) -> None:
        self.turn_id = turn_id
        self._events_after = events_after  # the driver reads the turn's events after this stream id
        # calls (id -> name) the turn's open registered in the ledger: the first add_calls of exactly
        # those skips Ledger.add_calls (a cancel since then marked them, as it marks any registered call)
        self._registered = dict(registered or {})
        self.adapter = adapter
        self.response = response  # the provider payload the calls came from (rebuilt for a stream)
        self._registry = registry
        self._ledger = ledger
        self._submitter = submitter
        self._settings = settings
        self._workspace = workspace
        self._session_id = session_id
        self._calls: list[ToolCall] = []
        self._names: dict[str, str] = {}
        self._runnable: dict[str, Runnable] = {}
        self._planner = Planner()
        self._results: dict[str, ToolResult] = {}
        self._scheduled: set[str] = set()  # call ids handed (or being handed) to the submitter
        self._submitted: dict[str, str] = {}  # call id -> task id
        self._started: dict[str, float] = {}  # call id -> monotonic time its (latest) start was seen
        # when the turn's keys last got their time to live (open_turn, just before; each lease renewal)
        self._ttl_set_at = time.monotonic()
        self._worker_of: dict[str, str] = {}  # call id -> worker that started it
        self._finished: set[str] = set()
        self._completed: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._intake = threading.Lock()  # one add_calls/close at a time: model order is kept
        self._closed = False
        self._done = threading.Event()
        self._cancelled_at: float | None = None
        self._cancel_pending: str | None = None  # a cancel's reason until Redis took it
        self._cancel_reason: str | None = None  # the first cancel's reason (restored if Redis loses it)
        self._unrecorded: dict[str, str] = {}  # calls taken after a local cancel, not yet in the ledger
        self._cancel_failed = False  # a send of it failed: the driver sends it again (send_pending_cancel)
        self._error: ToolfleetError | None = None
        self._guard = guard
        self._held: dict[str, PendingCall] = {}  # waiting for a person
        self._changed = threading.Condition(self._lock)
        self.armed = armed  # workers may run its calls (see Ledger.arm); False until a batch is all sent
        self._abandoned = False
        self._obs = observe_turn(turn_id, session_id, registry.__contains__)  # traces, metrics; None when off
        self._sender = Sender(self, availability, locks)
        self._watch = Watchdog(self, availability)
        self._thread = threading.Thread(target=self._drive, name=f"toolfleet-turn-{turn_id}", daemon=True)

    # ---- public ----
    @property
    def calls(self) -> list[ToolCall]:
        """The calls taken so far, in model order."""
        with self._lock:
            return list(self._calls)

    @property
    def plan(self) -> Plan:
        """The plan of the runnable calls taken so far (calls with an error result have none)."""
        with self._lock:
            return self._planner.plan()

    @property
    def registry(self) -> Registry:
        """The tools the turn's calls are checked against."""
        return self._registry

    @property
    def closed(self) -> bool:
        """True once no more calls can be added."""
        return self._closed

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled_at is not None

    def arm(self) -> None:
        """Let workers run the calls sent so far (:meth:`~toolfleet.ledger.Ledger.arm`)."""
        self._ledger.arm(self.turn_id)
        self.armed = True

    def abandon(self) -> None:
        """The caller gives the turn up after a failed submission: no more calls, locks freed, and
        the driver no longer restores the turn in Redis."""
        self._abandoned = True
        self._sender.lock.release()
        self.close()
        with self._lock:
            missing = [c for c in self._calls if c.id not in self._results]
        self._settle_locally([ToolResult.failure(
            c.id, c.name, ErrorCode.NOT_EXECUTED, "the submission of the turn failed; this call did not run",
            "submit the calls again") for c in missing])
        if self._error is None:
            self._error = ToolfleetError(f"turn {self.turn_id} was abandoned: its submission failed")
        self._done.set()  # the driver thread ends within one read (BLOCK_MS)
        self._completed.put(_WAKE)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the turn is closed and every call has its result (True), or ``timeout_s``
        passes (False)."""
        return self._done.wait(timeout_s)

    def results(self, timeout_s: float | None = None, *, cancel_on_timeout: bool = True) -> list[ToolResult]:
        """Every call's result, in model order. Blocks until the turn is closed and all are in.

        Giving up is the end of the turn: when ``timeout_s`` passes first, the turn is cancelled
        (``cancel_on_timeout``, the default: calls not started never start, running ones are
        stopped; see :meth:`cancel`) and ``TimeoutError`` is raised; the final results are then
        in within ``cancel_grace_s`` (+ a little): read them with :meth:`result` or another
        ``results()``. Pass ``cancel_on_timeout=False`` to only stop waiting (the turn runs on), or
        poll with :meth:`wait`. Raises :class:`BrokerUnavailable` if Redis went away for good
        while waiting (``REDIS_GIVE_UP_S``, :mod:`.turn_driver`).
        """
        if not self._done.wait(timeout_s):
            self._give_up(timeout_s, cancel_on_timeout)
        if self._error is not None:
            raise self._error
        with self._lock:
            return [self._results[c.id] for c in self._calls]

    def _give_up(self, timeout_s: float | None, cancel: bool) -> None:
        waiting = [p.call_id for p in self.pending]
        note = f"; {len(waiting)} call(s) wait for approval: {', '.join(waiting)}" if waiting else ""
        if cancel and not self._done.is_set():
            note += "; the turn was cancelled (calls not started will not run)"
            problem = self._cancel_within(f"the caller gave up after {timeout_s} s", GIVE_UP_CANCEL_WAIT_S)
            if problem:
                note += f"; {problem}"
        raise TimeoutError(f"turn {self.turn_id} not finished after {timeout_s} s{note}")

    def _cancel_within(self, reason: str, wait_s: float) -> str | None:
        """:meth:`cancel` on a thread of its own, waited for ``wait_s`` at most, so a give-up keeps
        its bound when Redis is slow or paused (the cancel's reply waited for the socket's time-out,
        5 s, at each give-up). None once Redis took it, else what to tell the caller: the turn's
        driver sends a cancel Redis did not take until it does (:meth:`send_pending_cancel`), so it
        is not lost when Redis comes back (a breaker's find: the queued call ran after the caller
        was told the turn was cancelled)."""
        self._mark_cancelled(reason)
        failed: list[Exception] = []

        def send() -> None:
            try:
                self.cancel(reason)
            except Exception as exc:  # noqa: BLE001 - told to the caller; the driver sends it on
                failed.append(exc)

        sender = threading.Thread(target=send, name=f"toolfleet-cancel-{self.turn_id}", daemon=True)
        sender.start()
        sender.join(wait_s)
        if sender.is_alive():
            return f"Redis has not confirmed the cancel within {wait_s} s: it is sent until Redis answers"
        if failed:
            return f"Redis did not take the cancel ({failed[0]}): it is sent again until Redis answers"
        return None

    def as_completed(self, timeout_s: float | None = None, *, cancel_on_timeout: bool = True
                     ) -> Iterator[ToolResult]:
        """Yield each result the moment it is recorded (completion order), every call once, until
        the turn is closed and all are in. One consumer per turn. ``timeout_s`` and
        ``cancel_on_timeout`` as in :meth:`results` (giving up cancels the turn)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        yielded = 0
        while True:
            with self._lock:
                finished = self._closed and yielded >= len(self._calls)
            if self._error is not None and self._completed.empty():
                raise self._error
            if finished:
                return
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                item = self._completed.get(timeout=remaining)
            except queue.Empty:
                self._give_up(timeout_s, cancel_on_timeout)
            if item is not _WAKE:
                yielded += 1
                yield item

    def result(self, call_id: str) -> ToolResult | None:
        """The result of ``call_id`` if it is in, else None."""
        return self._results.get(call_id)

    def messages(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """The tool-result messages for the model's next request, in the batch's provider format
        (waits for every result; a ``timeout_s`` that passes cancels the turn, as in :meth:`results`)."""
        if self.adapter is None:
            raise ToolfleetError("this turn was submitted without a provider format")
        return results_for(self.adapter, self.results(timeout_s), self.response)

    def assistant_messages(self) -> list[dict[str, Any]]:
        """The model's own message (or output items) to put before :meth:`messages` in the next
        request, unchanged (rebuilt from the events for a stream); ``[]`` when unknown."""
        if self.adapter is None or self.response is None:
            return []
        return self.adapter.assistant_messages(self.response)

    def cancel(self, reason: str = "cancelled by caller") -> None:
        """Cancel the turn: calls not started never start (``NOT_EXECUTED``, also calls added
        later), running calls are stopped (``CANCELLED``), finished calls keep their results.
        Returns at once; results are final within ``cancel_grace_s`` (+ a little) afterwards."""
        self._mark_cancelled(reason)
        if self._obs is not None:
            self._obs.cancel(reason)
        self.send_pending_cancel()

    def cancel_soon(self, reason: str = "cancelled by caller") -> None:
        """:meth:`cancel` without waiting for Redis, for a thread that must not block (the asyncio
        API's event loop): the turn is cancelled here at once (nothing more of it is sent) and the
        cancel goes to Redis on a thread of its own; one Redis does not take is sent by the turn's
        driver until it does (:meth:`send_pending_cancel`). Raises nothing."""
        self._cancel_within(reason, 0.0)

    def _mark_cancelled(self, reason: str) -> None:
        with self._lock:
            if self._cancelled_at is None:
                self._cancelled_at = time.monotonic()
                self._cancel_reason = reason
            if not self._done.is_set():
                self._cancel_pending = reason

    def send_pending_cancel(self, retry: bool = False) -> None:
        """Write the cancel Redis has not taken yet (if any) to the ledger and revoke the messages
        of the calls not seen starting; raises what Redis raises (the cancel stays pending).
        ``retry`` (the driver, at each tick): only a cancel whose send failed, so a cancel under
        way on the caller's thread is not sent twice (a second revoke broadcast). Idempotent: a
        cancel sent twice is taken once."""
        with self._lock:  # at each tick: nothing to resend is one read, not a walk of the turn's calls
            reason = self._cancel_pending
            if reason is None or self._done.is_set() or (retry and not self._cancel_failed):
                return
            waiting = [t for c, t in self._submitted.items() if c not in self._started and c not in self._finished]
        try:
            try:
                self._ledger.cancel(self.turn_id, reason)
            except TurnNotFound:  # its keys are gone (expired): nothing of it can run
                pass
            self._submitter.revoke(waiting)
        except BaseException:
            with self._lock:
                self._cancel_failed = True
            raise
        with self._lock:
            if self._cancel_pending == reason:
                self._cancel_pending, self._cancel_failed = None, False

    def join_driver(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the driver thread to end (after the turn is done
        it still frees its locks and marks the turn ended in the ledger). True if it ended."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(timeout_s, 0.0))
        return not self._thread.is_alive()

    # ---- driver ----
    def start(self) -> Turn:
        """Start the driver thread (calls are submitted as they are added)."""
        _LIVE.add(self)
        self._thread.start()
        return self

    def ranks(self, call_ids: Iterable[str]) -> dict[str, int]:
        """The plan's rank of each of ``call_ids`` (:meth:`Planner.ranks`)."""
        with self._lock:
            return self._planner.ranks(call_ids)


_LIVE: weakref.WeakSet[Turn] = weakref.WeakSet()


@atexit.register
def _cancel_live_turns() -> None:
    """The dispatcher process exits (normally, or by an exception such as Ctrl-C): every turn it
    still drives is cancelled, so nothing of it runs later. (A process killed outright cannot do
    this: its turns' leases in Redis lapse within ``turn_lease_s`` and workers refuse them.)"""
    for turn in list(_LIVE):
        if not turn.done:
            try:
                turn.cancel("the dispatcher process exited")
            except Exception as exc:  # noqa: BLE001 - exiting anyway; the lease covers it
                log.warning("turn %s: could not cancel at exit (%s)", turn.turn_id, exc)
