"""OpenTelemetry traces of turns and calls (dispatcher side; the worker side is :mod:`.worker_trace`).

Shape (issue 17): one span per turn (``toolfleet.turn``), whose parent is the caller's current span
(an agent framework's); one child span per call (``toolfleet.call <tool>``) from the moment the call
is sent until its result is in (queued + running), or a zero-length one for a call that never went
out (refused, invalid). The call span's context travels in the Celery message headers as W3C trace
context (``traceparent``/``tracestate``), so the worker's ``toolfleet.run_call <tool>`` span is its
child. Attributes: ``toolfleet.turn_id``, ``toolfleet.call_id``, ``toolfleet.tool``,
``toolfleet.status``, ``toolfleet.error_code``, ``toolfleet.attempts``, ``toolfleet.worker``.
Events: ``toolfleet.cancel`` (turn: a cancel was asked), ``toolfleet.cancelled`` (call: stopped or
never started because of a cancel), ``toolfleet.time_limit`` (call: ran past its time limit).

A tool name no registered tool has is the model's text (a weak model may put a whole command, token
and all, in the name field): its span is ``toolfleet.call <unknown>`` with ``toolfleet.tool``
``<unknown>`` and ``toolfleet.tool_given`` the name masked (:func:`~toolfleet.tools.redact.redact_text`),
then cut to ``TOOL_GIVEN_CHARS``; the session id and a cancel's reason are masked and cut the same way.

Off by default: with no SDK tracer provider set (the API's proxy), :func:`turn_trace` returns
``None`` and nothing else runs (a global read and an ``isinstance``; bench/tracing_cost.py). Our own
spans, not opentelemetry-instrumentation-celery: that makes a short publish span and a run span per
task, but not a call span covering the queue wait, nor the turn as the calls' parent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

try:  # the API is a dependency of our extras only; without it tracing is simply off
    from opentelemetry import trace
    from opentelemetry.propagate import inject
except ImportError:  # pragma: no cover - exercised where opentelemetry-api is missing
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from ..models import ToolResult

TRACER_NAME = "toolfleet"
UNKNOWN_TOOL = "<unknown>"  # the tool of a call whose name no registered tool has (span names, metric labels)
ATTRIBUTE_MAX_CHARS = 200
TOOL_GIVEN_CHARS = 80
_override: Any = None  # a tracer provider given to set_tracer_provider(), else the global one


def set_tracer_provider(provider: Any) -> None:
    """Trace toolfleet with ``provider`` (an SDK ``TracerProvider``) instead of OpenTelemetry's
    global one; ``None`` goes back to the global one. For a process that keeps several providers
    (and for tests)."""
    global _override
    _override = provider


def tracer() -> Any:
    """toolfleet's tracer, or ``None`` when tracing is off (no SDK provider anywhere)."""
    if trace is None:
        return None
    provider = _override
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None
    return provider.get_tracer(TRACER_NAME)


def attribute_text(text: Any, max_chars: int = ATTRIBUTE_MAX_CHARS) -> str:
    """``text`` as a span attribute: secrets masked, then cut (head and tail, its length said)."""
    from ..tools.redact import redact_text, shorten

    return shorten(redact_text(str(text)), max_chars)


def result_attributes(result: ToolResult) -> dict[str, Any]:
    """The span attributes of a call's result: status, error code, attempts, worker (never content)."""
    attrs: dict[str, Any] = {"toolfleet.status": result.status, "toolfleet.attempts": result.attempts}
    if result.code is not None:
        attrs["toolfleet.error_code"] = result.code.value
    if result.worker:
        attrs["toolfleet.worker"] = result.worker
    return attrs


def add_result_events(span: Any, result: ToolResult) -> None:
    """``toolfleet.cancelled`` / ``toolfleet.time_limit`` on ``span`` when ``result`` says so, and
    the span's status ERROR for an error result (its code as the description)."""
    code = result.code.value if result.code is not None else None
    if code in ("CANCELLED", "NOT_EXECUTED"):
        span.add_event("toolfleet.cancelled", {"toolfleet.error_code": code})
    elif code == "TIMEOUT":
        span.add_event("toolfleet.time_limit", {"toolfleet.error_code": code})
    if code is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, code))


