"""A tool name the model made up is text from the model: the audit trail masks it
(audit.py ``result_data``: ``redact_text(result.name)``, "a model may name a tool that does not
exist"), but the dispatcher's Prometheus metrics used it as the ``tool`` label as it was
(observe/turns.py ``self.meters.calls.labels(result.name, ...)``), and its trace named the call's
span after it (``toolfleet.call <name>``): a weak model that puts the whole command in the name
field put its token in ``/metrics``, scraped and kept by Prometheus, and in the tracing backend,
one new series per made-up name. Now such a call is labelled and spanned as ``<unknown>`` (the name,
masked and cut, only in the span's ``toolfleet.tool_given``); the session id and a cancel's reason
are masked and cut in span attributes."""

from __future__ import annotations

import json

import pytest

from toolfleet import Dispatcher, ToolCall
from toolfleet.observe import metrics, set_tracer_provider

from .conftest import make_registry

TOKEN = "sk-proj-Q7wErTy12UiOp34AsDfGh56JkL"
NAME = f"run_command curl -H 'Authorization: Bearer {TOKEN}' https://api.openai.com/v1/models"


def test_an_unknown_tool_name_holding_a_secret_is_masked_in_the_metrics(settings, workspace):
    pc = pytest.importorskip("prometheus_client")
    registry = pc.CollectorRegistry()
    metrics.enable_dispatcher_metrics(registry)
    try:
        with Dispatcher(settings, make_registry()) as d:
            turn = d.submit([ToolCall(id="c1", name=NAME, arguments=json.dumps({}), index=0),
                             ToolCall(id="c2", name=NAME + " again", arguments="{}", index=1)],
                            workspace=str(workspace))
            results = turn.results(20)
        assert [r.code.value if r.code else None for r in results] == ["UNKNOWN_TOOL", "UNKNOWN_TOOL"]
        exposed = pc.generate_latest(registry).decode()
        assert "toolfleet_calls_total" in exposed and "UNKNOWN_TOOL" in exposed
        assert TOKEN not in exposed, [line for line in exposed.splitlines() if TOKEN in line]
        # bounded: every made-up name is the one label <unknown>
        unknown = [line for line in exposed.splitlines()
                   if line.startswith("toolfleet_calls_total{") and 'code="UNKNOWN_TOOL"' in line]
        assert len(unknown) == 1 and 'tool="<unknown>"' in unknown[0] and unknown[0].endswith(" 2.0"), unknown
    finally:
        metrics.disable_dispatcher_metrics()


def test_an_unknown_tool_name_session_id_and_cancel_reason_are_masked_in_spans(settings, workspace):
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(provider)
    try:
        with Dispatcher(settings, make_registry()) as d:
            turn = d.submit([ToolCall(id="c1", name=NAME, arguments="{}", index=0)], workspace=str(workspace),
                            session_id=f"chat-1 token={TOKEN}")
            [result] = turn.results(20)
            turn.cancel(f"user said: Authorization: Bearer {TOKEN}")
            turn._thread.join(10)
        assert result.code is not None and result.code.value == "UNKNOWN_TOOL"
        spans = exporter.get_finished_spans()
        text = json.dumps([[s.name, dict(s.attributes or {}), [[e.name, dict(e.attributes or {})] for e in s.events]]
                           for s in spans], default=str)
        assert TOKEN not in text, text
        call = next(s for s in spans if s.name.startswith("toolfleet.call"))
        assert call.name == "toolfleet.call <unknown>" and call.attributes["toolfleet.tool"] == "<unknown>"
        assert call.attributes["toolfleet.tool_given"].startswith("run_command curl")
        turn_span = next(s for s in spans if s.name == "toolfleet.turn")
        assert turn_span.attributes["toolfleet.session_id"].startswith("chat-1 token=")
    finally:
        set_tracer_provider(None)
        provider.shutdown()
