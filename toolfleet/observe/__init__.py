"""Seeing a fleet at work (issue 17; docs/observability.md): OpenTelemetry traces from turn to
call (:mod:`.tracing`, :mod:`.worker_trace`), Prometheus metrics per tool (:mod:`.metrics`), and
one structured log line per call result on the worker (:mod:`.results`).

Everything here is off unless asked for, and cheap when off: with no OpenTelemetry SDK
configured, no span is made at all; without a metrics port, no metric is touched."""

from .tracing import configure_tracing_from_env, set_tracer_provider

__all__ = ["configure_tracing_from_env", "set_tracer_provider"]
