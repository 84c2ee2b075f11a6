"""The Celery app of a toolfleet worker (and of the dispatcher, which only sends with it).

One task, ``toolfleet.run_call``, runs one call; each message carries ``shadow="tool.<name>"`` so
Flower and the logs show the tool, and ``kwargsrepr`` shows turn id, call id and arguments.
JSON only (never pickle), task events on, one message reserved per process at a time so a
cancelled turn's queued calls are not held by a busy worker.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from ..models import CallEnvelope, ErrorCode, ToolResult
from ..policy.config import Policy
from ..settings import Settings
from ..tools.registry import Registry, default_registry
from .catalog import connect_catalog
from .execute import execute
from .runtime import Runtime

TASK_NAME = "toolfleet.run_call"


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings shared by workers and dispatchers."""
    return {
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_default_queue": f"{settings.namespace}.default",
        "worker_send_task_events": True,
        # no client-side task-sent events: they carry the real task name, not the shadow, and
        # when they reach Flower after the worker's events Flower shows "toolfleet.run_call"
        "task_send_sent_event": False,
        "worker_prefetch_multiplier": 1,
        "result_expires": settings.result_ttl_s,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"visibility_timeout": 2 * 3600},
        "worker_hijack_root_logger": False,
        "task_publish_retry": False,
    }


def create_app(settings: Settings, registry: Registry | None = None, policy: Policy | None = None) -> Celery:
    """A Celery app bound to ``settings``; ``registry`` (default: built-in tools) is what a worker
    started from this app serves, ``policy`` (default: permissive) what it checks before running a
    call. ``app.toolfleet`` is the :class:`Runtime`."""
    registry = registry if registry is not None else default_registry()
    runtime = Runtime(settings, registry, policy)
    app = Celery(f"toolfleet-{settings.namespace}", broker=settings.broker, backend=settings.redis_url)
    app.conf.update(celery_config(settings))
    app.toolfleet = runtime  # type: ignore[attr-defined]

    class CallRequest(Request):
        """Hooks of the worker's main process for the ends the task body never sees."""

        def on_timeout(self, soft: bool, timeout: float) -> None:
            super().on_timeout(soft, timeout)
            if not soft:
                _finalize(runtime, self.kwargs, ErrorCode.TIMEOUT,
                          f"the call ran past its hard time limit ({timeout:g} s) and its process was killed",
                          "ask for less work per call, or a longer time limit where the tool allows it")

        def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
            super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)
            if isinstance(exc, WorkerLostError):
                _finalize(runtime, self.kwargs, ErrorCode.WORKER_LOST,
                          f"the worker process running the call died ({exc})",
                          "the call may or may not have taken effect; check before repeating it")
            elif isinstance(exc, TimeLimitExceeded):
                pass  # reported by on_timeout
            elif type(exc).__name__ == "Terminated":
                _finalize(runtime, self.kwargs, ErrorCode.CANCELLED,
                          "the call was stopped when its turn was cancelled",
                          "the call may have done part of its work; check before repeating it")

    @app.task(name=TASK_NAME, bind=True, Request=CallRequest, acks_late=False)
    def run_call(self: Any, envelope: dict[str, Any]) -> dict[str, Any]:
        try:
            result = execute(runtime, envelope, worker=self.request.hostname or "worker")
        except SoftTimeLimitExceeded:
            # The soft limit landed outside the handler (while a result was being built or
            # recorded): the call still gets its one result; a recorded one is kept (first wins).
            _finalize(runtime, {"envelope": envelope}, ErrorCode.TIMEOUT,
                      "the call ran past its time limit and was stopped",
                      "ask for less work per call, or a longer time limit where the tool allows it")
            return {}
        return result.model_dump(mode="json", exclude_none=True)

    connect_catalog(app, runtime)
    return app


def _finalize(runtime: Runtime, kwargs: dict[str, Any], code: ErrorCode, message: str, hint: str) -> None:
    try:
        env = CallEnvelope.model_validate(kwargs.get("envelope", {}))
    except Exception:
        return
    runtime.ledger.record_result(env.turn_id, ToolResult.failure(env.call_id, env.name, code, message, hint))
