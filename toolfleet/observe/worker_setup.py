"""What ``toolfleet worker`` turns on for observing (issue 17): metrics on a port, the result log's
format, and traces when the standard ``OTEL_TRACES_EXPORTER`` names an exporter (set up in each
pool process after the fork: an exporter's threads and sockets do not survive one)."""

from __future__ import annotations

import logging
from typing import Any

from .metrics import enable_worker_metrics
from .results import configure_result_log
from .tracing import configure_tracing_from_env

log = logging.getLogger(__name__)


def setup_worker_observability(app: Any, runtime: Any, *, metrics_port: int | None = None,
                               metrics_addr: str = "0.0.0.0", result_log: str = "text",
                               result_log_file: str | None = None) -> None:
    """Call before ``worker_main``. Raises ValueError (a wrong ``result_log``) or
    :class:`~toolfleet.errors.ConfigurationError` (a missing package) before the worker starts."""
    from celery.signals import worker_process_init, worker_process_shutdown

    configure_result_log(result_log, result_log_file)
    if metrics_port is not None:
        enable_worker_metrics(app, runtime, metrics_port, metrics_addr)
    configure_tracing_from_env(_check_only=True)
    providers: list[Any] = []

    @worker_process_init.connect(weak=False)
    def _trace_here(**_: Any) -> None:
        try:
            provider = configure_tracing_from_env()
        except Exception as exc:  # noqa: BLE001 - checked before the fork; a pool process runs on untraced
            log.error("tracing not set up in this pool process: %s", exc)
            return
        if provider is not None:
            providers.append(provider)

    @worker_process_shutdown.connect(weak=False)
    def _flush(**_: Any) -> None:
        for provider in providers:
            provider.shutdown()  # exports what is still batched
