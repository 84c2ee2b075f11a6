"""Prometheus metrics of a fleet (issue 17; names and which side exposes what: docs/observability.md).

Worker node (one HTTP endpoint per ``toolfleet worker --metrics-port``; the prefork pool's processes
write their values with prometheus_client's multiprocess mode under ``PROMETHEUS_MULTIPROC_DIR``, a
fresh directory per worker node, and the main process serves their sum):

- ``toolfleet_worker_calls_total{tool,status,code}``: results this node recorded (``code`` empty for ok)
- ``toolfleet_call_queue_seconds{tool}``: wait from send to pick-up (histogram)
- ``toolfleet_call_run_seconds{tool}``: run time of calls whose handler ran (histogram)
- ``toolfleet_worker_calls_running{tool}``: calls running now
- ``toolfleet_worker_heartbeats_total{worker}``, ``toolfleet_worker_heartbeat_timestamp_seconds{worker}``:
  catalog heartbeats (what dispatchers judge liveness by)
- ``toolfleet_queue_depth{queue}``: messages waiting in each tool queue this node serves (Redis
  broker: read at scrape time, all priority levels)

Dispatcher process (:func:`enable_dispatcher_metrics` / :func:`serve_dispatcher_metrics`):

- ``toolfleet_calls_total{tool,status,code}``: every call's one final result (also the calls that
  never reached a worker: refused, invalid, cancelled before sending)
- ``toolfleet_calls_in_flight{tool}``: sent, no result yet (queued + running)
- ``toolfleet_turns_total{outcome}``, ``toolfleet_turn_seconds`` (histogram)

Nothing is recorded until enabled: each hook is one check of a module global.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

from ..errors import ConfigurationError

log = logging.getLogger(__name__)
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
NOT_RUN = {"UNKNOWN_TOOL", "INVALID_ARGUMENT", "PERMISSION_DENIED", "NOT_EXECUTED", "LOOP_DETECTED",
           "TOOL_UNAVAILABLE"}
_worker: WorkerMetrics | None = None
_dispatcher: DispatcherMetrics | None = None


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError("metrics need prometheus_client: pip install 'toolfleet[metrics]'") from exc
    return prometheus_client


def code_label(result: Any) -> str:
    return result.code.value if result.code is not None else ""


class WorkerMetrics:
    """The worker node's metrics (not registered in a registry: multiprocess mode collects them from files)."""

    def __init__(self) -> None:
        pc = _prometheus()
        self.calls = pc.Counter("toolfleet_worker_calls_total", "Results recorded by this worker node",
                                ["tool", "status", "code"], registry=None)
        self.queue_s = pc.Histogram("toolfleet_call_queue_seconds", "Wait from send to pick-up", ["tool"],
                                    buckets=SECONDS_BUCKETS, registry=None)
        self.run_s = pc.Histogram("toolfleet_call_run_seconds", "Run time of calls whose handler ran", ["tool"],
                                  buckets=SECONDS_BUCKETS, registry=None)
        self.running = pc.Gauge("toolfleet_worker_calls_running", "Calls running now", ["tool"],
                                multiprocess_mode="livesum", registry=None)
        self.heartbeats = pc.Counter("toolfleet_worker_heartbeats_total", "Catalog heartbeats published",
                                     ["worker"], registry=None)
        self.heartbeat_at = pc.Gauge("toolfleet_worker_heartbeat_timestamp_seconds",
                                     "Unix time of the latest catalog heartbeat", ["worker"],
                                     multiprocess_mode="max", registry=None)

    def result(self, result: Any) -> None:
        tool, code = result.name, code_label(result)
        self.calls.labels(tool, result.status, code).inc()
        if result.queued_ms is not None:
            self.queue_s.labels(tool).observe(result.queued_ms / 1000)
        if result.run_ms is not None and code not in NOT_RUN:
            self.run_s.labels(tool).observe(result.run_ms / 1000)


class DispatcherMetrics:
    def __init__(self, registry: Any) -> None:
        pc = _prometheus()
        self.calls = pc.Counter("toolfleet_calls_total", "Final results of calls, one per call",
                                ["tool", "status", "code"], registry=registry)
        self.in_flight = pc.Gauge("toolfleet_calls_in_flight", "Calls sent and without a result yet", ["tool"],
                                  registry=registry, multiprocess_mode="livesum")
        self.turns = pc.Counter("toolfleet_turns_total", "Turns ended", ["outcome"], registry=registry)
        self.turn_s = pc.Histogram("toolfleet_turn_seconds", "Turn duration, start to end", buckets=SECONDS_BUCKETS,
                                   registry=registry)


