"""Issue 17: traces from turn to call across real worker processes, metrics that count what the
results say, and a result log that never carries arguments or output."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from toolfleet import ErrorCode
from toolfleet.observe import metrics, set_tracer_provider
from toolfleet.observe.turns import observe_turn
from toolfleet.stack import _free_port

from .faults import call, wait_started

SCRAPE_WAIT_S = 10.0  # a worker counts a result right after recording it: the scrape may come first
SECRET = "sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0"


@pytest.fixture
def spans():
    """An SDK tracer provider for toolfleet in this (dispatcher) process, with an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(provider)
    yield provider, exporter
    set_tracer_provider(None)
    provider.shutdown()


def _ended(turn) -> None:
    turn._thread.join(10)  # the turn span ends when the driver ends the turn
    assert not turn._thread.is_alive()


def test_tracing_is_off_without_an_sdk_provider():
    assert observe_turn("t1") is None  # no SDK provider, no metrics: each hook is one `is None`


def test_one_trace_per_turn_with_call_spans_continued_on_the_workers(dispatcher, start_worker, workspace, spans,
                                                                    tmp_path, monkeypatch):
    provider, exporter = spans
    worker_spans = tmp_path / "worker-spans.jsonl"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jsonl")  # the worker's pool processes export to a file
    monkeypatch.setenv("TOOLFLEET_OTEL_JSONL_PATH", str(worker_spans))
    w = start_worker()
    agent = provider.get_tracer("agent")
    with agent.start_as_current_span("agent.step") as step:
        done = dispatcher.submit([call("ok1", "wait_read", label="a"), call("err1", "boom", message="no"),
                                  call("nope", "no_such_tool")], workspace=str(workspace))
        results = {r.call_id: r for r in done.results(timeout_s=30)}
    cancelled = dispatcher.submit([call("c1", "count_until_cancelled", seconds=20)], workspace=str(workspace))
    wait_started(dispatcher, cancelled.turn_id, "c1")
    cancelled.cancel("the user pressed stop")
    assert cancelled.results(timeout_s=10)[0].code is ErrorCode.CANCELLED
    _ended(done)
    _ended(cancelled)
    pool = set(w.children())
    w.stop()  # joins the pool: every worker span is written

    mine = exporter.get_finished_spans()
    turns = [s for s in mine if s.name == "toolfleet.turn"]
    assert sorted(s.attributes["toolfleet.turn_id"] for s in turns) == sorted([done.turn_id, cancelled.turn_id])
    first = next(s for s in turns if s.attributes["toolfleet.turn_id"] == done.turn_id)
    assert first.parent.span_id == step.get_span_context().span_id  # the caller's span is the parent
    assert first.context.trace_id == step.get_span_context().trace_id
    second = next(s for s in turns if s is not first)
    assert second.context.trace_id != first.context.trace_id  # one trace per turn
    assert [e.name for e in second.events] == ["toolfleet.cancel"]

    calls = {s.attributes["toolfleet.call_id"]: s for s in mine if s.name.startswith("toolfleet.call ")}
    assert set(calls) == {"ok1", "err1", "nope", "c1"}  # one call span per call, the unsent one too
    for call_id, span in calls.items():
        turn_span = second if call_id == "c1" else first
        assert span.parent.span_id == turn_span.context.span_id
        assert span.context.trace_id == turn_span.context.trace_id
    ok, err = calls["ok1"].attributes, calls["err1"].attributes
    assert ok["toolfleet.tool"] == "wait_read" and ok["toolfleet.status"] == "ok" and ok["toolfleet.attempts"] == 1
    assert ok["toolfleet.worker"] == results["ok1"].worker == w.name and "toolfleet.error_code" not in ok
    assert err["toolfleet.status"] == "error" and err["toolfleet.error_code"] == "EXECUTION_ERROR"
    assert calls["nope"].attributes["toolfleet.error_code"] == "UNKNOWN_TOOL"
    assert [e.name for e in calls["c1"].events] == ["toolfleet.cancelled"]
    assert calls["c1"].attributes["toolfleet.error_code"] == "CANCELLED"

    records = [json.loads(line) for line in worker_spans.read_text().splitlines()]
    remote = {r["attributes"]["toolfleet.call_id"]: r for r in records}
    assert len(records) == len(remote) == 3  # ok1, err1, c1 ran on the worker; "nope" never left
    for call_id, record in remote.items():
        parent = calls[call_id].context
        assert record["parent_id"] == f"{parent.span_id:016x}" and record["trace_id"] == f"{parent.trace_id:032x}"
        assert record["kind"] == "CONSUMER" and record["attributes"]["toolfleet.worker"] == w.name
        assert record["pid"] in pool  # exported by the worker's pool processes
    assert remote["err1"]["attributes"]["toolfleet.error_code"] == "EXECUTION_ERROR"
    assert [e["name"] for e in remote["c1"]["events"]] == ["toolfleet.cancelled"]