class TurnTrace:
    """The spans of one turn (thread-safe: the caller's thread sends, the driver thread collects)."""

    def __init__(self, tracer_: Any, turn_id: str, session_id: str | None,
                 known: Callable[[str], bool] | None = None) -> None:
        self._tracer = tracer_
        self._lock = threading.Lock()
        self._known = known  # whether a name is a registered tool's; None: every name is
        attrs = {"toolfleet.turn_id": turn_id}
        if session_id:
            attrs["toolfleet.session_id"] = attribute_text(session_id)  # the caller's label: may hold anything
        # parent: the caller's current span (this runs in the caller's thread)
        self.span = tracer_.start_span("toolfleet.turn", attributes=attrs)
        self._turn_ctx = trace.set_span_in_context(self.span)
        self._turn_id = turn_id
        self._calls: dict[str, Any] = {}  # call id -> open call span
        self._ended: set[str] = set()
        self._count = 0

    def call_sent(self, call_id: str, tool: str) -> dict[str, str]:
        """The call goes to the broker: open its span (once; a resend keeps it) and return the
        message headers that carry its context to the worker (W3C ``traceparent``)."""
        with self._lock:
            span = self._calls.get(call_id)
            if span is None and call_id not in self._ended:
                span = self._calls[call_id] = self._start(call_id, tool)
        headers: dict[str, str] = {}
        if span is not None:
            inject(headers, context=trace.set_span_in_context(span))
        return headers

    def _start(self, call_id: str, tool: str) -> Any:
        attrs = {"toolfleet.turn_id": self._turn_id, "toolfleet.call_id": call_id, "toolfleet.tool": tool}
        if self._known is not None and not self._known(tool):
            # the model's text: never a span name (bounded: what backends index and show first)
            attrs["toolfleet.tool_given"] = attribute_text(tool, TOOL_GIVEN_CHARS)
            attrs["toolfleet.tool"] = UNKNOWN_TOOL
            tool = UNKNOWN_TOOL
        return self._tracer.start_span(f"toolfleet.call {tool}", context=self._turn_ctx, kind=trace.SpanKind.PRODUCER,
                                       attributes=attrs)

    def call_finished(self, result: ToolResult) -> None:
        """The call's final result is in: its span gets the result's attributes and events, and ends."""
        with self._lock:
            if result.call_id in self._ended:
                return
            self._ended.add(result.call_id)
            span = self._calls.pop(result.call_id, None) or self._start(result.call_id, result.name)
            self._count += 1
        span.set_attributes(result_attributes(result))
        add_result_events(span, result)
        span.end()

    def cancel(self, reason: str) -> None:
        self.span.add_event("toolfleet.cancel", {"toolfleet.reason": attribute_text(reason)})

    def end(self, outcome: str) -> None:
        """The turn is over (``outcome``: ok, cancelled, error); calls still open end with it."""
        with self._lock:
            left, self._calls = list(self._calls.values()), {}
        for span in left:
            span.set_attribute("toolfleet.status", "unknown")
            span.end()
        self.span.set_attributes({"toolfleet.calls": self._count, "toolfleet.outcome": outcome})
        if outcome == "error":
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
        self.span.end()


def turn_trace(turn_id: str, session_id: str | None = None,
               known: Callable[[str], bool] | None = None) -> TurnTrace | None:
    """A :class:`TurnTrace` for a new turn, or ``None`` when tracing is off (the common, cheap case).
    ``known``: whether a tool name is a registered tool's (others are spanned as ``<unknown>``)."""
    tracer_ = tracer()
    return None if tracer_ is None else TurnTrace(tracer_, turn_id, session_id, known)


def configure_tracing_from_env(environ: dict[str, str] | None = None, *, _check_only: bool = False) -> Any:
    """Set OpenTelemetry's global tracer provider from the standard ``OTEL_*`` variables, when
    ``OTEL_TRACES_EXPORTER`` names one (``otlp``: the ``otel`` extra's exporter, which reads
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` etc.; ``console``; ``jsonl``: one JSON object per span appended to
    ``TOOLFLEET_OTEL_JSONL_PATH``, for tests and local looks). ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` name the process. Returns the provider, or ``None`` when unset or
    ``none``. Raises :class:`~toolfleet.errors.ConfigurationError` naming what is missing."""
    import os

    from ..errors import ConfigurationError

    env = os.environ if environ is None else environ
    name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not name or name == "none":
        return None
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(f"OTEL_TRACES_EXPORTER={name} needs the OpenTelemetry SDK: "
                                 "pip install 'toolfleet[otel]'") from exc
    if name == "jsonl":
        from .span_file import JsonlSpanExporter

        path = env.get("TOOLFLEET_OTEL_JSONL_PATH")
        if not path:
            raise ConfigurationError("OTEL_TRACES_EXPORTER=jsonl needs TOOLFLEET_OTEL_JSONL_PATH (a file to append to)")

        def make() -> Any:
            return SimpleSpanProcessor(JsonlSpanExporter(path))
    elif name == "console":
        def make() -> Any:
            return SimpleSpanProcessor(ConsoleSpanExporter())
    elif name in ("otlp", "otlp_proto_http", "otlp_proto_grpc"):
        try:
            if name == "otlp_proto_http" or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").startswith("http"):
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigurationError(f"OTEL_TRACES_EXPORTER={name} needs the OTLP exporter: "
                                     "pip install 'toolfleet[otel]'") from exc

        def make() -> Any:
            return BatchSpanProcessor(OTLPSpanExporter())  # endpoint, headers: OTEL_EXPORTER_OTLP_*
    else:
        raise ConfigurationError(f"OTEL_TRACES_EXPORTER={name!r} is not one toolfleet sets up: use otlp, "
                                 "otlp_proto_http, otlp_proto_grpc, console, jsonl or none")
    if _check_only:  # a worker checks before its pool forks; each pool process sets up its own
        return None
    provider = TracerProvider()  # resource from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
    provider.add_span_processor(make())
    trace.set_tracer_provider(provider)
    return provider