# ---- dispatcher ----
def dispatcher_metrics() -> DispatcherMetrics | None:
    return _dispatcher


def enable_dispatcher_metrics(registry: Any = None) -> DispatcherMetrics:
    """Record the dispatcher's metrics in ``registry`` (default: prometheus_client's global one,
    which an application may already serve). Idempotent. Raises :class:`ConfigurationError` without
    prometheus_client."""
    global _dispatcher
    if _dispatcher is None:
        _dispatcher = DispatcherMetrics(registry if registry is not None else _prometheus().REGISTRY)
    return _dispatcher


def disable_dispatcher_metrics() -> None:
    """Stop recording the dispatcher's metrics (turns opened later record none)."""
    global _dispatcher
    _dispatcher = None


def serve_dispatcher_metrics(port: int = 0, addr: str = "127.0.0.1", registry: Any = None) -> tuple[Any, int]:
    """Enable the dispatcher's metrics and serve ``registry`` on ``addr:port`` (``port=0``: a free
    one) at ``/metrics``, from a daemon thread. Returns ``(server, port)``; ``server.shutdown()`` stops it."""
    pc = _prometheus()
    registry = registry if registry is not None else pc.REGISTRY
    enable_dispatcher_metrics(registry)
    server, _thread = pc.start_http_server(port, addr=addr, registry=registry)
    return server, server.server_port


# ---- worker ----
def worker_metrics() -> WorkerMetrics | None:
    return _worker


def prepare_multiprocess_dir() -> str:
    """``PROMETHEUS_MULTIPROC_DIR`` for this worker node: the one given (emptied: prometheus_client's
    files of an earlier run would be summed in), or a fresh temporary directory. Must run before the
    pool forks and before prometheus_client makes its first metric."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.unlink(os.path.join(path, name))
    else:
        path = tempfile.mkdtemp(prefix="toolfleet-prom-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    import prometheus_client.values as values

    values.ValueClass = values.get_value_class()  # in case prometheus_client was imported before
    return path


def enable_worker_metrics(app: Any, runtime: Any, port: int, addr: str = "0.0.0.0") -> None:
    """Record the worker's metrics and serve them on ``addr:port`` once the worker is ready (main
    process; one endpoint per node). Call before the worker starts (the pool inherits the state)."""
    global _worker
    from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown

    made = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")  # a fresh directory of our own: removed at the end
    path = prepare_multiprocess_dir()
    _worker = WorkerMetrics()
    served: dict[str, Any] = {}

    @worker_ready.connect(weak=False)
    def _serve(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        pc = _prometheus()
        from prometheus_client import multiprocess

        registry = pc.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
        if runtime.settings.broker_is_redis:
            from .queue_depth import QueueDepthCollector

            registry.register(QueueDepthCollector(runtime))
        try:
            served["server"], _ = pc.start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            log.error("metrics: cannot serve on %s:%s (%s); the worker runs without its /metrics", addr, port, exc)

    # sent by the pool process on exit, and by the main process for one that died (killed at its hard
    # limit, lost, terminated: celery.concurrency.prefork.process_destructor): its "running" no longer counts
    @worker_process_shutdown.connect(weak=False)
    def _dead(pid: int | None = None, **_: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid(), path)

    @worker_shutdown.connect(weak=False)
    def _stop(**_: Any) -> None:
        if "server" in served:
            served["server"].shutdown()
        # only the directory made here: a given one (often under /tmp too) may hold other programs' files
        if made and not os.environ.get("TOOLFLEET_KEEP_METRICS_DIR"):
            shutil.rmtree(path, ignore_errors=True)


def _fresh_in_child() -> None:
    """A forked child (a pool process) gets its own worker metrics: new metric objects and a new
    prometheus_client value class, so neither the one lock of every multiprocess value nor a
    metric's labels lock is inherited. The main process's catalog heartbeat and steps thread
    (the result of a killed call) take those while the pool forks; one held then stayed held in
    the child, whose first call waited on it (counting itself running, before its claim) until
    its time limit (docs/guarantees.md, E15)."""
    global _worker
    if _worker is None:
        return
    try:
        import prometheus_client.values as values

        values.ValueClass = values.get_value_class()
        _worker = WorkerMetrics()
    except Exception:  # noqa: BLE001 - never fail a fork: the child runs on without metrics
        _worker = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)


def heartbeat(worker: str, at: float) -> None:
    """A catalog heartbeat was published (worker/catalog.py)."""
    if _worker is not None:
        _worker.heartbeats.labels(worker).inc()
        _worker.heartbeat_at.labels(worker).set(at)