def test_an_async_turn_is_a_child_of_the_awaiting_task_s_span(dispatcher, worker, workspace, spans):
    """AsyncDispatcher submits from a thread of its own: the turn span's parent must still be the
    span current where the turn is awaited (an async agent framework's step), as with the
    synchronous Dispatcher, and the worker's run continues that trace."""
    import asyncio

    from toolfleet.aio import AsyncDispatcher

    provider, exporter = spans
    agent = provider.get_tracer("agent")

    async def step():
        with agent.start_as_current_span("agent.step") as span:
            turn = await AsyncDispatcher(dispatcher=dispatcher).submit(
                [call("a1", "wait_read", label="a"), call("nope", "no_such_tool")], workspace=str(workspace))
            results = await turn.results(30)
            return span, turn, results

    span, turn, results = asyncio.run(step())
    assert [r.status for r in results] == ["ok", "error"]
    _ended(turn.turn)
    [turn_span] = [s for s in exporter.get_finished_spans() if s.name == "toolfleet.turn"]
    assert turn_span.parent is not None and turn_span.parent.span_id == span.get_span_context().span_id
    assert turn_span.context.trace_id == span.get_span_context().trace_id


def test_time_limit_is_a_span_event(dispatcher, worker, workspace, spans):
    _, exporter = spans
    turn = dispatcher.submit([call("slow", "quick_read", label="x", seconds=5)], workspace=str(workspace))
    assert turn.results(timeout_s=30)[0].code is ErrorCode.TIMEOUT
    _ended(turn)
    span = next(s for s in exporter.get_finished_spans() if s.name == "toolfleet.call quick_read")
    assert [e.name for e in span.events] == ["toolfleet.time_limit"]


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _by_labels(samples, name: str, labels: tuple[str, ...]) -> Counter:
    return Counter({tuple(s.labels[k] for k in labels): s.value for s in samples if s.name == name and s.value})


def test_metrics_of_worker_and_dispatcher_count_what_the_results_say(dispatcher, start_worker, workspace,
                                                                     monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    worker_port = _free_port()
    w = start_worker(args=["--metrics-port", str(worker_port)])
    registry = CollectorRegistry()
    server, port = metrics.serve_dispatcher_metrics(0, registry=registry)
    try:
        batch = dispatcher.submit([call("ok1", "wait_read", label="a"), call("ok2", "wait_read", label="b"),
                                   call("err1", "boom", message="no"), call("slow", "quick_read", label="x", seconds=5),
                                   call("nope", "no_such_tool"),
                                   call("killed", "swallowing_sleep", seconds=10)],  # killed at its hard limit
                                  workspace=str(workspace))
        results = batch.results(timeout_s=30)
        stop = dispatcher.submit([call("c1", "count_until_cancelled", seconds=20)], workspace=str(workspace))
        wait_started(dispatcher, stop.turn_id, "c1")
        stop.cancel()
        results += stop.results(timeout_s=10)
        _ended(batch)
        _ended(stop)
        # a name no registered tool has is the model's text: one bounded label (test_secrets_metrics.py)
        expected = Counter(("<unknown>" if r.name == "no_such_tool" else r.name, r.status,
                            r.code.value if r.code else "") for r in results)
        assert {c for _, _, c in expected} == {"", "EXECUTION_ERROR", "TIMEOUT", "CANCELLED", "UNKNOWN_TOOL"}
        ran = Counter({k: v for k, v in expected.items() if k[2] != "UNKNOWN_TOOL"})  # never reached a worker

        mine = _scrape(port)
        assert _by_labels(mine["toolfleet_calls"], "toolfleet_calls_total", ("tool", "status", "code")) == expected
        assert not _by_labels(mine["toolfleet_calls_in_flight"], "toolfleet_calls_in_flight", ("tool",))
        assert _by_labels(mine["toolfleet_turns"], "toolfleet_turns_total", ("outcome",)) == Counter(
            {("ok",): 1, ("cancelled",): 1})

        deadline = time.monotonic() + SCRAPE_WAIT_S
        while True:
            theirs = _scrape(worker_port)
            counted = _by_labels(theirs.get("toolfleet_worker_calls", []), "toolfleet_worker_calls_total",
                                 ("tool", "status", "code"))
            if counted == ran or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # bounded: the worker counts right after the dispatcher sees the result
        assert counted == ran
        per_tool = Counter()
        for (tool, _, _), n in ran.items():
            per_tool[(tool,)] += n
        queued = _by_labels(theirs["toolfleet_call_queue_seconds"], "toolfleet_call_queue_seconds_count", ("tool",))
        assert queued == per_tool - Counter({("swallowing_sleep",): 1})  # killed: its pick-up time died with it
        run = _by_labels(theirs["toolfleet_call_run_seconds"], "toolfleet_call_run_seconds_count", ("tool",))
        assert run == per_tool  # each of these ran its handler
        # the killed pool process's "running" no longer counts (marked dead by the main process)
        assert not _by_labels(theirs["toolfleet_worker_calls_running"], "toolfleet_worker_calls_running", ("tool",))
        beats = _by_labels(theirs["toolfleet_worker_heartbeats"], "toolfleet_worker_heartbeats_total", ("worker",))
        assert beats[(w.name,)] >= 1
        depth = _by_labels(theirs["toolfleet_queue_depth"], "toolfleet_queue_depth", ("queue",))
        assert not depth and {s.labels["queue"] for s in theirs["toolfleet_queue_depth"]}  # present, all empty
    finally:
        server.shutdown()
        metrics.disable_dispatcher_metrics()


def test_a_given_metrics_directory_is_emptied_of_old_values_but_never_removed(dispatcher, start_worker, workspace,
                                                                            tmp_path: Path, monkeypatch):
    """PROMETHEUS_MULTIPROC_DIR given (under the temporary directory, as most are: /tmp/prometheus):
    the worker empties it of an earlier run's values at start, and at its end leaves it, and what
    else it holds, where it was (only a directory the worker made for itself is removed)."""
    given = tmp_path / "prometheus"
    given.mkdir()
    (given / "gunicorn_app.txt").write_text("another program's file")
    (given / "counter_1.db").write_bytes(b"an earlier run's values")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(given))
    w = start_worker(args=["--metrics-port", str(_free_port())])
    assert not (given / "counter_1.db").exists()  # emptied at start
    turn = dispatcher.submit([call("m1", "wait_read", label="a")], workspace=str(workspace))
    assert [r.status for r in turn.results(timeout_s=30)] == ["ok"]
    w.stop()
    assert given.is_dir() and (given / "gunicorn_app.txt").read_text() == "another program's file"


