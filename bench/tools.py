"""Synthetic tools with known durations, served by the benchmark's toolfleet workers.

``noop`` does nothing (overhead and throughput); ``sleep_read`` / ``sleep_write`` wait a given
time and declare a read / write of the resource ``key:<label>`` (plan efficiency, cancel latency).
The raw Celery side (:mod:`bench.raw_celery`) runs the same bodies.
"""

from __future__ import annotations

from toolfleet import ToolContext, tool


def noop_body() -> str:
    """The no-op handler body, shared with the raw Celery task and the in-process floor."""
    return "ok"


@tool(access="read", resources=lambda a: [], timeout_s=30)
def noop() -> str:
    """Do nothing and return "ok"."""
    return noop_body()


@tool(access="read", resources=lambda a: [f"key:{a['label']}"], timeout_s=900)
def sleep_read(ctx: ToolContext, label: str, seconds: float) -> str:
    """Wait (cooperatively: a cancel ends the wait) then return; a read of key:<label>.

    Args:
        label: The resource key it reads.
        seconds: How long to wait.
    """
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"read {label}"


@tool(access="write", resources=lambda a: [f"key:{a['label']}"], timeout_s=900)
def sleep_write(ctx: ToolContext, label: str, seconds: float) -> str:
    """Wait (cooperatively) then return; a write of key:<label>.

    Args:
        label: The resource key it writes.
        seconds: How long to wait.
    """
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"wrote {label}"
