"""The handle of a running turn: results as they finish and in model order, and ``cancel()``.

A driver thread per turn reads the turn's event stream in Redis (push: ``XREAD BLOCK``, no polling
of Celery's result backend), submits each call as soon as the calls it waits for have results,
and watches the time: after a cancel, calls still running past the grace period are reported
``CANCELLED`` and killed; a started call silent past its hard time limit is reported
``WORKER_LOST``, so a lost worker cannot hang the turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BrokerUnavailable, ToolfleetError
from ..ledger import Ledger, not_executed
from ..models import ErrorCode, ToolCall, ToolResult
from ..settings import Settings
from ..tools.spec import ToolSpec
from .plan import Plan
from .submit import Submitter

log = logging.getLogger(__name__)
WATCHDOG_SLACK_S = 3.0  # beyond a call's hard limit before the dispatcher calls its worker lost
CANCEL_SLACK_S = 0.25  # beyond cancel_grace_s before the dispatcher reports running calls itself
BLOCK_MS = 100


@dataclass(frozen=True)
class Runnable:
    spec: ToolSpec
    arguments: dict[str, Any]


class Turn:
    """One batch in flight. Create through :meth:`toolfleet.Dispatcher.submit`."""

    def __init__(
        self,
        *,
        turn_id: str,
        calls: Sequence[ToolCall],
        plan: Plan,
        runnable: dict[str, Runnable],
        ledger: Ledger,
        submitter: Submitter,
        settings: Settings,
        workspace: str | None,
        session_id: str | None,
        adapter: Any = None,
    ) -> None:
        self.turn_id = turn_id
        self.calls = list(calls)
        self.plan = plan
        self.adapter = adapter
        self._runnable = runnable
        self._ledger = ledger
        self._submitter = submitter
        self._settings = settings
        self._workspace = workspace
        self._session_id = session_id
        self._names = {c.id: c.name for c in calls}
        self._results: dict[str, ToolResult] = {}
        self._submitted: dict[str, str] = {}  # call id -> task id
        self._started: dict[str, float] = {}  # call id -> monotonic time its start was seen
        self._finished: set[str] = set()
        self._completed: queue.Queue[ToolResult] = queue.Queue()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._cancelled_at: float | None = None
        self._error: ToolfleetError | None = None
        self._thread = threading.Thread(target=self._drive, name=f"toolfleet-turn-{turn_id}", daemon=True)

    # ---- public ----
    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled_at is not None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every call has its result (True) or ``timeout_s`` passes (False)."""
        return self._done.wait(timeout_s)

    def results(self, timeout_s: float | None = None) -> list[ToolResult]:
        """Every call's result, in model order. Blocks until all are in.

        Raises ``TimeoutError`` if ``timeout_s`` passes first, :class:`BrokerUnavailable` if Redis
        went away for good while waiting.
        """
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"turn {self.turn_id} not finished after {timeout_s} s")
        if self._error is not None:
            raise self._error
        return [self._results[c.id] for c in self.calls]

    def as_completed(self, timeout_s: float | None = None) -> Iterator[ToolResult]:
        """Yield each result the moment it is recorded (completion order), every call once."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for _ in self.calls:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                yield self._completed.get(timeout=remaining)
            except queue.Empty:
                raise TimeoutError(f"turn {self.turn_id} not finished after {timeout_s} s") from None
            if self._error is not None and self._completed.empty() and self._done.is_set():
                raise self._error

    def result(self, call_id: str) -> ToolResult | None:
        """The result of ``call_id`` if it is in, else None."""
        return self._results.get(call_id)

    def messages(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """The tool-result messages for the model's next request, in the batch's provider format."""
        if self.adapter is None:
            raise ToolfleetError("this turn was submitted without a provider format")
        return self.adapter.format_results(self.results(timeout_s))

    def cancel(self, reason: str = "cancelled by caller") -> None:
        """Cancel the turn: calls not started never start (``NOT_EXECUTED``), running calls are
        stopped (``CANCELLED``), finished calls keep their results. Returns at once; results are
        final within ``cancel_grace_s`` (+ a little) afterwards."""
        with self._lock:
            if self._cancelled_at is None:
                self._cancelled_at = time.monotonic()
            waiting = [t for c, t in self._submitted.items() if c not in self._started and c not in self._finished]
        if not self._done.is_set():
            self._ledger.cancel(self.turn_id, reason)
            self._submitter.revoke(waiting)

    # ---- driver ----
    def start(self) -> Turn:
        """Submit the calls that wait for nothing and start the driver thread."""
        for call_id in self.plan.parallel_group:
            self._submit(call_id, raise_errors=True)
        self._thread.start()
        return self

    def _submit(self, call_id: str, raise_errors: bool = False) -> None:
        run = self._runnable[call_id]
        try:
            tid = self._submitter.send(
                turn_id=self.turn_id,
                call_id=call_id,
                spec=run.spec,
                arguments=run.arguments,
                workspace=self._workspace,
                session_id=self._session_id,
            )
        except BrokerUnavailable as exc:
            if raise_errors:
                raise
            self._ledger.record_result(
                self.turn_id,
                ToolResult.failure(call_id, run.spec.name, ErrorCode.TOOL_UNAVAILABLE, str(exc),
                                   "the broker is down; retry when it is back"),
            )
            return
        with self._lock:
            self._submitted[call_id] = tid

    def _drive(self) -> None:
        last = "0-0"
        failures = 0
        while not self._done.is_set():
            try:
                for event in self._ledger.events(self.turn_id, after=last, block_ms=BLOCK_MS):
                    last = event.stream_id
                    self._on_event(event)
                self._watchdog()
                failures = 0
            except Exception as exc:  # Redis trouble: retry for a while, then give up loudly
                failures += 1
                log.warning("turn %s: reading events failed (%s)", self.turn_id, exc)
                if failures > 50:
                    self._error = BrokerUnavailable(self._settings.redis_url, str(exc))
                    self._done.set()
                    return
                time.sleep(min(0.05 * failures, 1.0))

    def _on_event(self, event: Any) -> None:
        if event.type == "started":
            with self._lock:
                self._started.setdefault(event.call_id, time.monotonic())
        elif event.type == "cancel":
            with self._lock:
                if self._cancelled_at is None:
                    self._cancelled_at = time.monotonic()
        elif event.type == "result":
            self._on_result(event.result())

    def _on_result(self, result: ToolResult) -> None:
        with self._lock:
            if result.call_id in self._results or result.call_id not in self._names:
                return
            self._results[result.call_id] = result
            self._finished.add(result.call_id)
            ready = [
                d
                for d in self.plan.dependents.get(result.call_id, ())
                if d not in self._submitted and d not in self._finished and self.plan.deps[d] <= self._finished
            ]
            cancelled = self._cancelled_at is not None
            all_in = len(self._results) == len(self.calls)
        self._completed.put(result)
        if not cancelled:
            for call_id in ready:
                self._submit(call_id)
        if all_in:
            self._done.set()

    def _watchdog(self) -> None:
        now = time.monotonic()
        with self._lock:
            cancelled_at = self._cancelled_at
            pending = [c for c in self._names if c not in self._results]
            started = dict(self._started)
        if cancelled_at is not None and now >= cancelled_at + self._settings.cancel_grace_s + CANCEL_SLACK_S:
            stuck = []
            for call_id in pending:
                run = self._runnable.get(call_id)
                if call_id in started and run is not None and not run.spec.cancellable:
                    continue  # declared not cancellable: it runs to its end
                if call_id in started:
                    stuck.append(self._submitted.get(call_id, ""))
                    result = ToolResult.failure(
                        call_id, self._names[call_id], ErrorCode.CANCELLED,
                        "the turn was cancelled while the call ran; it did not stop in time and was killed",
                        "the call may have done part of its work; check before repeating it",
                    )
                else:
                    result = not_executed(call_id, self._names[call_id])
                self._ledger.record_result(self.turn_id, result)
            self._submitter.revoke([t for t in stuck if t], kill=True)
            return
        for call_id in pending:
            run = self._runnable.get(call_id)
            if call_id not in started or run is None:
                continue
            hard_s = run.spec.time_limit_s(run.arguments) + self._settings.kill_grace_s
            if now >= started[call_id] + hard_s + WATCHDOG_SLACK_S:
                self._ledger.record_result(
                    self.turn_id,
                    ToolResult.failure(
                        call_id, run.spec.name, ErrorCode.WORKER_LOST,
                        f"no result {hard_s + WATCHDOG_SLACK_S:g} s after the call started; "
                        "its worker is presumed lost",
                        "the call may or may not have taken effect; check before repeating it",
                    ),
                )
