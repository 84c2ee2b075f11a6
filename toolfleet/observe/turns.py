"""The dispatcher's side of observing a turn: its trace (:mod:`.tracing`) and metrics
(:mod:`.metrics`) behind one object, so the turn's code has one hook per moment (sent, finished,
cancel, end). :func:`observe_turn` returns ``None`` when both are off: each hook is then one
``is None`` check.

A call's ``tool`` label is its tool's name, or ``<unknown>`` for a name no registered tool has: that
name is the model's text (a weak model may put a whole command, token and all, in the name field),
and a label per made-up name would grow the series without bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from . import metrics
from .tracing import UNKNOWN_TOOL, TurnTrace, turn_trace


class TurnObserver:
    def __init__(self, trace_: TurnTrace | None, meters: metrics.DispatcherMetrics | None,
                 known: Callable[[str], bool] | None = None) -> None:
        self.trace = trace_
        self.meters = meters
        self._known = known  # whether a name is a registered tool's; None: every name is
        self._began = time.monotonic()
        self._in_flight: dict[str, str] = {}  # call id -> tool, sent and without a result
        self._lock = threading.Lock()

    def sent(self, call_id: str, tool: str) -> dict[str, str] | None:
        """A call goes to the broker; returns the message headers carrying its trace context."""
        if self.meters is not None:
            with self._lock:
                first = call_id not in self._in_flight
                self._in_flight[call_id] = tool
            if first:
                self.meters.in_flight.labels(tool).inc()
        return self.trace.call_sent(call_id, tool) if self.trace is not None else None

    def finished(self, result: Any) -> None:
        """The call's one final result is in."""
        if self.meters is not None:
            with self._lock:
                tool = self._in_flight.pop(result.call_id, None)
            if tool is not None:
                self.meters.in_flight.labels(tool).dec()
            self.meters.calls.labels(self.label(result.name), result.status, metrics.code_label(result)).inc()
        if self.trace is not None:
            self.trace.call_finished(result)

    def label(self, tool: str) -> str:
        """The ``tool`` label of a call to ``tool``: the name, or ``<unknown>`` (see the module)."""
        return tool if self._known is None or self._known(tool) else UNKNOWN_TOOL

    def cancel(self, reason: str) -> None:
        if self.trace is not None:
            self.trace.cancel(reason)

    def end(self, outcome: str) -> None:
        """The turn is over: ``outcome`` ok, cancelled or error."""
        if self.meters is not None:
            with self._lock:
                left, self._in_flight = list(self._in_flight.values()), {}
            for tool in left:
                self.meters.in_flight.labels(tool).dec()
            self.meters.turns.labels(outcome).inc()
            self.meters.turn_s.observe(time.monotonic() - self._began)
        if self.trace is not None:
            self.trace.end(outcome)


def observe_turn(turn_id: str, session_id: str | None = None,
                 known: Callable[[str], bool] | None = None) -> TurnObserver | None:
    """The observer of a new turn (call in the caller's thread: its current span is the turn's
    parent), or ``None`` when neither tracing nor metrics are on. ``known``: whether a tool name
    is a registered tool's (the registry's ``__contains__``)."""
    trace_ = turn_trace(turn_id, session_id, known)
    meters = metrics.dispatcher_metrics()
    if trace_ is None and meters is None:
        return None
    return TurnObserver(trace_, meters, known)
