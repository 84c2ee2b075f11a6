"""The worker's side of observing one call: its span (continued from the dispatcher's call span,
:mod:`.tracing`), the running gauge, and at its result one structured log line, the metrics and the
span's attributes (issue 17).

The log line (logger ``toolfleet.results``, INFO) carries ``turn_id``, ``call_id``, ``tool``,
``status``, ``code``, ``queued_ms``, ``run_ms``, ``attempts``, ``worker`` and, when traced,
``trace_id``; never arguments, content or error messages (those can quote arguments). Text by
default (through the worker's logging); JSON, one object a line, after :func:`configure_result_log`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import metrics
from .tracing import add_result_events, result_attributes, trace, tracer

log = logging.getLogger("toolfleet.results")
TRACE_HEADERS = ("traceparent", "tracestate")
_json = False  # configure_result_log("json") was called


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (unix s), ``level``, ``event`` and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {"message": record.getMessage()}
        return json.dumps({"ts": round(record.created, 3), "level": record.levelname, "event": record.msg, **fields},
                          default=str)


def configure_result_log(fmt: str = "text", path: str | None = None) -> None:
    """How the worker writes its result lines: ``fmt`` ``"json"`` (one object a line) or ``"text"``;
    ``path``: a file to append to (default: stderr for JSON; text goes through the worker's logging).
    Raises ValueError for another ``fmt``."""
    if fmt not in ("text", "json"):
        raise ValueError(f"result log format must be 'text' or 'json', not {fmt!r}")
    if fmt == "text" and path is None:
        return
    global _json
    handler: logging.Handler = logging.FileHandler(path, delay=True) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(message)s"))
    _json = fmt == "json"
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def result_fields(env: Any, result: Any) -> dict[str, Any]:
    """What the log line says about a result: ids, tool, status, code, timings; no content."""
    return {"turn_id": env.turn_id, "call_id": env.call_id, "tool": env.name, "status": result.status,
            "code": result.code.value if result.code is not None else None, "queued_ms": result.queued_ms,
            "run_ms": result.run_ms, "attempts": result.attempts, "worker": result.worker}


def result_recorded(env: Any, result: Any) -> None:
    """This worker recorded ``result`` as the call's result (worker/execute.py, worker/app.py)."""
    try:
        worker = metrics.worker_metrics()
        if worker is not None:
            worker.result(result)
        span = trace.get_current_span() if trace is not None else None
        traced = span is not None and span.is_recording()
        if traced:
            span.set_attributes(result_attributes(result))
            add_result_events(span, result)
        if log.isEnabledFor(logging.INFO):
            fields = result_fields(env, result)
            if traced:
                fields["trace_id"] = f"{span.get_span_context().trace_id:032x}"
            if _json:
                log.info("call_result", extra={"fields": fields})
            else:
                log.info("call result %s", " ".join(f"{k}={v}" for k, v in fields.items()))
    except Exception as exc:  # noqa: BLE001 - observing never breaks a call
        logging.getLogger(__name__).warning("could not observe the result of call %s (%s)", env.call_id, exc)


@contextmanager
def running(request: Any, envelope: dict[str, Any]) -> Iterator[None]:
    """Around one execution on the worker: the ``toolfleet.run_call <tool>`` span (child of the call
    span whose context the message headers carry) and the running gauge."""
    tool = str(envelope.get("name", "?")) if isinstance(envelope, dict) else "?"
    worker = metrics.worker_metrics()
    tracer_ = tracer()
    if worker is None and tracer_ is None:
        yield
        return
    if worker is not None:
        worker.running.labels(tool).inc()
    try:
        if tracer_ is None:
            yield
            return
        from opentelemetry.propagate import extract

        carrier = {k: v for k in TRACE_HEADERS if isinstance(v := getattr(request, k, None), str)}
        attrs = {"toolfleet.tool": tool, "toolfleet.worker": getattr(request, "hostname", None) or "worker"}
        if isinstance(envelope, dict):
            attrs.update({"toolfleet.turn_id": str(envelope.get("turn_id")),
                          "toolfleet.call_id": str(envelope.get("call_id"))})
        with tracer_.start_as_current_span(f"toolfleet.run_call {tool}", context=extract(carrier),
                                           kind=trace.SpanKind.CONSUMER, attributes=attrs,
                                           start_time=time.time_ns()):
            yield
    finally:
        if worker is not None:
            worker.running.labels(tool).dec()