def test_result_log_is_one_json_line_per_call_without_arguments_or_output(dispatcher, start_worker, workspace,
                                                                          tmp_path: Path, monkeypatch):
    log_file = tmp_path / "results.jsonl"
    monkeypatch.setenv("TOOLFLEET_RESULT_LOG", "json")
    monkeypatch.setenv("TOOLFLEET_RESULT_LOG_FILE", str(log_file))
    w = start_worker()
    turn = dispatcher.submit([call("k1", "call_api", endpoint="/pay", api_token=SECRET, payload=f"token={SECRET}"),
                              call("k2", "boom", message=f"leaked {SECRET}"),
                              call("k3", "wait_read", label=SECRET)], workspace=str(workspace))
    results = {r.call_id: r for r in turn.results(timeout_s=30)}
    w.stop()  # joins the pool: every line is written
    text = log_file.read_text()
    assert SECRET not in text and "/pay" not in text and "leaked" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert sorted(line["call_id"] for line in lines) == ["k1", "k2", "k3"]  # one line per call result
    for line in lines:
        result = results[line["call_id"]]
        assert line["event"] == "call_result" and line["turn_id"] == turn.turn_id
        assert line["tool"] == result.name and line["status"] == result.status and line["worker"] == w.name
        assert line["code"] == (result.code.value if result.code else None)
        assert line["queued_ms"] == result.queued_ms and line["run_ms"] == result.run_ms


def test_result_log_text_lines_carry_the_fields(tmp_path: Path):
    """In-process check of the text format (the JSON one runs across real workers above)."""
    import logging

    from toolfleet.models import CallEnvelope, ToolResult
    from toolfleet.observe import results as result_log

    saved = (list(result_log.log.handlers), result_log.log.level, result_log.log.propagate, result_log._json)
    path = tmp_path / "results.log"
    try:
        result_log.configure_result_log("text", str(path))
        env = CallEnvelope(turn_id="t1", call_id="c1", name="call_api", arguments={"api_token": SECRET},
                           time_limit_s=5, idempotency_key="k", submitted_at=0.0)
        result_log.result_recorded(env, ToolResult.failure("c1", "call_api", ErrorCode.EXECUTION_ERROR,
                                                           f"bad token {SECRET}", "", run_ms=2.0))
        for handler in result_log.log.handlers:
            handler.close()
        text = path.read_text()
        assert "turn_id=t1 call_id=c1 tool=call_api status=error code=EXECUTION_ERROR" in text
        assert "run_ms=2.0" in text and SECRET not in text
        with pytest.raises(ValueError):
            result_log.configure_result_log("xml")
    finally:
        result_log.log.handlers[:], result_log.log.propagate = saved[0], saved[2]
        result_log.log.setLevel(saved[1] or logging.NOTSET)
        result_log._json = saved[3]


@pytest.mark.parametrize(("env", "named"), [
    ({"OTEL_TRACES_EXPORTER": "jsonl"}, "TOOLFLEET_OTEL_JSONL_PATH"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"),
    ({"TOOLFLEET_RESULT_LOG": "xml"}, "xml"),
])
def test_worker_refuses_a_broken_observability_setting_naming_it(settings, env, named):
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    proc = subprocess.run([sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url,
                           "--namespace", settings.namespace, "--sandbox", "none"],
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_tracing_cost_bench_smoke():
    """bench/tracing_cost.py runs both modes through the real hooks (no speed is asserted here)."""
    from bench import tracing_cost

    out = tracing_cost.measure(rounds=3)
    assert out["off"]["n"] == out["on"]["n"] == 3 and out["calls_per_round"] == 16
    assert observe_turn("after") is None  # the bench leaves tracing off again
